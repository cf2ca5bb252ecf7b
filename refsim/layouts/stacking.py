"""Mesh-major stacked values <-> global arrays under a NamedSharding, in O(1) NumPy calls.

A stacked value has shape `mesh.axis_sizes + local_shape`: entry p is the block
of the device at mesh position p. Array dimension d of the global value is the
concatenation, in linear order over spec[d]'s mesh axes (major to minor), of the
local blocks along d; mesh axes the spec does not name hold replicas. This is
the layout of `jax.shard_map`'s in_specs/out_specs and of NamedSharding.
"""
from __future__ import annotations

import numpy as np

from refsim.layouts.mesh import Mesh
from refsim.layouts.partition_spec import UNCONSTRAINED, PartitionSpec


def check_concrete_spec(spec: PartitionSpec, what: str) -> None:
    """ValueError for specs that do not describe one concrete value per block."""
    if any(p is UNCONSTRAINED for p in spec):
        raise ValueError(
            f"{what}: spec {spec!r} contains UNCONSTRAINED, which leaves the layout to the compiler; "
            "a concrete array needs None or mesh axis names in every entry."
        )
    if spec.unreduced:
        raise ValueError(
            f"{what}: spec {spec!r} has unreduced axes {sorted(spec.unreduced)}: devices along them "
            "hold partial sums, not blocks of one value. Reduce with jax.lax.psum first, or drop "
            "`unreduced` from the spec."
        )


def broadcast_stacked(stacked: np.ndarray, mesh: Mesh) -> np.ndarray:
    """`stacked` with its size-1 mesh dimensions broadcast (views) to `mesh.axis_sizes`."""
    lead = stacked.shape[:mesh.ndim]
    if stacked.ndim < mesh.ndim or any(n not in (1, s) for n, s in zip(lead, mesh.axis_sizes)):
        raise ValueError(
            f"stacked has shape {stacked.shape}, but its leading {mesh.ndim} dimensions must match the "
            f"mesh axis sizes {mesh.axis_sizes} (or be 1 where the value is the same on every device "
            "along that axis); stack per-device blocks as mesh_shape + block_shape."
        )
    full = mesh.axis_sizes + stacked.shape[mesh.ndim:]
    return stacked if stacked.shape == full else np.broadcast_to(stacked, full)


def _used_in_mesh_order(mesh: Mesh, spec: PartitionSpec) -> list[str]:
    used = set(spec.used_axes())
    return [a for a in mesh.axis_names if a in used]


def global_to_stacked(x: np.ndarray, mesh: Mesh, spec: PartitionSpec) -> np.ndarray:
    """Each device's block of global `x` under NamedSharding(mesh, spec), stacked mesh-major (a view)."""
    ndim = x.ndim
    split_shape, axis_pos, local_pos = [], {}, []
    for d in range(ndim):
        axes = spec.axes_of(d)
        sizes = [mesh.axis_size(a) for a in axes]
        block = x.shape[d] // int(np.prod(sizes, dtype=np.int64))
        for a, s in zip(axes, sizes):
            axis_pos[a] = len(split_shape)
            split_shape.append(s)
        local_pos.append(len(split_shape))
        split_shape.append(block)
    used = _used_in_mesh_order(mesh, spec)
    y = x.reshape(split_shape).transpose([axis_pos[a] for a in used] + local_pos)
    # size-1 slots for the replica axes, then broadcast: every replica sees the same memory
    expanded = tuple(mesh.axis_size(a) if a in axis_pos else 1 for a in mesh.axis_names)
    y = y.reshape(expanded + y.shape[len(used):])
    return np.broadcast_to(y, mesh.axis_sizes + y.shape[mesh.ndim:])


def stacked_to_global(stacked: np.ndarray, mesh: Mesh, spec: PartitionSpec) -> np.ndarray:
    """The global array tiled from a full stacked value; replica axes are read at position 0."""
    used = _used_in_mesh_order(mesh, spec)
    take = tuple(slice(None) if a in used else 0 for a in mesh.axis_names)
    y = stacked[take]  # used mesh axes (mesh order) + local dims
    nu = len(used)
    local = y.shape[nu:]
    order, shape = [], []
    for d in range(len(local)):
        axes = spec.axes_of(d)
        order.extend(used.index(a) for a in axes)
        order.append(nu + d)
        shape.append(local[d] * int(np.prod([mesh.axis_size(a) for a in axes], dtype=np.int64)))
    return np.ascontiguousarray(y.transpose(order)).reshape(shape)


def differing(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a != b, with NaN equal to NaN (a replica holding NaN where its peer does agrees)."""
    ne = np.asarray(a != b)
    if np.asarray(a).dtype.kind in "fc":
        ne &= ~(np.isnan(a) & np.isnan(b))
    return ne


def replica_mismatch(y: np.ndarray, nm: int, axes_pos, chunk_bytes: int = 1 << 24):
    """First (mesh position a, mesh position b, local index) where devices along `axes_pos` differ.

    `y` has `nm` leading mesh dims; every device is compared with the device at
    position 0 along the given dims (NaN equals NaN, as a bitwise replica comparison).
    Dims of size 1 or stride 0 (a broadcast view: every replica reads the same memory)
    cannot differ and are not compared, so an invariant value costs nothing to check.
    The comparison runs in slices of the first compared dim so its temporaries stay
    near `chunk_bytes` whatever the data size. None when all agree.
    """
    axes = [k for k in axes_pos if y.shape[k] > 1 and y.strides[k] != 0]
    if not axes:
        return None
    # dims that cannot differ are read at position 0 (keeps the comparison to real copies)
    skip = [k for k in axes_pos if k not in axes]
    if skip:
        y = y[tuple(slice(0, 1) if k in skip else slice(None) for k in range(y.ndim))]
    ref = y[tuple(slice(0, 1) if k in axes else slice(None) for k in range(y.ndim))]
    # chunks of the outermost non-trivial dim keep row-major order: the first hit is the first
    lead = next(k for k in range(y.ndim) if y.shape[k] > 1)
    per_step = max(1, y.nbytes // y.shape[lead])
    step = max(1, chunk_bytes // per_step)
    nan_aware = y.dtype.kind in "fc"
    for start in range(0, y.shape[lead], step):
        cut = tuple(slice(start, start + step) if k == lead else slice(None) for k in range(y.ndim))
        part, against = y[cut], (ref if ref.shape[lead] == 1 else ref[cut])
        ne = part != against
        if nan_aware:
            ne &= ~(np.isnan(part) & np.isnan(against))
        if ne.any():
            hit = [int(i) for i in np.argwhere(ne)[0]]
            hit[lead] += start
            pos_b = tuple(hit[:nm])
            pos_a = tuple(0 if (k in axes or k in skip) else p for k, p in enumerate(pos_b))
            return pos_a, pos_b, tuple(hit[nm:])
    return None


def first_replica_mismatch(stacked: np.ndarray, mesh: Mesh, spec: PartitionSpec):
    """(reference device, differing device, local index) of the first replica that differs, or None.

    Replicas of a block are the devices that differ only along mesh axes the
    spec leaves unnamed; each is compared with the one at position 0 there.
    """
    used = set(spec.used_axes())
    replica_axes = [k for k, a in enumerate(mesh.axis_names) if a not in used]
    bad = replica_mismatch(stacked, mesh.ndim, replica_axes)
    if bad is None:
        return None
    pos_a, pos_b, local = bad
    return int(mesh.device_ids[pos_a]), int(mesh.device_ids[pos_b]), local
