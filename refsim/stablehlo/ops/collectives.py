"""Collectives across virtual devices, by refsim's collective kernels.

`process_groups` turns an op's `replica_groups` / `source_target_pairs`, `channel_handle` and
`use_global_device_ids` into groups of device numbers (device = replica * num_partitions +
partition), following the StableHLO spec's modes: cross_replica (no channel: replica ids,
within each partition), cross_replica_and_partition (a channel, replica ids, every partition
of those replicas), flattened_ids (`use_global_device_ids`: device ids), and for all_to_all /
collective_permute with a channel, cross_partition (partition ids, within each replica).
`replica_groups` may also be the mesh-axes form XLA prints after Shardy
(`#stablehlo.replica_group_mesh_axes<mesh = @m, axes = [...]>`): the devices that differ only
along those axes, members ordered row-major over them (refsim's `replica_groups`).

The kernels then run over one mesh axis holding every device, with these groups as
`axis_index_groups`: the reduction order (ascending group position), ppermute's zero-fill
and the gather/scatter block order are refsim's, documented in refsim/collectives/.
"""
from __future__ import annotations

import re

import numpy as np

from refsim.collectives import alltoall, gather, groups as G, permute, reductions, scatter
from refsim.stablehlo.machine import DEVICE_AXIS
from refsim.stablehlo.ops.reduce import body_kind, combine
from refsim.stablehlo.registry import register
from refsim.stablehlo.shardings import parse_mesh


def _channel(op) -> bool:
    ch = op.attrs.get("channel_handle")
    if ch is None:
        return False
    m = re.search(r"handle\s*=\s*(\d+)", str(ch))
    return bool(m and int(m.group(1)) > 0)


def _raw_groups(m, op) -> list[list[int]] | None:
    rg = op.attrs.get("replica_groups")
    if isinstance(rg, str) and "replica_group_mesh_axes" in rg:
        name = re.search(r"mesh\s*=\s*@([\w.$-]+)", rg).group(1)
        mesh = parse_mesh(m.program.meshes[name])
        axes = re.findall(r'name\s*=\s*"((?:[^"\\]|\\.)*)"', rg)
        return G.replica_groups(mesh, tuple(axes)) if axes else [[int(i)] for i in np.ravel(mesh.device_ids)]
    if rg is None:
        return None
    rg = np.asarray(rg)
    if rg.size == 0:
        return None
    return [[int(i) for i in row if i >= 0] for row in rg.reshape(rg.shape[0], -1)]


def process_groups(m, op, *, partition_mode: bool = False) -> list[list[int]] | None:
    """Groups of device numbers for a collective op (None: one group of every device in order)."""
    R, P = m.num_replicas, m.num_partitions
    raw = _raw_groups(m, op)
    if op.attrs.get("use_global_device_ids"):
        out = raw if raw is not None else [list(range(R * P))]
    elif partition_mode and _channel(op):  # cross_partition: partition ids, within each replica
        raw = raw if raw is not None else [list(range(P))]
        out = [[r * P + p for p in g] for r in range(R) for g in raw]
    elif _channel(op):  # cross_replica_and_partition
        raw = raw if raw is not None else [list(range(R))]
        out = [[r * P + p for r in g for p in range(P)] for g in raw]
    else:  # cross_replica: replica ids, within each partition
        raw = raw if raw is not None else [list(range(R))]
        out = [[r * P + p for r in g] for p in range(P) for g in raw]
    if len(out) == 1 and out[0] == list(range(R * P)):
        return None
    return out


def _members(m, groups) -> tuple[np.ndarray, np.ndarray]:
    """(members, position): members[j, d] is the device at position j of device d's group and
    position[d] is d's own position in it (a device in no group forms its own group)."""
    n = m.n
    groups = [list(range(n))] if groups is None else groups
    size = max(len(g) for g in groups)
    members = np.tile(np.arange(n), (size, 1))
    position = np.zeros(n, np.int64)
    for g in groups:
        for j, dev in enumerate(g):
            members[j, g] = dev
            position[dev] = j
    return members, position


def _fold(m, op, env, x, groups):
    """Every device's reduction over its group in ascending group position, by the op's body:
    refsim's kernel for a recognised body (sum / max / min: the collective kernels, whose order and
    special values are refsim's documented ones; prod / and / or / xor: one binary op per step),
    else the body region interpreted per step."""
    kind = body_kind(op.regions[0])
    if kind in ("sum", "max", "min"):
        return reductions.all_reduce(x, mesh=m.mesh, axes=(DEVICE_AXIS,), axis_index_groups=groups, op=kind,
                                     api=op.name)
    members, _ = _members(m, groups)
    xf = m.full(x)
    acc = xf[members[0]]
    for j in range(1, members.shape[0]):
        nxt = xf[members[j]]
        acc = combine(m, kind, acc, nxt) if kind is not None else m.scalar_region(op, 0, [acc, nxt], env)[0]
    return acc


@register("stablehlo.all_reduce", "mhlo.all_reduce")
def all_reduce_rule(m, op, env, *xs):
    """Every member of a group receives the reduction of the group's operands by the body
    (each operand), in ascending group position."""
    groups = process_groups(m, op)
    return [_fold(m, op, env, x, groups) for x in xs]


@register("stablehlo.all_gather", "mhlo.all_gather")
def all_gather_rule(m, op, env, *xs):
    """Concatenation of the group's operands along `all_gather_dim`, in group order."""
    groups = process_groups(m, op)
    size = m.n if groups is None else len(groups[0])
    d = op.attrs["all_gather_dim"]
    return [gather.all_gather(x, mesh=m.mesh, axis_name=DEVICE_AXIS, all_gather_dimension=d, axis_size=size,
                              axis_index_groups=groups, tiled=True, api=op.name) for x in xs]


@register("stablehlo.reduce_scatter", "mhlo.reduce_scatter")
def reduce_scatter_rule(m, op, env, x):
    """The group's reduction by the body, split along `scatter_dimension`; group position j keeps
    block j."""
    groups = process_groups(m, op)
    size = m.n if groups is None else len(groups[0])
    d = op.attrs["scatter_dimension"]
    if body_kind(op.regions[0]) == "sum":
        return scatter.reduce_scatter(x, mesh=m.mesh, axis_name=DEVICE_AXIS, scatter_dimension=d,
                                      axis_size=size, axis_index_groups=groups, tiled=True, api=op.name)
    total = m.full(_fold(m, op, env, x, groups))
    _, position = _members(m, groups)
    ax = 1 + d
    blk = total.shape[ax] // size
    split = total.reshape(total.shape[:ax] + (size, blk) + total.shape[ax + 1:])
    split = np.moveaxis(split, ax, 1)                       # (N, size, ..., blk, ...)
    return split[np.arange(m.n), position]


@register("stablehlo.all_to_all", "mhlo.all_to_all")
def all_to_all_rule(m, op, env, *xs):
    """Split `split_dimension` across the group, concatenate the received blocks along
    `concat_dimension` (HLO's tuple form, one operand per member, exchanges whole operands)."""
    groups = process_groups(m, op, partition_mode=True)
    if "split_dimension" not in op.attrs:  # tuple form: operand i goes to group position i
        stacked = np.stack(np.broadcast_arrays(*xs), axis=1)
        out = alltoall.all_to_all(stacked, mesh=m.mesh, axis_name=DEVICE_AXIS, split_axis=0, concat_axis=0,
                                  axis_index_groups=groups, api=op.name)
        return [out[:, i] for i in range(len(xs))]
    return [alltoall.all_to_all(x, mesh=m.mesh, axis_name=DEVICE_AXIS, split_axis=op.attrs["split_dimension"],
                                concat_axis=op.attrs["concat_dimension"], axis_index_groups=groups, api=op.name)
            for x in xs]


@register("stablehlo.collective_permute", "mhlo.collective_permute")
def collective_permute_rule(m, op, env, x):
    """Target t receives source s's operand for each (s, t) pair; a device no pair targets
    receives zeros (StableHLO collective_permute)."""
    R, P = m.num_replicas, m.num_partitions
    pairs = np.asarray(op.attrs["source_target_pairs"]).reshape(-1, 2).tolist()
    if _channel(op):  # cross_partition: within each replica
        pairs = [(r * P + s, r * P + t) for r in range(R) for s, t in pairs]
    else:  # cross_replica: within each partition
        pairs = [(s * P + p, t * P + p) for p in range(P) for s, t in pairs]
    return permute.ppermute(m.full(x), mesh=m.mesh, axis_name=DEVICE_AXIS, perm=tuple(map(tuple, pairs)),
                            api=op.name)


@register("stablehlo.collective_broadcast")
def collective_broadcast_rule(m, op, env, x):
    """Every member of a group receives the operand of the group's first member."""
    groups = process_groups(m, op, partition_mode=True)
    groups = [list(range(m.n))] if groups is None else groups
    src = np.arange(m.n)
    for g in groups:  # groups are few and small lists; the data moves in one take below
        src[g] = g[0]
    return m.full(x)[src]


@register("stablehlo.partition_id")
def partition_id_rule(m, op, env):
    return (np.arange(m.n) % m.num_partitions).astype(np.uint32)


@register("stablehlo.replica_id")
def replica_id_rule(m, op, env):
    return (np.arange(m.n) // m.num_partitions).astype(np.uint32)


@register("stablehlo.custom_call @ragged_all_to_all")
def ragged_all_to_all_rule(m, op, env, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes):
    """JAX's ragged_all_to_all custom call (replica groups of device ids in backend_config):
    refsim's ragged kernel, which follows `lax.ragged_all_to_all`'s docstring."""
    from refsim.collectives import ragged

    cfg = op.attrs.get("backend_config")
    rg = cfg.get("replica_groups") if isinstance(cfg, dict) else None
    groups = None
    if rg is not None and np.asarray(rg).size:
        groups = [[int(i) for i in row] for row in np.asarray(rg)]
        if len(groups) == 1 and groups[0] == list(range(m.n)):
            groups = None
    return ragged.ragged_all_to_all(operand, m.full(output), input_offsets, send_sizes, output_offsets, recv_sizes,
                                    mesh=m.mesh, axis_name=DEVICE_AXIS, axis_index_groups=groups)
