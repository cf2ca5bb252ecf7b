"""Collectives inside a manual region: sums within Higham's bound for any schedule of the
all-reduce (docs/comparison.md, SumBound), max / min non-expansive, data movement exact.

refsim's own collective rule (`refsim.interpreter.registry.RULES`) computes each array the
bound needs: the centers' sum, the bounds' sum, the magnitudes' sum and, from an array of
ones, each element's group size n.
"""
from __future__ import annotations

import numpy as np

from refsim.bounds import values as V
from refsim.bounds.registry import register
from refsim.bounds.rules._common import move
from refsim.bounds.rules.reductions import lowest_bit_exponent, no_order_rounds, sum_latitude
from refsim.bounds.values import BVal, dtype_of
from refsim.interpreter.registry import RULES


def _runner(bctx, eqn):
    rule = RULES[eqn.primitive.name]
    ctx = bctx.rule_context()

    def run(arrays):
        out = rule(ctx, *arrays, **eqn.params)
        return list(out) if eqn.primitive.multiple_results else [out]

    return run


def _dtypes(eqn):
    return [dtype_of(v) for v in eqn.outvars]


@register("psum", "psum_invariant", "reduce_scatter")
def _psum(bctx, eqn, ins):
    run = _runner(bctx, eqn)
    centers = run([x.center for x in ins])
    ns = _group_sizes(bctx, eqn, run, ins)
    props = run([x.full_bound() for x in ins]) if any(x.bound is not None for x in ins) else [None] * len(ins)
    abs_c = run([np.abs(x.center) if V.is_float(x.dtype) else np.zeros(np.shape(x.center)) for x in ins])
    outs = []
    for x, c, n, prop, ac, dt in zip(ins, centers, ns, props, abs_c, _dtypes(eqn)):
        if not V.is_float(dt):
            outs.append(BVal(c, prop, dt))
            continue
        with V.quiet():
            local = sum_latitude(n, ac if prop is None else ac + prop, ac, dt)
            if prop is None and eqn.primitive.name in ("psum", "psum_invariant"):
                q = _runner_named(bctx, eqn, "pmin")([lowest_bit_exponent(x.center)])[0]
                exact = no_order_rounds(q, ac, dt)
                local = np.where(exact, 0.0, local)
        dom = np.full(np.shape(c), bctx.op_id(eqn), np.int32) if bctx.explain else None
        outs.append(BVal(c, local if prop is None else prop + local, dt, x.nonneg, dom))
    return outs


def _group_sizes(bctx, eqn, run, ins) -> list:
    """Per operand, each element's group size (the collective of ones): once per equation, mesh
    and operand shapes in a walk (a scan's body meets the same psum at every step; the array is
    only read)."""
    shapes = tuple(np.shape(x.center) for x in ins)
    key = ("group sizes", id(eqn), shapes, bctx.nm)
    hit = bctx.labels.get(key)
    if hit is None or hit[0] is not eqn or hit[1] is not bctx.mesh:
        hit = bctx.labels[key] = (eqn, bctx.mesh, run([np.ones(s) for s in shapes]))
    return hit[2]


@register("pmax", "pmin")
def _pmax(bctx, eqn, ins):
    run = _runner(bctx, eqn)
    centers = run([x.center for x in ins])
    bounds = [None] * len(ins)
    if any(x.bound is not None for x in ins):
        bounds = _runner_named(bctx, eqn, "pmax")([x.full_bound() for x in ins])
    return [BVal(c, b, dt, x.nonneg) for x, c, b, dt in zip(ins, centers, bounds, _dtypes(eqn))]


def _runner_named(bctx, eqn, name):
    """pmax / pmin over the groups of `eqn` (a psum's or psum_invariant's params)."""
    rule = RULES[name]
    ctx = bctx.rule_context()
    params = {"axes": eqn.params["axes"], "axis_index_groups": eqn.params.get("axis_index_groups")}

    def run(arrays):
        out = rule(ctx, *arrays, **params)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    return run


def _moved(bctx, eqn, ins):
    return move(bctx, eqn, ins, range(len(ins)))


for _name in ("all_gather", "all_gather_invariant", "ppermute", "all_to_all", "pbroadcast", "pvary"):
    register(_name, moves=True)(_moved)
