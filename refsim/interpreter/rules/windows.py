"""Reductions with a user computation (`reduce`, `reduce_window`) and `select_and_scatter_add`.

`lax.reduce` / `lax.reduce_window` with a body other than add / max / min bind the generic
primitives with the body as a jaxpr of scalars. refsim evaluates that body with its own
rules on whole arrays at once (every element is one "device" of an elementwise program:
the body's scalar avals see an all-batch context), folding the reduced elements in
ascending index order. StableHLO leaves the order of a reduction unspecified; for
associative bodies on exact data every order agrees.

`select_and_scatter_add` (the gradient of max / min pooling) follows StableHLO
select_and_scatter: in each window the selected element is the first one the `select`
comparison keeps (ge: the first maximum, le: the first minimum), and the window's source
value is added there; padding holds the select identity (-inf for ge, +inf for le), as
JAX's CPU lowering pads the operand before the op.
"""
from __future__ import annotations

import numpy as np

from refsim.interpreter import core
from refsim.interpreter.registry import Context, register
from refsim.interpreter.rules import _util as U
from refsim.interpreter.rules.reductions import _windows


def _fold(ctx, jaxpr, consts, accs: list, xs: list) -> list:
    """One application of the reduction body to arrays of any shape (elementwise)."""
    nd = max(a.ndim for a in accs + xs)
    inner = Context(nm=nd, mesh=None, extra=ctx.extra)
    lift = lambda v: np.asarray(v).reshape((1,) * (nd - np.ndim(v)) + np.shape(v))  # noqa: E731
    return core.eval_jaxpr(jaxpr, [lift(c) for c in consts], *[lift(a) for a in accs + xs], ctx=inner)


@register("reduce_window")
def reduce_window_rule(ctx, *args, jaxpr, consts, window_dimensions, window_strides, padding,
                       base_dilation, window_dilation):
    """StableHLO reduce_window with a user body: operands then init values, one result each."""
    n = len(args) // 2
    operands, inits = args[:n], args[n:]
    wins = [_windows(ctx, np.asarray(x), np.asarray(i).reshape(np.shape(i)[ctx.nm:]) if np.ndim(i) > ctx.nm
                     else np.asarray(i).reshape(()), window_dimensions, window_strides, padding,
                     base_dilation, window_dilation) for x, i in zip(operands, inits)]
    r = len(window_dimensions)
    flat = [w.reshape(w.shape[: w.ndim - r] + (-1,)) for w in wins]
    out_shape = flat[0].shape[:-1]
    accs = [np.broadcast_to(np.asarray(i).reshape(np.shape(i)[: ctx.nm] + (1,) * (len(out_shape) - ctx.nm))
                            if ctx.nm else np.asarray(i), out_shape) for i in inits]
    for t in range(flat[0].shape[-1]):
        accs = _fold(ctx, jaxpr, consts, accs, [f[..., t] for f in flat])
    return [U.as_dtype(np.asarray(a), x.dtype) for a, x in zip(accs, operands)]


@register("reduce")
def reduce_rule(ctx, *args, computation=None, jaxpr, dimensions):
    """`lax.reduce` with a user body: fold the reduced local dims of every operand together."""
    n = len(args) // 2
    operands, inits = [np.asarray(a) for a in args[:n]], args[n:]
    operands = U.bcast_mesh(ctx.nm, *operands)
    axes = U.shift(dimensions, ctx.nm)
    keep = [k for k in range(operands[0].ndim) if k not in axes]
    moved = [np.transpose(x, keep + list(axes)) for x in operands]
    out_shape = moved[0].shape[: len(keep)]
    flat = [m.reshape(out_shape + (-1,)) for m in moved]
    accs = [np.broadcast_to(np.asarray(i).reshape(np.shape(i) + (1,) * (len(out_shape) - np.ndim(i))), out_shape)
            for i in inits]
    body, consts = getattr(jaxpr, "jaxpr", jaxpr), getattr(jaxpr, "consts", ())
    for t in range(flat[0].shape[-1]):
        accs = _fold(ctx, body, consts, accs, [f[..., t] for f in flat])
    return [U.as_dtype(np.asarray(a), x.dtype) for a, x in zip(accs, operands)]


def _select_identity(kind: str, dtype):
    if U.is_float(dtype):
        return np.array(-np.inf if kind == "ge" else np.inf).astype(dtype)
    info = np.iinfo(dtype) if dtype != bool else None
    if info is None:
        return np.array(kind != "ge", dtype)
    return np.array(info.min if kind == "ge" else info.max, dtype)


@register("select_and_scatter_add")
def select_and_scatter_add_rule(ctx, source, operand, *, select_prim, window_dimensions,
                                window_strides, padding):
    """Add each window's `source` value at the element `select_prim` picks in `operand`'s window."""
    nm = ctx.nm
    kind = getattr(select_prim, "name", str(select_prim))
    if kind not in ("ge", "le"):
        raise ValueError(f"select_and_scatter_add: select_prim {kind!r} must be ge or le (what "
                         "jax.lax's max / min pooling gradients bind).")
    keep = np.greater_equal if kind == "ge" else np.less_equal
    source, operand = U.bcast_mesh(nm, np.asarray(source), np.asarray(operand))
    ones = (1,) * len(window_dimensions)
    wins = _windows(ctx, operand, _select_identity(kind, operand.dtype), window_dimensions,
                    window_strides, padding, ones, ones)
    r = len(window_dimensions)
    flat = wins.reshape(wins.shape[: wins.ndim - r] + (-1,))
    best, best_t = flat[..., 0], np.zeros(flat.shape[:-1], np.int64)
    with np.errstate(invalid="ignore"):
        for t in range(1, flat.shape[-1]):
            cand = flat[..., t]
            stay = keep(best, cand)
            best = np.where(stay, best, cand)
            best_t = np.where(stay, best_t, t)
    # padded-operand coordinates of each selected element
    offs = np.unravel_index(best_t, tuple(window_dimensions))
    out_sizes = flat.shape[nm:-1]
    padded = tuple(n + max(lo, 0) + max(hi, 0) for n, (lo, hi) in zip(operand.shape[nm:], padding))
    mesh = flat.shape[:nm]
    grids = np.indices(flat.shape[:-1], sparse=True)
    coords = [grids[nm + d] * window_strides[d] + offs[d] for d in range(r)]
    out = np.zeros(mesh + padded, U.compute_dtype(source.dtype))
    src = U.as_dtype(np.broadcast_to(source, mesh + out_sizes), out.dtype)
    np.add.at(out, tuple(grids[:nm]) + tuple(coords), src)
    crop = tuple(slice(max(lo, 0), max(lo, 0) + n) for n, (lo, hi) in zip(operand.shape[nm:], padding))
    return U.as_dtype(out[(slice(None),) * nm + crop], source.dtype)


@register("select_and_gather_add")
def select_and_gather_add_rule(ctx, tangents, operand, *, select_prim, window_dimensions, window_strides,
                               padding, base_dilation, window_dilation):
    """The JVP of max / min pooling: in each window, the tangent at the element `select_prim`
    picks in `operand` (first maximum for ge, first minimum for le)."""
    nm = ctx.nm
    kind = getattr(select_prim, "name", str(select_prim))
    keep = np.greater_equal if kind == "ge" else np.less_equal
    tangents, operand = U.bcast_mesh(nm, np.asarray(tangents), np.asarray(operand))
    args = (window_dimensions, window_strides, padding, base_dilation, window_dilation)
    r = len(window_dimensions)
    w_op = _windows(ctx, operand, _select_identity(kind, operand.dtype), *args)
    w_t = _windows(ctx, tangents, np.zeros((), tangents.dtype), *args)
    f_op = w_op.reshape(w_op.shape[: w_op.ndim - r] + (-1,))
    f_t = w_t.reshape(w_t.shape[: w_t.ndim - r] + (-1,))
    best, out = f_op[..., 0], f_t[..., 0]
    with np.errstate(invalid="ignore"):
        for t in range(1, f_op.shape[-1]):
            stay = keep(best, f_op[..., t])
            best = np.where(stay, best, f_op[..., t])
            out = np.where(stay, out, f_t[..., t])
    return np.asarray(out, tangents.dtype)
