"""Reductions over local dims: reduce_*, argmax/argmin, cumulative ops, reduce_window.

Axes name local dims and are shifted past the mesh dims. Identities follow XLA
(reduce of an empty axis gives the identity: 0, 1, -inf / INT_MIN for max, +inf /
INT_MAX for min). Max/min use StableHLO's maximum/minimum (IEEE 754-2019: a quiet NaN
propagates, +0 > -0).
Integer sums and products wrap; narrow floats accumulate in float32 and round once.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from refsim.interpreter.registry import register
from refsim.interpreter.rules import _util as U
from refsim.interpreter.rules.elementwise import _max, _min
from refsim.values import quiet_nan


def _identity(kind: str, dtype):
    dtype = np.dtype(dtype)
    if kind in ("sum", "or", "xor"):
        return np.zeros((), dtype)
    if kind in ("prod", "and"):
        return np.ones((), dtype) if kind == "prod" or dtype == bool else np.array(-1).astype(dtype)
    big = kind == "min"
    if dtype == bool:
        return np.array(big)
    if U.is_int(dtype):
        info = U.iinfo(dtype)
        return np.array(info.max if big else info.min, dtype)
    return np.array(np.inf if big else -np.inf).astype(dtype)


def _tree_reduce(x, axes, fn):
    """Reduce `axes` by repeated halving with an XLA-semantics binary `fn` (O(log n) calls)."""
    for ax in sorted(axes, reverse=True):
        while x.shape[ax] > 1:
            n = x.shape[ax]
            half = n // 2
            a = np.take(x, np.arange(half), axis=ax)
            b = np.take(x, np.arange(half, 2 * half), axis=ax)
            rest = np.take(x, np.arange(2 * half, n), axis=ax)
            x = np.concatenate([fn(a, b), rest], axis=ax)
        x = np.squeeze(x, axis=ax)
    return x


def _reduce(kind, x, axes, nm):
    ax = U.shift(axes, nm)
    dtype = x.dtype
    if any(x.shape[a] == 0 for a in ax):
        shape = tuple(n for i, n in enumerate(x.shape) if i not in ax)
        return np.full(shape, _identity(kind, dtype), dtype=dtype)
    if not ax:
        return x
    cd = U.compute_dtype(dtype)
    xc = U.as_dtype(x, cd)
    with np.errstate(all="ignore"):
        if kind == "sum":
            out = np.sum(xc, axis=ax, dtype=cd) if dtype != bool else np.any(x, axis=ax)
        elif kind == "prod":
            out = np.prod(xc, axis=ax, dtype=cd) if dtype != bool else np.all(x, axis=ax)
        elif kind == "max":
            # quiet_nan: a reduce over one element still applies maximum to it and the init
            out = quiet_nan(_tree_reduce(xc, ax, _max)) if U.is_float(dtype) else np.max(xc, axis=ax)
        elif kind == "min":
            out = quiet_nan(_tree_reduce(xc, ax, _min)) if U.is_float(dtype) else np.min(xc, axis=ax)
        elif kind == "and":
            out = np.all(x, axis=ax) if dtype == bool else np.bitwise_and.reduce(x, axis=ax)
        elif kind == "or":
            out = np.any(x, axis=ax) if dtype == bool else np.bitwise_or.reduce(x, axis=ax)
        else:
            out = (np.logical_xor.reduce(x, axis=ax) if dtype == bool
                   else np.bitwise_xor.reduce(x, axis=ax))
    return U.as_dtype(np.asarray(out), dtype)


def _make_reduce(kind):
    def rule(ctx, x, *, axes, out_sharding=None):
        return _reduce(kind, x, axes, ctx.nm)

    rule.__name__ = rule.__qualname__ = f"reduce_{kind}_rule"
    rule.__doc__ = f"reduce_{kind} over the local `axes` (StableHLO reduce with the {kind} body)."
    return rule


for _kind in ("sum", "prod", "max", "min", "and", "or", "xor"):
    register(f"reduce_{_kind}")(_make_reduce(_kind))


def _arg(fn, x, axes, index_dtype, nm, name):
    if len(axes) != 1:
        raise ValueError(f"{name}: axes={axes} must name exactly one axis.")
    ax = nm + axes[0]
    if x.shape[ax] == 0:
        raise ValueError(f"{name}: cannot reduce the zero-size axis {axes[0]}.")
    return fn(U.as_dtype(x, U.compute_dtype(x.dtype)), axis=ax).astype(index_dtype)


@register("argmax")
def argmax_rule(ctx, x, *, axes, index_dtype):
    """First index of the maximum; a NaN counts as the maximum (first NaN wins), as lax.argmax."""
    return _arg(np.argmax, x, axes, index_dtype, ctx.nm, "argmax")


@register("argmin")
def argmin_rule(ctx, x, *, axes, index_dtype):
    """First index of the minimum; a NaN counts as the minimum (first NaN wins), as lax.argmin."""
    return _arg(np.argmin, x, axes, index_dtype, ctx.nm, "argmin")


def _scan(x, axis, fn):
    """Inclusive prefix scan with an associative binary `fn` in O(log n) NumPy calls."""
    n = x.shape[axis]
    step = 1
    while step < n:
        head = np.take(x, np.arange(step), axis=axis)
        tail = fn(np.take(x, np.arange(step, n), axis=axis), np.take(x, np.arange(n - step), axis=axis))
        x = np.concatenate([head, tail], axis=axis)
        step *= 2
    return x


def _make_cumulative(name):
    def rule(ctx, x, *, axis, reverse):
        ax = ctx.nm + axis
        dtype = x.dtype
        cd = U.compute_dtype(dtype)
        xc = U.as_dtype(x, cd)
        if reverse:
            xc = np.flip(xc, ax)
        with np.errstate(all="ignore"):
            if name == "cumsum":
                out = np.cumsum(xc, axis=ax, dtype=cd)
            elif name == "cumprod":
                out = np.cumprod(xc, axis=ax, dtype=cd)
            elif name == "cumlogsumexp":
                out = np.logaddexp.accumulate(xc, axis=ax)
            else:
                out = _scan(xc, ax, _max if name == "cummax" else _min)
        if reverse:
            out = np.flip(out, ax)
        return U.as_dtype(np.asarray(out), dtype)

    rule.__name__ = rule.__qualname__ = f"{name}_rule"
    rule.__doc__ = (f"lax.{name} along local `axis` (from the end when `reverse`); integer "
                    "results wrap.")
    return rule


for _name in ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"):
    register(_name)(_make_cumulative(_name))


# --- reduce_window ------------------------------------------------------------------------

def _windows(ctx, x, init, window_dimensions, window_strides, padding, base_dilation,
             window_dilation):
    """All windows of the local dims as trailing dims: mesh + out_shape + window_dimensions.

    Base dilation inserts `init` between elements, padding adds `init` (negative crops),
    window dilation spaces window taps (StableHLO reduce_window)."""
    nm = ctx.nm
    local = x.shape[nm:]
    full, place, crop = [], [], []
    for n, (lo, hi), bd in zip(local, padding, base_dilation):
        lo_p, hi_p = max(lo, 0), max(hi, 0)
        core = n + max(n - 1, 0) * (bd - 1)
        size = lo_p + core + hi_p
        full.append(size)
        place.append(slice(lo_p, lo_p + core, bd))
        crop.append(slice(-lo if lo < 0 else 0, size - (-hi if hi < 0 else 0)))
    padded = np.empty(x.shape[:nm] + tuple(full), dtype=x.dtype)
    padded[...] = init
    padded[(slice(None),) * nm + tuple(place)] = x
    padded = padded[(slice(None),) * nm + tuple(crop)]
    spans = tuple((w - 1) * d + 1 for w, d in zip(window_dimensions, window_dilation))
    win = sliding_window_view(padded, spans, axis=tuple(range(nm, padded.ndim)))
    sel = (slice(None),) * nm + tuple(slice(None, None, s) for s in window_strides) + tuple(
        slice(None, None, d) for d in window_dilation)
    return win[sel]


def _make_reduce_window(kind):
    def rule(ctx, x, *, window_dimensions, window_strides, padding, base_dilation,
             window_dilation):
        init = _identity(kind, x.dtype)
        w = _windows(ctx, x, init, window_dimensions, window_strides, padding, base_dilation,
                     window_dilation)
        r = len(window_dimensions)
        return _reduce(kind, w, tuple(range(w.ndim - ctx.nm - r, w.ndim - ctx.nm)), ctx.nm)

    rule.__name__ = rule.__qualname__ = f"reduce_window_{kind}_rule"
    rule.__doc__ = f"StableHLO reduce_window with the {kind} body and its identity as init."
    return rule


for _kind in ("sum", "max", "min"):
    register(f"reduce_window_{_kind}")(_make_reduce_window(_kind))
