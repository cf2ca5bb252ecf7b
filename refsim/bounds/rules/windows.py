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
from refsim.bounds.rules._common import ERR
from refsim.bounds.rules.reductions import lowest_bit_exponent, no_order_rounds, sum_latitude
from refsim.bounds.values import BVal
from refsim.interpreter.registry import RULES


def _dtype(eqn):
    from refsim.bounds.walk import dtype_of

    return dtype_of(eqn.outvars[0])


def _runner(bctx, eqn, name=None):
    rule = RULES[name or eqn.primitive.name]
    ctx = bctx.rule_context()

    def run(a):
        with np.errstate(**ERR):
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
    with np.errstate(**ERR):
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
