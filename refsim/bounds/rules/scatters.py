"""scatter-add, scatter-sub, scatter-mul, scatter-min, scatter-max: every result element combines
its operand element with the updates that land on it, in an order StableHLO leaves to the
implementation.

refsim's own scatter rules compute every array a bound needs, with the equation's own indices,
dimension numbers and mode: the centers, their magnitudes, the bounds and (scatter-add of ones)
how many updates land on each element. scatter-add / -sub is a sum of 1 + count terms in any
order (Higham, `reductions.sum_latitude`; exact where no order rounds); scatter-mul a product of
1 + count factors in any tree (`reductions.product_latitude`); scatter-min / -max one of the
combined elements, non-expansive: the largest bound among them (refsim's scatter-max rule on
the bounds). An undecidable index makes every result undecidable.
"""
from __future__ import annotations

import numpy as np

from refsim.bounds import values as V
from refsim.bounds.registry import register
from refsim.bounds.rules.reductions import lowest_bit_exponent, no_order_rounds, product_latitude, sum_latitude
from refsim.bounds.values import BVal, dtype_of
from refsim.interpreter.registry import RULES


def _runner(bctx, eqn, name):
    rule = RULES[name]
    ctx = bctx.rule_context()

    def run(operand, indices, updates):
        with V.quiet():
            return np.asarray(rule(ctx, np.array(operand, np.float64), indices, np.asarray(updates, np.float64),
                                   **eqn.params), np.float64)

    return run


def _dtype(eqn):
    return dtype_of(eqn.outvars[0])


def _finish(out: BVal, indices: BVal) -> BVal:
    if indices.bound is not None and np.isnan(indices.bound).any():
        out.bound = np.full(np.shape(out.center), np.nan)
    return out


def _nan_mask(add, op, idx, up):
    if op.bound is None and up.bound is None:
        return None
    m = add(np.isnan(op.full_bound()).astype(np.float64), idx,
            np.broadcast_to(np.isnan(up.full_bound()), np.shape(up.center)).astype(np.float64))
    return m > 0


@register("scatter-add", "scatter-sub")
def _scatter_add(bctx, eqn, ins):
    op, idx, up = ins
    dt = _dtype(eqn)
    name = eqn.primitive.name
    rule = RULES[name]
    if not V.is_float(dt):
        c = rule(bctx.rule_context(), np.array(op.center), idx.center, up.center, **eqn.params)
        b = None
        if op.bound is not None or up.bound is not None:
            b = _runner(bctx, eqn, "scatter-add")(op.full_bound(), idx.center,
                                                  np.broadcast_to(up.full_bound(), np.shape(up.center)))
        return [_finish(BVal(c, b, dt), idx)]
    add = _runner(bctx, eqn, "scatter-add")
    i = idx.center
    upc = np.broadcast_to(up.center, np.shape(up.center))
    c = _runner(bctx, eqn, name)(op.center, i, upc)
    ac = add(np.abs(op.center), i, np.abs(upc))
    n = 1.0 + add(np.zeros(np.shape(op.center)), i, np.ones(np.shape(upc)))
    prop = None
    if op.bound is not None or up.bound is not None:
        prop = add(op.full_bound(), i, np.broadcast_to(up.full_bound(), np.shape(upc)))
    with V.quiet():
        local = sum_latitude(n, ac if prop is None else ac + prop, ac, dt)
        if prop is None:
            qmin = _runner(bctx, eqn, "scatter-min")(lowest_bit_exponent(op.center), i, lowest_bit_exponent(upc))
            local = np.where(no_order_rounds(qmin, ac, dt), 0.0, local)
    out = _finish(BVal(c, local if prop is None else prop + local, dt), idx)
    if name == "scatter-add" and op.bound is None and not np.any(op.center):
        # into exact zeros (a gather's transpose): XLA may fold it into an addend (xla-scatter-add-folding)
        out.origin = "scatter-add"
        out.scatter_terms = (n - 1.0, ac if prop is None else ac + prop)
    return [out]


@register("scatter-mul")
def _scatter_mul(bctx, eqn, ins):
    op, idx, up = ins
    dt = _dtype(eqn)
    if not V.is_float(dt):
        c = RULES["scatter-mul"](bctx.rule_context(), np.array(op.center), idx.center, up.center, **eqn.params)
        nan = _nan_mask(_runner(bctx, eqn, "scatter-add"), op, idx.center, up)
        return [_finish(BVal(c, None if nan is None else np.where(nan, np.nan, 0.0), dt), idx)]
    mul, add = _runner(bctx, eqn, "scatter-mul"), _runner(bctx, eqn, "scatter-add")
    i = idx.center
    upc = np.broadcast_to(up.center, np.shape(up.center))
    with V.quiet():
        mo = np.abs(op.center) + op.full_bound()
        mu = np.abs(upc) + np.broadcast_to(up.bound_or_zero(), np.shape(upc))
        c = mul(op.center, i, upc)
        mag = mul(mo, i, mu)
        mag_one = mul(np.maximum(mo, 1.0), i, np.maximum(mu, 1.0))
        n = 1.0 + add(np.zeros(np.shape(op.center)), i, np.ones(np.shape(upc)))
        b = product_latitude(bctx, n, c, mag, mag_one, dt)
    nan = _nan_mask(add, op, i, up)
    if nan is not None:
        b = np.where(nan, np.nan, b)
    return [_finish(BVal(c, b, dt), idx)]


@register("scatter-min", "scatter-max")
def _scatter_extreme(bctx, eqn, ins):
    op, idx, up = ins
    dt = _dtype(eqn)
    c = RULES[eqn.primitive.name](bctx.rule_context(), np.array(op.center), idx.center, up.center, **eqn.params)
    b = None
    if op.bound is not None or up.bound is not None:
        b = _runner(bctx, eqn, "scatter-max")(op.full_bound(), idx.center,
                                              np.broadcast_to(up.full_bound(), np.shape(up.center)))
    return [_finish(BVal(c, b, dt, op.nonneg and up.nonneg), idx)]
