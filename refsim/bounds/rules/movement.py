"""Data movement and annotations: exact on value and bound (refsim's value rule moves both).

A result element is some operand element (or a padding / fill value), so its allowed set is
that element's: the value rule applied to the bound array gives the bound. Indices must be
decided; an undecidable index makes the results undecidable (`_common.move`).
"""
from __future__ import annotations

import math

import numpy as np

from refsim.bounds.registry import register
from refsim.bounds.rules._common import move
from refsim.bounds.values import BVal

_FIRST = ("reshape", "transpose", "squeeze", "rev", "slice", "dynamic_slice", "gather", "unstack", "split",
          "tile", "copy", "copy_p")
_ALL = ("concatenate", "stack", "pad")


def _keep_origin(bctx, eqn, ins):
    outs = move(bctx, eqn, ins, [0], origin=ins[0].origin)
    if ins[0].extreme is not None and eqn.primitive.name == "reshape":
        outs[0].extreme = ins[0].extreme
    return outs


for _name in _FIRST:
    register(_name, moves=True)(_keep_origin)


def _all_operands(bctx, eqn, ins):
    return move(bctx, eqn, ins, range(len(ins)))


for _name in _ALL:
    register(_name, moves=True)(_all_operands)


@register("broadcast_in_dim", moves=True)
def _broadcast_in_dim(bctx, eqn, ins):
    """A broadcast: exact; its result is marked as a broadcast (XLA's reciprocal rewrite keys on it)."""
    grows = math.prod(eqn.params["shape"]) > math.prod(np.shape(ins[0].center)[bctx.nm:])
    outs = move(bctx, eqn, ins, [0], origin="broadcast" if grows else ins[0].origin)
    outs[0].extreme = ins[0].extreme
    return outs


@register("dynamic_update_slice", moves=True)
def _dynamic_update_slice(bctx, eqn, ins):
    return move(bctx, eqn, ins, [0, 1])


@register("scatter", moves=True)
def _scatter(bctx, eqn, ins):
    """scatter (overwrite): each result element is an operand or an update element. (With
    duplicate indices StableHLO leaves which update wins to the implementation: refsim's choice
    is checked then, as it is today.)"""
    return move(bctx, eqn, ins, [0, 2])


def _identity(bctx, eqn, ins):
    x = ins[0]
    # the terms a scatter-add or an unreduced sum stands for travel with the value (a reshard or a
    # memory-kind move between a scatter-add and the add XLA folds it into changes neither)
    return [BVal(x.center, x.bound, x.dtype, x.nonneg, x.dom, x.origin, x.extreme, x.root(),
                 scatter_terms=x.scatter_terms, partial_terms=x.partial_terms)]


for _name in ("stop_gradient", "reshard", "sharding_constraint", "layout_constraint", "relayout", "mesh_cast",
              "name", "xla_metadata_value"):
    register(_name, moves=True)(_identity)


def _every_operand(bctx, eqn, ins):
    return [BVal(x.center, x.bound, x.dtype, x.nonneg, x.dom, x.origin, scatter_terms=x.scatter_terms,
                 partial_terms=x.partial_terms) for x in ins]


for _name in ("device_put", "optimization_barrier", "shard_alike"):
    register(_name, moves=True)(_every_operand)


@register("tie", moves=True)
def _tie(bctx, eqn, ins):
    return [ins[1]]
