"""Calls and control flow: `jit`, `closed_call`, `core_call`, `remat`, custom derivatives,
`cond`, `while`, `scan`.

Sub-jaxprs run with the caller's Context, so collectives and `axis_index` inside a
loop body or a branch see the same mesh dims as outside. Inside a manual region a
branch index or loop predicate may differ per device; then every branch some
device takes is evaluated for all devices and each device keeps its own branch's
result, and a `while` keeps iterating until no device's predicate holds, each
device freezing its carry once its own predicate is false (the per-device
semantics of `lax.cond`/`lax.while_loop`, as their `vmap` rules state them).
Collectives inside such a divergent branch see every device's operand, which real
SPMD hardware does not define; programs that JAX accepts with `check_vma=True`
never diverge there.
"""
from __future__ import annotations

import numpy as np

from refsim import compat
from refsim.interpreter import core
from refsim.interpreter.registry import register
from refsim.interpreter.unreduced import Partials


def run_jaxpr(ctx, jaxpr, args):
    """Evaluate a Jaxpr or ClosedJaxpr with `args` in the caller's Context."""
    if hasattr(jaxpr, "consts") and hasattr(jaxpr, "jaxpr"):
        return core.eval_closed_jaxpr(jaxpr, *args, ctx=ctx)
    return core.eval_jaxpr(jaxpr, (), *args, ctx=ctx)


def _mesh_select(nm, mask, on_true, on_false):
    """`np.where` with `mask` holding one entry per device (mesh dims), possibly followed by
    leading local batch dims (a vmapped `while`'s predicate): broadcast over the rest."""
    m = mask.reshape(mask.shape + (1,) * (max(on_true.ndim, on_false.ndim) - mask.ndim))
    return np.where(m, on_true, on_false)


# --- calls ---------------------------------------------------------------------------------

@register("jit")
def _jit(ctx, *args, jaxpr, **params):
    """`jax.jit` inside a program: the value is the callee's (shardings only place data)."""
    return run_jaxpr(ctx, jaxpr, args)


@register("closed_call", "call", "eval_jaxpr", "remat2")
def _call(ctx, *args, call_jaxpr=None, jaxpr=None, **params):
    """Plain calls (`closed_call`; `core.call` binds "call" in jax 0.10 and "eval_jaxpr" in 0.12)
    and `jax.checkpoint` ("remat2": remat only changes what autodiff saves)."""
    return run_jaxpr(ctx, call_jaxpr if call_jaxpr is not None else jaxpr, args)


@register("custom_jvp_call", "custom_jvp_call_jaxpr")
def _custom_jvp_call(ctx, *args, call_jaxpr=None, fun_jaxpr=None, **params):
    """`jax.custom_jvp` primal evaluation: the custom rule only matters for differentiation."""
    return run_jaxpr(ctx, call_jaxpr if call_jaxpr is not None else fun_jaxpr, args)


@register("custom_vjp_call")
def _custom_vjp_call(ctx, *args, call_jaxpr=None, fun_jaxpr=None, **params):
    """`jax.custom_vjp` primal evaluation (JAX traces the bwd rule into the jaxpr when differentiating)."""
    return run_jaxpr(ctx, call_jaxpr if call_jaxpr is not None else fun_jaxpr, args)


@register("custom_linear_solve")
def _custom_linear_solve(ctx, *args, const_lengths, jaxprs, **params):
    """`lax.custom_linear_solve`: the value is ``solve(matvec, b)`` (its impl rule)."""
    n = [const_lengths.matvec, const_lengths.vecmat, const_lengths.solve, const_lengths.transpose_solve]
    start = n[0] + n[1]
    solve_consts = args[start:start + n[2]]
    b = args[sum(n):]
    return run_jaxpr(ctx, jaxprs.solve, [*solve_consts, *b])


@register("linear_call")
def _linear_call(ctx, *args, callee, num_callee_consts, **params):
    """`jax.custom_derivatives.linear_call`: the value is the callee's; consts of transpose are skipped."""
    num_transpose_consts = params.get("num_transpose_consts", 0)
    callee_args = args[:num_callee_consts] + args[num_callee_consts + num_transpose_consts:]
    return run_jaxpr(ctx, callee, callee_args)


@register("name")
def _name(ctx, x, *, name):
    """`jax.ad_checkpoint.checkpoint_name`: the identity on values."""
    return x


@register("platform_index")
def _platform_index(ctx, *args, platforms, **params):
    """`lax.platform_dependent`'s branch index: refsim runs the "cpu" branch (else the default)."""
    default = None
    for i, ps in enumerate(platforms):
        if ps is None:
            default = i
        elif "cpu" in ps:
            return core.lift(np.int32(i), ctx.nm)
    if default is None:
        raise ValueError(
            f"platform_dependent has no branch for 'cpu' and no default (platforms={platforms!r}); "
            "add a cpu= or default= branch."
        )
    return core.lift(np.int32(default), ctx.nm)


# --- cond ------------------------------------------------------------------------------------

@register("cond")
def _cond(ctx, index, *operands, branches, **params):
    """`lax.cond`/`lax.switch`: run `branches[index]` (index clamped as XLA's Conditional does)."""
    idx = np.clip(np.asarray(index).astype(np.int64), 0, len(branches) - 1)
    taken = np.unique(idx)
    if taken.size == 1:
        return run_jaxpr(ctx, branches[int(taken[0])], operands)
    outs = None
    for b in taken.tolist():
        res = run_jaxpr(ctx, branches[b], operands)
        if outs is None:
            outs = res
        else:
            mask = idx == b
            outs = [_mesh_select(ctx.nm, mask, r, o) for r, o in zip(res, outs)]
    return outs


# --- while -----------------------------------------------------------------------------------

@register("while")
def _while(ctx, *args, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts, **params):
    """`lax.while_loop`: iterate the body while the predicate holds, per device.

    A batched predicate (`vmap` of a while_loop: shape = the carries' leading batch dims)
    is lowered by JAX as "loop while any element holds; each element whose predicate is
    false keeps its carry" (`_while_lowering`'s `_pred_bcast_select_hlo`); refsim does the
    same, per device and per batch element."""
    cconsts = args[:cond_nconsts]
    bconsts = args[cond_nconsts:cond_nconsts + body_nconsts]
    carry = list(args[cond_nconsts + body_nconsts:])
    while True:
        (pred,) = run_jaxpr(ctx, cond_jaxpr, [*cconsts, *carry])
        pred = np.asarray(pred)
        if not pred.any():
            return carry
        new = run_jaxpr(ctx, body_jaxpr, [*bconsts, *carry])
        if pred.all():
            carry = new
        else:
            carry = [_mesh_select(ctx.nm, pred, n, c) for n, c in zip(new, carry)]


# --- scan -------------------------------------------------------------------------------------

def _step(x, nm, i):
    """Step `i` of a scanned operand (local axis 0); unreduced xs keep their partial sums."""
    if isinstance(x, Partials):
        return Partials(x.parts[(slice(None),) * x.mesh.ndim + (i,)], x.mesh, x.axes, x.kind)
    return x[(slice(None),) * nm + (i,)]


@register("scan")
def _scan(ctx, *args, jaxpr, length, reverse, **params):
    """`lax.scan`: carry through `length` steps, slicing xs and stacking ys along local axis 0."""
    nm = ctx.nm
    consts, carry, xs = compat.scan_split_args(params | {"jaxpr": jaxpr}, args)
    n_carry = len(carry)
    ys_steps: list[list[np.ndarray]] = []
    steps = range(length - 1, -1, -1) if reverse else range(length)
    for i in steps:
        x_i = [_step(x, nm, i) for x in xs]
        out = run_jaxpr(ctx, jaxpr, [*consts, *carry, *x_i])
        carry, ys = list(out[:n_carry]), out[n_carry:]
        ys_steps.append(ys)
    if reverse:
        ys_steps.reverse()
    n_ys = len(jaxpr.out_avals) - n_carry
    ys_out = []
    for j in range(n_ys):
        if ys_steps and isinstance(ys_steps[0][j], Partials):  # unreduced ys: stack the partial sums
            first = ys_steps[0][j]
            stacked = np.stack([s[j].parts for s in ys_steps], axis=first.mesh.ndim)
            ys_out.append(Partials(stacked, first.mesh, first.axes, first.kind))
            continue
        parts = [np.asarray(s[j]) for s in ys_steps]
        if not parts:
            aval = jaxpr.out_avals[n_carry + j]
            ys_out.append(np.zeros((1,) * nm + (0,) + tuple(aval.shape), dtype=aval.dtype))
            continue
        m = np.broadcast_shapes(*(p.shape[:nm] for p in parts)) if nm else ()
        parts = [np.broadcast_to(p, m + p.shape[nm:]) for p in parts]
        ys_out.append(np.stack(parts, axis=nm))
    return [*carry, *ys_out]


@register("optimization_barrier")
def _optimization_barrier(ctx, *xs):
    """`lax.optimization_barrier`: the identity on every operand (it only orders XLA's scheduling)."""
    return list(xs)
