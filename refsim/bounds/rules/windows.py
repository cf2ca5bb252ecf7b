"""reduce_window_sum, reduce_window_max, reduce_window_min (StableHLO reduce_window with an add,
max or min body and its identity as the padding value).

A window sum is a sum of the window's elements in any order and tree: Higham's bound
(`reductions.sum_latitude`) with n the window's operand elements (padding adds exact zeros,
which round nothing). refsim's own rule computes each array the bound needs on the centers,
their magnitudes, the bounds and an array of ones. A window max or min is one of the window's
elements: exact and non-expansive, its bound the largest bound in the window (refsim's
reduce_window_max rule on the bounds, for both).
"""
from __future__ import annotations

import numpy as np

from refsim.bounds import values as V
from refsim.bounds.registry import register
from refsim.bounds.rules.reductions import lowest_bit_exponent, no_order_rounds, sum_latitude
from refsim.bounds.values import BVal, dtype_of
from refsim.interpreter.registry import RULES


def _dtype(eqn):
    return dtype_of(eqn.outvars[0])


def _runner(bctx, eqn, name=None):
    rule = RULES[name or eqn.primitive.name]
    ctx = bctx.rule_context()

    def run(a):
        with V.quiet():
            return np.asarray(rule(ctx, np.ascontiguousarray(a, np.float64), **eqn.params), np.float64)

    return run


@register("reduce_window_sum")
def _window_sum(bctx, eqn, ins):
    (x,) = ins
    dt = _dtype(eqn)
    run = _runner(bctx, eqn)
    if not V.is_float(dt):
        c = RULES["reduce_window_sum"](bctx.rule_context(), x.center, **eqn.params)
        b = None if x.bound is None else run(x.full_bound())
        return [BVal(c, b, dt)]
    c = run(x.center)
    ac = run(np.abs(x.center))
    n = run(np.ones(np.shape(x.center)))
    prop = None if x.bound is None else run(x.full_bound())
    with V.quiet():
        local = sum_latitude(n, ac if prop is None else ac + prop, ac, dt)
        if prop is None:
            # exact terms no order can round: the window's lowest set bit, as a window min
            q = lowest_bit_exponent(x.center)
            qmin = -_runner(bctx, eqn, "reduce_window_max")(np.where(np.isinf(q), -1e300, -q))
            qmin = np.where(qmin >= 1e300, np.inf, qmin)
            local = np.where(no_order_rounds(qmin, ac, dt), 0.0, local)
    return [BVal(c, local if prop is None else prop + local, dt, x.nonneg)]


@register("reduce_window_max", "reduce_window_min")
def _window_extreme(bctx, eqn, ins):
    (x,) = ins
    dt = _dtype(eqn)
    c = RULES[eqn.primitive.name](bctx.rule_context(), x.center, **eqn.params)
    if x.bound is None:
        return [BVal(c, None, dt, x.nonneg)]
    b = _runner(bctx, eqn, "reduce_window_max")(x.full_bound())
    return [BVal(c, np.maximum(b, 0.0), dt, x.nonneg)]   # an all-padding window: its init, exact


def _padded(a, nm, padding, fill):
    if any(lo < 0 or hi < 0 for lo, hi in padding):
        return None
    return np.pad(a, [(0, 0)] * nm + [tuple(p) for p in padding], constant_values=fill)


@register("select_and_scatter_add")
def _select_and_scatter_add(bctx, eqn, ins):
    """The gradient of max / min pooling: each window's `source` value is added at the element
    `select_prim` (ge: the maximum, le: the minimum) picks in `operand`'s window. A window's pick
    is decided where one element's allowed set clears every other's (an exact tie between two
    positions is not: StableHLO leaves the order of the selections to the implementation); every
    element a window with an undecided pick could reach is undecidable. The rest is a sum of the
    source values that land on an element, in any order (`reductions.sum_latitude`)."""
    src, op = ins
    p = eqn.params
    nm = bctx.nm
    dt = _dtype(eqn)
    rule = RULES["select_and_scatter_add"]
    ctx = bctx.rule_context()

    def run(s):
        with V.quiet():
            return np.asarray(rule(ctx, np.asarray(s, np.float64), np.asarray(op.center, np.float64), **p), np.float64)

    c = rule(ctx, src.center, op.center, **p)
    shape = np.broadcast_shapes(np.shape(c), np.shape(op.center))
    sgn = 1.0 if getattr(p["select_prim"], "name", str(p["select_prim"])) == "ge" else -1.0
    wd, ws = tuple(p["window_dimensions"]), tuple(p["window_strides"])
    v = _padded(np.broadcast_to(sgn * np.asarray(op.center, np.float64), shape), nm, p["padding"], -np.inf)
    b = _padded(np.broadcast_to(op.full_bound(), shape), nm, p["padding"], 0.0)
    if v is None or not V.is_float(dt):
        exact = src.bound is None and op.bound is None and v is not None
        return [BVal(c, None if exact else np.full(np.shape(c), np.nan), dt)]
    axes = tuple(range(nm, v.ndim))
    sel = (slice(None),) * nm + tuple(slice(None, None, s) for s in ws)
    with V.quiet():
        wv = np.lib.stride_tricks.sliding_window_view(v, wd, axis=axes)[sel]
        wb = np.lib.stride_tricks.sliding_window_view(b, wd, axis=axes)[sel]
        wv = wv.reshape(wv.shape[:v.ndim] + (-1,))
        wb = wb.reshape(wb.shape[:v.ndim] + (-1,))
        lower = np.max(wv - wb, axis=-1, keepdims=True)
        count = np.sum(wv + wb >= lower, axis=-1)
        und_w = (count > 1) | np.any(np.isnan(wb), axis=-1) | np.any(np.isnan(wv) & (wb == 0), axis=-1)
        n = run(np.ones(np.shape(src.center)))
        ac = run(np.abs(src.center))
        prop = None if src.bound is None else run(np.broadcast_to(src.full_bound(), np.shape(src.center)))
        local = sum_latitude(n, ac if prop is None else ac + prop, ac, dt)
        if prop is None:
            local = np.where(n <= 1, 0.0, local)        # an exact source placed alone: itself
        bound = local if prop is None else prop + local
    if und_w.any():
        # the footprint of every undecided window: any of its elements may receive the value
        reach = np.zeros(v.shape, bool)
        m = np.broadcast_to(und_w, wv.shape[:-1])
        for off in np.ndindex(*wd):
            idx = (slice(None),) * nm + tuple(slice(o, o + s * (k - 1) + 1, s)
                                              for o, s, k in zip(off, ws, m.shape[nm:]))
            reach[idx] |= m
        crop = (slice(None),) * nm + tuple(slice(lo, lo + n_) for (lo, _), n_ in zip(p["padding"], shape[nm:]))
        bound = np.where(reach[crop], np.nan, np.broadcast_to(bound, shape))
    return [BVal(c, bound, dt)]
