"""Sharding ops: with_sharding_constraint (Auto), reshard (Explicit), unreduced and reduced values
(Explicit, where the installed JAX has `P(unreduced=...)` / `P(reduced=...)`: partial sums, their
arithmetic, reduced weights in a matmul) and partial-manual shard_map regions with a collective
inside."""
from __future__ import annotations

import functools
import math

from conformance.strategies._sharded_graph import F32, I32, Builder, Val, model_of, spec_text, sum_result
from conformance.strategies._sharded_ops.common import dot_model, fits, floating, numeric, result_model
from refsim import compat
from refsim.layouts.partition_spec import set_text


@functools.lru_cache(maxsize=None)
def has_unreduced() -> bool:
    """Whether the installed JAX has unreduced specs (``P(..., unreduced={...})``)."""
    import jax

    try:
        jax.sharding.PartitionSpec(unreduced={"x"})
    except TypeError:
        return False
    return True


def _wsc(b: Builder) -> bool:
    if b.explicit:
        return False
    a = b.pick(lambda v: not v.manual)
    if a is None:
        return False
    b.constrain(a, b.draw_spec(a.shape, dividing=False, allow_unconstrained=True))
    return True


def _reshard(b: Builder) -> bool:
    if not b.explicit:
        return False
    a = b.pick(lambda v: not v.manual)
    if a is None:
        return False
    b.reshard(a, b.draw_spec(a.shape, dividing=True))
    return True


def _unreduced_sum(b: Builder) -> bool:
    """``reduce_sum`` over sharded dimensions into an unreduced value (each device keeps its
    partial sum: `out_sharding=P(..., unreduced={axes})`), then a reshard that sums the partials
    (JAX's all-reduce). The unreduced value itself stays out of the pool: it is read only by the
    reshard, never by an op or the host (JAX refuses to read one)."""
    if not b.explicit or not has_unreduced():
        return False
    a = b.pick(lambda v: numeric(v) and v.ndim >= 1 and v.spec is not None and any(v.spec))
    if a is None:
        return False
    sharded = [d for d, ax in enumerate(a.spec) if ax]
    summed = sorted(set(b.draw_permutation_of(sharded)[:b.draw_int(1, len(sharded))])
                    | {d for d in range(a.ndim) if not a.spec[d] and b.draw_int(0, 3) == 0})
    axes = sorted({ax for d in summed for ax in a.spec[d]}, key=b.mesh.axis_names.index)
    rest = tuple(ax for d, ax in enumerate(a.spec) if d not in summed)
    shape = tuple(n for d, n in enumerate(a.shape) if d not in summed)
    n = 1
    for d in summed:
        n *= a.shape[d]
    text = spec_text(rest)[:-1]
    text += (", " if text != "P(" else "") + "unreduced={" + ", ".join(map(repr, axes)) + "})"
    u = b.emit("unreduced_sum", f"jax.lax.reduce_sum({a.name}, {tuple(summed)!r}, out_sharding={text})", shape,
               a.dtype, main=a, spec=rest, **sum_result(a, n))
    b.pool.remove(u)
    b.reshard(u, b.draw_spec(shape, dividing=True) if b.boolean() else rest)
    return True


def _partial_sum(a: Val, summed: list, axes: list) -> str:
    """Source of ``reduce_sum(a, summed)`` into a value unreduced over `axes` (`a`'s other dims kept)."""
    rest = tuple(ax for d, ax in enumerate(a.spec) if d not in summed)
    text = spec_text(rest)[:-1]
    text += (", " if text != "P(" else "") + "unreduced={" + ", ".join(map(repr, axes)) + "})"
    return f"jax.lax.reduce_sum({a.name}, {tuple(summed)!r}, out_sharding={text})"


def _reduced_spec(spec: tuple, axes) -> str:
    """``P(..., reduced={axes})`` source: `spec`'s dimension entries, reduced over `axes`."""
    text = spec_text(spec)[:-1]
    return text + (", " if text != "P(" else "") + "reduced={" + ", ".join(map(repr, axes)) + "})"


def _unreduced_add(b: Builder) -> bool:
    """Arithmetic on unreduced values: two partial sums over the same axes (`reduce_sum` into
    ``P(..., unreduced={axes})`` of `a` and of a value typed as `a`) added (or subtracted, where
    `refsim.compat.unreduced_subtracts`) while unreduced (each device combines its partials: the
    sum of all partials is the total, JAX's `add` / `sub` rules for unreduced operands), then
    resharded: summed into a plain layout, or into a *reduced* one
    (``P(..., reduced={axes})``: replicated, typed so its cotangent is unreduced) that takes
    ``2 * r + 1`` as a reduced value (where `refsim.compat.reduced_takes_constants`) before it is
    resharded to a plain layout. Unreduced and
    reduced values stay out of the pool: only these lines read them (JAX refuses most ops on them)."""
    if not b.explicit or not has_unreduced():
        return False
    a = b.pick(lambda v: numeric(v) and v.ndim >= 1 and v.spec is not None and any(v.spec))
    if a is None:
        return False
    c = b.pick(lambda v: v is not a and v.dtype == a.dtype and v.shape == a.shape and v.spec == a.spec
               and numeric(v)) or a
    sharded = [d for d, ax in enumerate(a.spec) if ax]
    summed = sorted(b.draw_permutation_of(sharded)[:b.draw_int(1, len(sharded))])
    axes = sorted({ax for d in summed for ax in a.spec[d]}, key=b.mesh.axis_names.index)
    rest = tuple(ax for d, ax in enumerate(a.spec) if d not in summed)
    shape = tuple(n for d, n in enumerate(a.shape) if d not in summed)
    n = math.prod(a.shape[d] for d in summed)
    sign = "-" if compat.unreduced_subtracts() and b.boolean() else "+"
    c_lo, c_hi = (-c.hi, -c.lo) if sign == "-" else (c.lo, c.hi)
    both = Val("both", (), a.dtype, min(a.lo, c_lo), max(a.hi, c_hi),
               None if a.frac is None or c.frac is None else max(a.frac, c.frac), max(a.err, c.err))
    model = sum_result(both, 2 * n)
    u = b.emit("unreduced_add", f"{_partial_sum(a, summed, axes)} {sign} {_partial_sum(c, summed, axes)}", shape,
               a.dtype, main=a, spec=rest, **model)
    b.pool.remove(u)
    if b.boolean():
        b.reshard(u, b.draw_spec(shape, dividing=True) if b.boolean() else rest)
        return True
    r = b.emit("unreduced_add", f"jax.sharding.reshard({u.name}, {_reduced_spec(rest, axes)})", shape, a.dtype,
               main=a, spec=rest, **model_of(u))
    b.pool.remove(r)
    if compat.reduced_takes_constants():   # (jax 0.9: the reduced value goes straight back to a plain layout)
        two, one = ("2.0", "1.0") if a.dtype == F32 else ("2", "1")
        frac = None if u.frac is None else max(u.frac - 1, 0)
        r = b.emit("unreduced_add", f"{r.name} * {two} + {one}", shape, a.dtype, main=a, spec=rest,
                   **result_model(a.dtype, 2 * u.lo + 1, 2 * u.hi + 1, frac, 2 * u.err))
        b.pool.remove(r)
    b.reshard(r, b.draw_spec(shape, dividing=True) if b.boolean() else rest)
    return True


def _reduced_dot(b: Builder) -> bool:
    """A reduced weight in a matmul (the FSDP / ZeRO parameter pattern): `o` resharded to
    ``P(None, ..., reduced={axes})`` (replicated, its cotangent unreduced over `axes`), optionally
    ``2 * w + 1`` as a reduced value (where `refsim.compat.reduced_takes_constants`), contracted
    with `a` split over `axes` along its dimension 0; the product is resharded to a drawn layout.
    Under grad / vjp the weight's cotangent is an unreduced value that the transpose of the reshard
    sums (JAX's reduced/unreduced duality)."""
    if not b.explicit or not has_unreduced():
        return False
    a = b.pick(lambda v: floating(v) and v.ndim >= 2)
    if a is None:
        return False
    k = a.shape[-1]
    o = b.pick(lambda v: floating(v) and v.ndim == 2 and k in v.shape)
    if o is None:
        if a.ndim != 2:
            return False
        o = a   # a @ a.T: the weight is the operand itself, contracted on its last dimension
    cdim = b.choice([d for d in range(2) if o.shape[d] == k]) if o is not a else 1
    sizes = [ax for ax in b.mesh.axis_names if b.mesh.axis_size(ax) > 1] or list(b.mesh.axis_names)
    axes = []
    for ax in b.draw_permutation_of(sizes)[:b.draw_int(1, len(sizes))]:   # axes whose product splits a's dim 0
        if a.shape[0] % b.axis_size(axes + [ax]) == 0:
            axes.append(ax)
    if not axes:
        return False
    axes = sorted(axes, key=b.mesh.axis_names.index)
    shape = a.shape[:-1] + (o.shape[1 - cdim],)
    if not fits(b, shape):
        return False
    split = (tuple(axes),) + ((),) * (a.ndim - 1)
    a_r = b.reshard(a, split) if a.spec != split else a
    w = b.emit("reduced_dot", f"jax.sharding.reshard({o.name}, {_reduced_spec(((),) * o.ndim, axes)})", o.shape,
               o.dtype, main=o, spec=((),) * o.ndim, **model_of(o))
    b.pool.remove(w)
    if compat.reduced_takes_constants() and b.boolean():
        frac = None if o.frac is None else max(o.frac - 1, 0)
        w = b.emit("reduced_dot", f"{w.name} * 2.0 + 1.0", o.shape, o.dtype, main=w, spec=((),) * o.ndim,
                   **result_model(F32, 2 * o.lo + 1, 2 * o.hi + 1, frac, 2 * o.err))
        b.pool.remove(w)
    dn = (((a.ndim - 1,), (cdim,)), ((), ()))
    y = b.emit("reduced_dot", f"jax.lax.dot_general({a_r.name}, {w.name}, {dn!r})", shape, F32, main=a,
               spec=(tuple(axes),) + ((),) * (len(shape) - 1), **dot_model(a, w, k))
    b.pool.remove(y)
    b.reshard(y, b.draw_spec(shape, dividing=True))
    return True


def _shard_map(coll: str):
    def op(b: Builder) -> bool:
        names = list(b.mesh.axis_names)
        axes = tuple(b.draw_permutation_of(names)[: b.draw_int(1, len(names))])
        if coll == "ppermute":
            axes = tuple(sorted(axes, key=names.index))
        n = b.axis_size(axes)
        ok = lambda v: (v.ndim >= 1 and not v.manual and v.dtype in (F32, I32) and v.fine  # noqa: E731
                        and any(s % n == 0 for s in v.shape))
        a = b.pick(ok)
        if a is None:
            return False
        d = b.choice([k for k, s in enumerate(a.shape) if s % n == 0])
        local = list(a.shape)
        local[d] //= n
        in_spec = tuple(axes if k == d else () for k in range(a.ndim))
        ax = axes[0] if len(axes) == 1 else axes
        out_spec = in_spec
        if coll == "psum":
            body, shape, m = f"jax.lax.psum(x, {ax!r})", tuple(local), sum_result(a, n)
            out_spec = ((),) * a.ndim
        elif coll == "pmax":
            body, shape, m = f"jax.lax.pmax(x, {ax!r})", tuple(local), model_of(a)
            out_spec = ((),) * a.ndim
        elif coll == "all_gather":
            # all_gather's result still varies over the axes (vma typing): every device's
            # gathered copy, side by side along dimension d
            shape = a.shape[:d] + (a.shape[d] * n,) + a.shape[d + 1:]
            if not fits(b, shape):
                return False
            body, m = f"jax.lax.all_gather(x, {ax!r}, axis={d}, tiled=True)", model_of(a)
        elif coll == "ppermute":
            shift = b.draw_int(1, max(n - 1, 1))
            perm = [(i, (i + shift) % n) for i in range(n)]
            body, shape, m = f"jax.lax.ppermute(x, {ax!r}, perm={perm!r})", a.shape, model_of(a)
        elif coll == "axis_index":
            body = f"x + jax.lax.axis_index({ax!r}).astype(x.dtype)"
            shape, m = a.shape, result_model(a.dtype, a.lo, a.hi + n - 1, a.frac, a.err)
        elif coll in ("psum_scatter", "all_to_all"):
            d2s = [k for k in range(a.ndim) if local[k] % n == 0]
            if not d2s:
                return False
            d2 = b.choice(d2s)
            out_spec = tuple(axes if k == d2 else () for k in range(a.ndim))
            if coll == "psum_scatter":
                body = f"jax.lax.psum_scatter(x, {ax!r}, scatter_dimension={d2}, tiled=True)"
                shape = list(local)
                shape = tuple(shape)
                m = sum_result(a, n)
            else:
                body = f"jax.lax.all_to_all(x, {ax!r}, {d2}, {d}, tiled=True)"
                shape = list(local)
                shape[d] *= n
                shape[d2] //= n
                shape[d2] *= n
                shape = tuple(shape)
                m = model_of(a)
        else:
            raise AssertionError(coll)
        main = a
        if b.explicit and a.spec != in_spec:
            a = b.reshard(a, in_spec)   # shard_map on Explicit axes takes inputs typed as its in_specs
        manual = set(axes) if b.boolean() or len(axes) < len(names) else None
        # sorted text, not a set's repr: a set of strings prints in PYTHONHASHSEED's order, and the
        # same seed must give the same source in every process (hunt --seed, the example database)
        kw = "" if manual is None else f", axis_names={set_text(manual)}"
        expr = (f"jax.shard_map(lambda x: {body}, in_specs={spec_text(in_spec)}, out_specs={spec_text(out_spec)}"
                f"{kw})({a.name})")
        v = b.emit(f"shard_map_{coll}", expr, shape, a.dtype, main=main, spec=None if b.explicit else (), **m)
        if b.explicit:
            # the result's type over the axes that stay Explicit is JAX's to infer: state one
            v.spec = None
            b.reshard(v, ((),) * len(shape))
            b.pool.remove(v)
        else:
            v.spec = None
        return True
    return op


#: This family's ops, by the name programs and the coverage table use.
OPS = {
    "with_sharding_constraint": _wsc, "reshard": _reshard,
    **{f"shard_map_{c}": _shard_map(c) for c in ("psum", "pmax", "all_gather", "ppermute", "axis_index",
                                                  "psum_scatter", "all_to_all")},
    "unreduced_sum": _unreduced_sum,
    "unreduced_add": _unreduced_add,
    "reduced_dot": _reduced_dot,
}
