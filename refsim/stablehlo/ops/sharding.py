"""Sharding ops: Shardy's manual regions and annotations, and GSPMD's custom calls.

Outside a manual region a value is global (the lowered module's view); `sdy.manual_computation`
gives each device its block (`shardings.split`), runs the body per device, and rebuilds the
global results from the blocks (`shardings.join`). Annotations (`sdy.sharding_constraint`,
`sdy.reshard`, `custom_call @Sharding`) only say where a global value lives: identity.

Without Shardy (`jax_use_shardy_partitioner=False`) JAX marks a manual region with GSPMD's
custom calls: `@SPMDFullToShardShape` cuts each device's block by the sharding of its operand
(the `@Sharding` call before it), `@SPMDShardToFullShape` rebuilds the value by its own
`mhlo.sharding`. The sharding's tile assignment is read as a mesh whose axes are the tile
dimensions (data dimensions, then manual / replicated subgroups), so the same split and join
apply: a subgroup axis keeps each device's own block.
"""
from __future__ import annotations

import numpy as np

from refsim.layouts.hlo_sharding import HloSharding
from refsim.layouts.mesh import Mesh
from refsim.stablehlo.registry import register
from refsim.stablehlo.shardings import join, parse_axes, parse_per_value, split


@register("sdy.manual_computation")
def manual_computation_rule(m, op, env, *xs):
    meshes = m.program.meshes
    ins = parse_per_value(op.attrs["in_shardings"], meshes)
    outs = parse_per_value(op.attrs["out_shardings"], meshes)
    manual = set(parse_axes(op.attrs["manual_axes"]))
    blocks = [split(x, mesh, dims, manual) for x, (mesh, dims) in zip(xs, ins)]
    res = m.region(op, 0, blocks, env)
    return [join(y, mesh, dims, manual) for y, (mesh, dims) in zip(res, outs)]


@register("sdy.sharding_constraint", "sdy.reshard", "sdy.propagation_barrier")
def annotation_rule(m, op, env, x):
    """A layout annotation on a global value: the value is unchanged."""
    return x


@register("stablehlo.custom_call @Sharding", "stablehlo.custom_call @mhlo.sharding")
def sharding_rule(m, op, env, x):
    """GSPMD's layout annotation: the value is unchanged; its sharding is remembered for a
    following `@SPMDFullToShardShape`."""
    env[("sharding", op.results[0])] = op.attrs.get("mhlo.sharding")
    return x


def _tile_mesh(text: str, rank: int, n: int):
    """(mesh over the tile assignment, per-dimension axes) of HloSharding `text`, or None when the
    sharding does not split data dimensions (replicated, manual, maximal)."""
    h = HloSharding.parse(text)
    if not h.is_tiled():
        return None
    dims = tuple(h.tile_assignment_dimensions)
    ids = np.asarray(h.tile_assignment_devices).reshape(dims)
    if ids.size != n:
        raise ValueError(f"refsim.stablehlo: sharding {text} places the value on {ids.size} devices; the module "
                         f"runs on {n}.")
    names = tuple(f"t{i}" for i in range(len(dims)))
    return Mesh(dims, names, device_ids=ids), [[names[d]] for d in range(rank)]


@register("stablehlo.custom_call @SPMDFullToShardShape")
def full_to_shard_rule(m, op, env, x):
    """Each device's block of `x` by the sharding of the `@Sharding` call that produced it."""
    text = env.get(("sharding", op.operands[0]))
    tm = None if text is None else _tile_mesh(text, x.ndim - 1, m.n)
    if tm is None:
        if text is None and x.shape[1:] != op.types[0].shape:
            raise ValueError("refsim.stablehlo: @SPMDFullToShardShape's operand has no @Sharding annotation, so "
                             "its blocks are unknown.")
        return x
    mesh, dims = tm
    return split(x, mesh, dims, set(mesh.axis_names))


@register("stablehlo.custom_call @SPMDShardToFullShape")
def shard_to_full_rule(m, op, env, x):
    """The full value rebuilt from the devices' blocks by this call's own `mhlo.sharding`."""
    tm = _tile_mesh(op.attrs["mhlo.sharding"], x.ndim - 1, m.n)
    if tm is None:
        return x
    mesh, dims = tm
    return join(x, mesh, dims, set(mesh.axis_names))


@register("sdy.sharding_group")
def sharding_group_rule(m, op, env, x):
    return []
