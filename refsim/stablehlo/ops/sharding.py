"""Sharding ops: Shardy's manual regions and annotations, and the GSPMD `Sharding` custom call.

Outside a manual region a value is global (the lowered module's view); `sdy.manual_computation`
gives each device its block (`shardings.split`), runs the body per device, and rebuilds the
global results from the blocks (`shardings.join`). Annotations (`sdy.sharding_constraint`,
`sdy.reshard`, `custom_call @Sharding`) only say where a global value lives: identity.
"""
from __future__ import annotations

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


@register("sdy.sharding_constraint", "sdy.reshard", "sdy.propagation_barrier",
          "stablehlo.custom_call @Sharding", "stablehlo.custom_call @mhlo.sharding")
def annotation_rule(m, op, env, x):
    """A layout annotation on a global value: the value is unchanged."""
    return x


@register("sdy.sharding_group")
def sharding_group_rule(m, op, env, x):
    return []
