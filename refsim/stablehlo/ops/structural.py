"""Data-layout ops: constant, iota, broadcast, reshape, transpose, slices, concatenate, pad,
reverse, gather, tuples; each evaluated by the refsim jaxpr kernel of the same semantics."""
from __future__ import annotations

import types

import numpy as np

from refsim.interpreter.registry import RULES
from refsim.stablehlo.registry import register


@register("stablehlo.constant", "mhlo.constant")
def constant_rule(m, op, env):
    """The attribute's value, the same on every device (lifted once, then reused: values are
    never written in place)."""
    lifted = op.attrs.get("_lifted")
    if lifted is None:
        lifted = op.attrs["_lifted"] = m.lift(op.attrs["value"])
    return lifted


@register("stablehlo.iota")
def iota_rule(m, op, env):
    t = op.types[0]
    return RULES["iota"](m.ctx, dtype=t.dtype, shape=t.shape, dimension=op.attrs["iota_dimension"], sharding=None)


@register("stablehlo.broadcast_in_dim")
def broadcast_in_dim_rule(m, op, env, x):
    return RULES["broadcast_in_dim"](m.ctx, x, shape=op.types[0].shape,
                                     broadcast_dimensions=op.attrs["broadcast_dimensions"], sharding=None)


@register("stablehlo.broadcast")
def broadcast_rule(m, op, env, x):
    """Leading dims `broadcast_sizes` prepended to the operand's."""
    shape = op.types[0].shape
    nb = len(shape) - (x.ndim - 1)
    return RULES["broadcast_in_dim"](m.ctx, x, shape=shape, broadcast_dimensions=tuple(range(nb, len(shape))),
                                     sharding=None)


@register("stablehlo.reshape")
def reshape_rule(m, op, env, x):
    """Row-major reshape."""
    return x.reshape((x.shape[0],) + op.types[0].shape)


def _physical_order(layout, rank) -> tuple:
    """Logical dims from major to minor for a minor-to-major `layout` (default: row-major)."""
    if layout is None or len(np.atleast_1d(layout)) != rank:
        return tuple(range(rank))
    return tuple(int(d) for d in reversed(np.atleast_1d(layout).tolist()))


@register("mhlo.bitcast")
def bitcast_rule(m, op, env, x):
    """HLO bitcast: the same bytes read in the result's shape, layout and element type. With layouts
    (minor-to-major) it is: lay the operand out physically, reshape, undo the result layout."""
    out_shape = op.types[0].shape
    src = _physical_order(op.attrs.get("source_layout"), x.ndim - 1)
    dst = _physical_order(op.attrs.get("result_layout"), len(out_shape))
    phys = np.transpose(x, (0,) + tuple(1 + d for d in src))
    want = op.types[0].dtype
    if want is not None and np.dtype(want) != x.dtype:
        # the same bits read as another element type of the same width (HLO bitcast converts no values)
        if np.dtype(want).itemsize != x.dtype.itemsize:
            raise ValueError(f"refsim.stablehlo: mhlo.bitcast from {x.dtype} to {np.dtype(want)} changes the element "
                             "width; HLO bitcasts keep it.")
        phys = np.ascontiguousarray(phys).view(np.dtype(want))
    y = phys.reshape((x.shape[0],) + tuple(out_shape[d] for d in dst))
    return np.transpose(y, (0,) + tuple(1 + dst.index(d) for d in range(len(out_shape))))


@register("stablehlo.transpose")
def transpose_rule(m, op, env, x):
    return RULES["transpose"](m.ctx, x, permutation=op.attrs["permutation"])


@register("stablehlo.slice")
def slice_rule(m, op, env, x):
    a = op.attrs
    return RULES["slice"](m.ctx, x, start_indices=a["start_indices"], limit_indices=a["limit_indices"],
                          strides=a.get("strides"))


@register("stablehlo.dynamic_slice")
def dynamic_slice_rule(m, op, env, x, *starts):
    """Window at starts clamped into range (each device may use its own starts)."""
    return RULES["dynamic_slice"](m.ctx, x, *starts, slice_sizes=op.attrs["slice_sizes"])


@register("stablehlo.dynamic_update_slice")
def dynamic_update_slice_rule(m, op, env, x, update, *starts):
    return RULES["dynamic_update_slice"](m.ctx, x, update, *starts)


@register("stablehlo.concatenate")
def concatenate_rule(m, op, env, *xs):
    return RULES["concatenate"](m.ctx, *xs, dimension=op.attrs["dimension"])


@register("stablehlo.pad")
def pad_rule(m, op, env, x, value):
    a = op.attrs
    cfg = list(zip(a["edge_padding_low"], a["edge_padding_high"], a["interior_padding"]))
    return RULES["pad"](m.ctx, x, value, padding_config=cfg)


@register("stablehlo.reverse")
def reverse_rule(m, op, env, x):
    return RULES["rev"](m.ctx, x, dimensions=op.attrs["dimensions"])


@register("stablehlo.gather")
def gather_rule(m, op, env, operand, indices):
    """StableHLO gather: start indices clamped so each slice lies in bounds (jaxpr mode CLIP)."""
    a = op.attrs
    dn = a["dimension_numbers"]
    rank = indices.ndim - 1
    ivd = dn.get("index_vector_dim", rank)
    if ivd == rank:  # StableHLO: index_vector_dim == rank means one index per position
        indices = indices[..., None]
    elif ivd != rank - 1:
        indices = np.moveaxis(indices, 1 + ivd, -1)
    nums = types.SimpleNamespace(**{k: tuple(dn.get(k, ())) for k in (
        "offset_dims", "collapsed_slice_dims", "start_index_map", "operand_batching_dims",
        "start_indices_batching_dims")})
    return RULES["gather"](m.ctx, operand, indices, dimension_numbers=nums, slice_sizes=a["slice_sizes"],
                           indices_are_sorted=False, unique_indices=False, mode="CLIP", fill_value=None)


@register("stablehlo.tuple")
def tuple_rule(m, op, env, *xs):
    return (tuple(xs),)


@register("stablehlo.get_tuple_element")
def get_tuple_element_rule(m, op, env, t):
    return t[op.attrs["index"]]


@register("stablehlo.optimization_barrier", "mhlo.copy", "mhlo.optimization_barrier")
def identity_rule(m, op, env, *xs):
    """Identity on every operand (scheduling and copies do not change values)."""
    return list(xs)
