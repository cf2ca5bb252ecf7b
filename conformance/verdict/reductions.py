"""An independent NumPy model of who reduces with whom, for the sum bound and platform models.

`group_members` turns (mesh, axes, axis_index_groups) into the devices each device reduces
with, without refsim's grouping code, so the `SumBound` of a psum / pmean / psum_scatter case
(`sum_bound_for`) and the max / min platform model check refsim and XLA against a second
reading of JAX's rules.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from conformance.verdict.compare import SumBound
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding


def group_members(mesh: Mesh, axes, axis_index_groups=None) -> tuple[np.ndarray, np.ndarray]:
    """(members, rank): for each device (flat row-major mesh position), the flat positions of
    the devices it reduces with, in group order, and its own rank in that group.

    The devices along `axes` are numbered by their coordinates over `axes` in the order
    given (major to minor), as `jax._src.interpreters.pxla._axis_groups` numbers replicas;
    `axis_index_groups` then splits those numbers into groups (StableHLO replica_groups).
    """
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    sizes = mesh.axis_sizes
    k = [mesh.axis_index(a) for a in axes]
    iota = np.arange(mesh.size).reshape(sizes)
    moved = np.moveaxis(iota, k, list(range(len(k)))).reshape(int(np.prod([sizes[i] for i in k])), -1)
    g_count = moved.shape[0]
    groups = [list(range(g_count))] if axis_index_groups is None else [list(g) for g in axis_index_groups]
    table = np.asarray(groups, dtype=np.int64)                # (num_groups, n) linear indices
    group_of = np.empty(g_count, np.int64)
    rank_of = np.empty(g_count, np.int64)
    for gi, g in enumerate(groups):
        group_of[g] = gi
        rank_of[g] = np.arange(len(g))
    member_lin = table[group_of]                                # (G, n)
    members_lr = moved[member_lin, :]                           # (G, n, R)
    members = np.empty((mesh.size, table.shape[1]), np.int64)
    rank = np.empty(mesh.size, np.int64)
    members[moved] = np.moveaxis(members_lr, 1, 2)              # moved: (G, R) -> (G, R, n)
    rank[moved] = rank_of[:, None]
    return members, rank


def local_blocks(case, arg: int = 0) -> np.ndarray:
    """Each device's input block, stacked in flat row-major mesh position order."""
    x = np.asarray(case.args[arg])
    if case.entry == "pmap":
        return x
    s = NamedSharding(case.mesh, case.in_specs[arg])
    idx = s.devices_indices_map(x.shape)
    return np.stack([x[idx[int(d)]] for d in np.asarray(case.mesh.device_ids).ravel()])


def sum_bound_for(call: "conformance.cases.CollectiveCall"):
    """The `SumBound` of a psum / pmean / psum_scatter call, from its inputs; an exact zero's sign
    counts (StableHLO all_reduce / reduce_scatter: -0 only when every operand is -0), except in a
    complex mean: JAX divides the complex sum by n as a complex number, (a+bi)/(n+0i), whose
    cross terms (b*0, a*0) decide the zero signs of both parts however the division is written
    (refsim and XLA:CPU: (-4-0j)/2 is -2+0j, the parts divided one by one -2-0j)."""
    terms = reduction_terms(call)
    mean = call.name == "pmean"
    complex_mean = mean and next(iter(terms.values())).dtype.kind == "c"
    return SumBound.from_terms(terms, mean=mean, signed_zero=not complex_mean)


def reduction_terms(call: "conformance.cases.CollectiveCall", args: tuple | None = None) -> dict:
    """{device id: (n, *shard_shape)}: the n values each device's output element reduces, for a
    psum / pmean / pmax / pmin / psum_scatter call (with `args` instead of the call's own)."""
    if args is not None:
        call = dataclasses.replace(call, args=tuple(args))
    p = call.params
    members, rank = group_members(call.mesh, p["axis_name"], p.get("axis_index_groups"))
    blocks = local_blocks(call)
    n = members.shape[1]
    terms = blocks[members]                                     # (devices, n, *local)
    if call.name == "psum_scatter":
        d = p.get("scatter_dimension", 0) % (blocks.ndim - 1)
        if p.get("tiled", False):
            m = blocks.shape[1 + d] // n
            pieces = terms.reshape(terms.shape[:2 + d] + (n, m) + terms.shape[3 + d:])
            terms = np.take_along_axis(pieces, rank.reshape((-1,) + (1,) * (pieces.ndim - 1)), axis=2 + d).squeeze(2 + d)
        else:
            terms = np.take_along_axis(terms, rank.reshape((-1,) + (1,) * (terms.ndim - 1)), axis=2 + d).squeeze(2 + d)
    if call.entry == "pmap":
        # A pmap output's shard keeps the mapped axis with size 1, as jax.pmap's shards do.
        terms = terms[:, :, None]
    ids = np.asarray(call.mesh.device_ids).ravel()
    return {int(i): terms[j] for j, i in enumerate(ids)}
