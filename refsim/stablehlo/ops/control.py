"""Calls and control flow: func.call, mhlo.fusion, while, case, if.

A predicate or branch index may differ per device (a loop bound from `partition_id`):
then every device keeps iterating or takes its own branch, and values are merged per device
with `np.where`, as refsim's jaxpr `while` / `cond` rules do.
"""
from __future__ import annotations

import numpy as np

from refsim.interpreter.rules.control_flow import _mesh_select
from refsim.stablehlo.registry import register


@register("func.call")
def call_rule(m, op, env, *args):
    return m.call(op.attrs["callee"].lstrip("@"), args)


@register("mhlo.fusion")
def fusion_rule(m, op, env, *args):
    """An XLA fusion: its region evaluated on the operands (fusion never changes values)."""
    return m.region(op, 0, args, env)


@register("stablehlo.while")
def while_rule(m, op, env, *carry):
    """Iterate the body while the condition holds, per device."""
    carry = list(carry)
    while True:
        (pred,) = m.region(op, 0, carry, env)
        pred = np.asarray(pred).reshape(pred.shape[:1])
        if not pred.any():
            return carry
        new = m.region(op, 1, carry, env)
        carry = new if pred.all() else [_mesh_select(1, pred, n, c) for n, c in zip(new, carry)]


def _branches(m, op, env, index, n_branches):
    idx = np.asarray(index).reshape(index.shape[:1]).astype(np.int64)
    idx = np.where((idx < 0) | (idx >= n_branches), n_branches - 1, idx)  # StableHLO case: default last
    taken = np.unique(idx)
    if taken.size == 1:
        return m.region(op, int(taken[0]), [], env)
    outs = None
    for b in taken.tolist():
        res = m.region(op, b, [], env)
        outs = res if outs is None else [_mesh_select(1, idx == b, r, o) for r, o in zip(res, outs)]
    return outs


@register("stablehlo.case")
def case_rule(m, op, env, index):
    """Run branch `index` (an out-of-range index runs the last branch)."""
    return _branches(m, op, env, index, len(op.regions))


@register("stablehlo.if")
def if_rule(m, op, env, pred):
    """Region 0 where pred is true, region 1 where false."""
    return _branches(m, op, env, 1 - np.asarray(pred).astype(np.int64), 2)
