"""Data-movement primitives: broadcast, reshape, transpose, pad, concatenate, iota, ...

Every axis parameter names a local dimension, so it is shifted past the ``ctx.nm``
mesh dimensions. Outputs keep an operand's size-1 mesh dims (views where NumPy gives
them); mesh dims are only broadcast where operands of one equation differ.
Semantics follow the StableHLO ops of the same names (``broadcast_in_dim``, ``pad``,
``concatenate``, ``reverse``, ``iota``) as lowered by jax/_src/lax/lax.py.
"""
from __future__ import annotations

import numpy as np

from refsim.interpreter.registry import register
from refsim.interpreter.rules import _util as U


def _local_axis(axis: int, rank: int, name: str, param: str) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"{name}: {param}={axis} is out of range for an operand of rank {rank}.")
    return axis % rank


@register("broadcast_in_dim")
def broadcast_in_dim_rule(ctx, x, *dyn_shape, shape, broadcast_dimensions, sharding):
    """Operand dim i becomes output dim broadcast_dimensions[i]; the rest are broadcast (a view)."""
    if dyn_shape:
        raise ValueError(
            f"broadcast_in_dim: dynamic shape operands {len(dyn_shape)} are not supported by "
            "refsim; trace with static shapes."
        )
    nm = ctx.nm
    local = [1] * len(shape)
    for i, d in enumerate(broadcast_dimensions):
        local[d] = x.shape[nm + i]
    y = x.reshape(x.shape[:nm] + tuple(local))
    return np.broadcast_to(y, x.shape[:nm] + tuple(shape))


@register("reshape")
def reshape_rule(ctx, x, *dyn_shape, new_sizes, dimensions, sharding):
    """Row-major reshape of the local dims; `dimensions`, when set, transposes first."""
    nm = ctx.nm
    if dimensions is not None:
        x = np.transpose(x, tuple(range(nm)) + U.shift(dimensions, nm))
    return x.reshape(x.shape[:nm] + tuple(new_sizes))


@register("transpose")
def transpose_rule(ctx, x, *, permutation):
    nm = ctx.nm
    return np.transpose(x, tuple(range(nm)) + U.shift(permutation, nm))


@register("squeeze")
def squeeze_rule(ctx, x, *, dimensions):
    nm = ctx.nm
    rank = x.ndim - nm
    dims = tuple(_local_axis(d, rank, "squeeze", "dimensions") for d in dimensions)
    return np.squeeze(x, axis=U.shift(dims, nm)) if dims else x


@register("rev")
def rev_rule(ctx, x, *, dimensions):
    """StableHLO reverse along the given local dims."""
    return np.flip(x, axis=U.shift(dimensions, ctx.nm)) if dimensions else x


@register("concatenate")
def concatenate_rule(ctx, *operands, dimension):
    ops = U.bcast_mesh(ctx.nm, *operands)
    return np.concatenate(ops, axis=ctx.nm + dimension)


@register("stack")
def stack_rule(ctx, *operands, axis):
    """jnp.stack's primitive: a new local dim `axis` enumerating the operands."""
    ops = U.bcast_mesh(ctx.nm, *operands)
    return np.stack(ops, axis=ctx.nm + axis)


@register("unstack")
def unstack_rule(ctx, x, *, axis):
    """The inverse of stack: one output per index of local dim `axis`."""
    moved = np.moveaxis(x, ctx.nm + axis, 0)
    return [moved[i] for i in range(moved.shape[0])]


@register("split")
def split_rule(ctx, x, *, sizes, axis):
    """Consecutive pieces of local dim `axis` with the given sizes (lax.split)."""
    bounds = np.cumsum([int(s) for s in sizes])[:-1]
    return np.split(x, bounds, axis=ctx.nm + axis)


@register("tile")
def tile_rule(ctx, x, *, reps):
    return np.tile(x, (1,) * ctx.nm + tuple(int(r) for r in reps))


@register("iota")
def iota_rule(ctx, *dyn_shape, dtype, shape, dimension, sharding):
    """StableHLO iota: values 0..shape[dimension]-1 along `dimension`, broadcast elsewhere."""
    n = shape[dimension]
    line = np.arange(n, dtype=np.int64).astype(dtype)
    local = [1] * len(shape)
    local[dimension] = n
    return np.broadcast_to(line.reshape((1,) * ctx.nm + tuple(local)), (1,) * ctx.nm + tuple(shape))


@register("pad")
def pad_rule(ctx, x, padding_value, *, padding_config):
    """StableHLO pad: (low, high, interior) per local dim; negative low/high crop."""
    nm = ctx.nm
    m = U.mesh_shape(nm, x, padding_value)
    local = x.shape[nm:]
    if len(padding_config) != len(local):
        raise ValueError(
            f"pad: padding_config has {len(padding_config)} entries for an operand of rank "
            f"{len(local)}; give one (low, high, interior) triple per dimension."
        )
    full, place, crop = [], [], []
    for n, (lo, hi, interior) in zip(local, padding_config):
        lo_p, hi_p = max(lo, 0), max(hi, 0)
        core = n + max(n - 1, 0) * interior
        size = lo_p + core + hi_p
        full.append(size)
        place.append(slice(lo_p, lo_p + core, interior + 1))
        crop.append(slice(-lo if lo < 0 else 0, size - (-hi if hi < 0 else 0)))
    out = np.empty(m + tuple(full), dtype=x.dtype)
    out[...] = padding_value.reshape(padding_value.shape[:nm] + (1,) * len(local))
    out[(slice(None),) * nm + tuple(place)] = x
    return out[(slice(None),) * nm + tuple(crop)]
