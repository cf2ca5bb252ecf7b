"""The pmap layout family: `ShardingSpec(sharding, mesh_mapping)` and `PmapSharding`.

`sharding` has one entry per array dimension: `NoSharding()` (kept whole),
`Chunked(chunks)` (cut into prod(chunks) equal pieces, factors major to minor)
or `Unstacked(size)` (removed: each index is its own shard, as pmap's mapped
axis). `mesh_mapping` has one entry per logical device-mesh dimension:
`ShardedAxis(k)` (enumerates the k-th sharded axis, counting Chunked factors and
Unstacked entries in dimension order) or `Replicated(n)` (n copies). Devices are
taken in row-major order of that mesh. This is JAX's `jax._src.sharding_specs`
(removed from JAX 0.5+, kept here as the clearest statement of pmap placement).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence, Union

import numpy as np

from refsim.errors import IndivisibleError


@dataclasses.dataclass(frozen=True)
class NoSharding:
    """The array dimension is not cut: every device sees all of it (`slice(None)`)."""


@dataclasses.dataclass(frozen=True)
class Chunked:
    """The dimension is cut into prod(chunks) equal contiguous pieces; factors listed major to minor."""

    chunks: tuple[int, ...]

    def __init__(self, chunks):
        chunks = (chunks,) if isinstance(chunks, (int, np.integer)) else tuple(chunks)
        for c in chunks:
            if not isinstance(c, (int, np.integer)) or isinstance(c, bool) or c < 1:
                raise ValueError(f"Chunked(chunks={chunks!r}): every chunk count must be a positive int.")
        object.__setattr__(self, "chunks", tuple(int(c) for c in chunks))

    @property
    def total(self) -> int:
        return math.prod(self.chunks)


@dataclasses.dataclass(frozen=True)
class Unstacked:
    """The dimension (of length `size`) is removed: device k holds the slab at integer index k."""

    size: int

    def __post_init__(self):
        if not isinstance(self.size, (int, np.integer)) or isinstance(self.size, bool) or self.size < 1:
            raise ValueError(f"Unstacked(size={self.size!r}): size must be a positive int.")


@dataclasses.dataclass(frozen=True)
class ShardedAxis:
    """This mesh dimension enumerates sharded axis number `axis` (see the module docstring)."""

    axis: int

    def __post_init__(self):
        if not isinstance(self.axis, (int, np.integer)) or isinstance(self.axis, bool) or self.axis < 0:
            raise ValueError(f"ShardedAxis(axis={self.axis!r}): axis must be a non-negative int.")


@dataclasses.dataclass(frozen=True)
class Replicated:
    """This mesh dimension holds `replicas` copies of the same shards."""

    replicas: int

    def __post_init__(self):
        if not isinstance(self.replicas, (int, np.integer)) or isinstance(self.replicas, bool) or self.replicas < 1:
            raise ValueError(f"Replicated(replicas={self.replicas!r}): replicas must be a positive int.")


DimSharding = Union[NoSharding, Chunked, Unstacked]
MeshDimAssignment = Union[ShardedAxis, Replicated]


class ShardingSpec:
    """`ShardingSpec(sharding, mesh_mapping)`: how an array is cut and where each piece lives."""

    def __init__(self, sharding: Sequence[DimSharding], mesh_mapping: Sequence[MeshDimAssignment]):
        sharding = tuple(sharding)
        mesh_mapping = tuple(mesh_mapping)
        for s in sharding:
            if not isinstance(s, (NoSharding, Chunked, Unstacked)):
                raise TypeError(
                    f"ShardingSpec sharding entry {s!r} must be NoSharding(), Chunked(chunks) or "
                    f"Unstacked(size); got sharding={sharding!r}."
                )
        for m in mesh_mapping:
            if not isinstance(m, (ShardedAxis, Replicated)):
                raise TypeError(
                    f"ShardingSpec mesh_mapping entry {m!r} must be ShardedAxis(k) or Replicated(n); "
                    f"got mesh_mapping={mesh_mapping!r}."
                )
        sizes = self._sharded_axis_sizes(sharding)
        used = [m.axis for m in mesh_mapping if isinstance(m, ShardedAxis)]
        if sorted(used) != list(range(len(sizes))):
            raise ValueError(
                f"ShardingSpec mesh_mapping={mesh_mapping!r} must name each of the "
                f"{len(sizes)} sharded axes of sharding={sharding!r} (Chunked factors and Unstacked "
                f"entries, numbered 0..{len(sizes) - 1}) exactly once with ShardedAxis, but names "
                f"{used}; add or remove ShardedAxis entries."
            )
        self.sharding = sharding
        self.mesh_mapping = mesh_mapping

    @staticmethod
    def _sharded_axis_sizes(sharding) -> list[int]:
        sizes: list[int] = []
        for s in sharding:
            if isinstance(s, Unstacked):
                sizes.append(s.size)
            elif isinstance(s, Chunked):
                sizes.extend(s.chunks)
        return sizes

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The logical device-mesh shape: sharded-axis sizes and replica counts in mesh_mapping order."""
        sizes = self._sharded_axis_sizes(self.sharding)
        return tuple(sizes[m.axis] if isinstance(m, ShardedAxis) else m.replicas for m in self.mesh_mapping)

    @property
    def num_devices(self) -> int:
        return math.prod(self.mesh_shape)

    def __eq__(self, other):
        return (isinstance(other, ShardingSpec) and self.sharding == other.sharding
                and self.mesh_mapping == other.mesh_mapping)

    def __hash__(self):
        return hash((self.sharding, self.mesh_mapping))

    def __repr__(self):
        return f"ShardingSpec({self.sharding!r}, {self.mesh_mapping!r})"

    def _check_shape(self, shape) -> tuple[int, ...]:
        shape = tuple(int(d) for d in shape)
        if len(shape) != len(self.sharding):
            raise ValueError(
                f"shape={shape} has rank {len(shape)} but {self!r} describes rank "
                f"{len(self.sharding)}; give one sharding entry per array dimension."
            )
        for d, (n, s) in enumerate(zip(shape, self.sharding)):
            if isinstance(s, Unstacked) and n != s.size:
                raise ValueError(
                    f"dimension {d} of shape={shape} has size {n} but is Unstacked({s.size}); "
                    f"an unstacked dimension must have exactly as many entries as shards."
                )
            if isinstance(s, Chunked) and n % s.total:
                raise IndivisibleError(
                    f"dimension {d} of shape={shape} has size {n}, which Chunked({list(s.chunks)}) "
                    f"cannot cut into {s.total} equal pieces; use a size divisible by {s.total}."
                )
        return shape

    def block_index_grid(self, shape) -> np.ndarray:
        """int64 array of shape mesh_shape + (ndim,): per device, the block (or unstacked index) per dimension."""
        shape = self._check_shape(shape)
        mesh_shape = self.mesh_shape
        nd = len(mesh_shape)
        # coordinate of every device along the mesh dimension that enumerates sharded axis k
        axis_coord: dict[int, np.ndarray] = {}
        for m, assign in enumerate(self.mesh_mapping):
            if isinstance(assign, ShardedAxis):
                axis_coord[assign.axis] = np.arange(mesh_shape[m]).reshape([-1 if i == m else 1 for i in range(nd)])
        grid = np.zeros(mesh_shape + (len(shape),), dtype=np.int64)
        k = 0
        for d, s in enumerate(self.sharding):
            factors = (s.size,) if isinstance(s, Unstacked) else s.chunks if isinstance(s, Chunked) else ()
            block = np.zeros(mesh_shape, dtype=np.int64)
            for f in factors:  # major to minor
                block = block * f + axis_coord[k]
                k += 1
            grid[..., d] = block
        return grid

    def indices(self, shape) -> np.ndarray:
        """Object ndarray of `mesh_shape`: each device's index tuple into an array of `shape`.

        An int for an Unstacked dimension, `slice(start, stop)` for a Chunked one,
        `slice(None)` for NoSharding. As JAX did, a Chunked dimension of one piece
        reads `slice(None)` when the spec has no Unstacked entry (JAX took the
        HloSharding route there) and `slice(0, n)` otherwise.
        """
        shape = self._check_shape(shape)
        grid = self.block_index_grid(shape)
        has_unstacked = any(isinstance(s, Unstacked) for s in self.sharding)
        flat = grid.reshape(self.num_devices, len(shape)).tolist()
        out = np.empty(len(flat), dtype=object)
        for i, blocks in enumerate(flat):
            out[i] = tuple(_dim_index(s, b, n, has_unstacked) for s, b, n in zip(self.sharding, blocks, shape))
        return out.reshape(self.mesh_shape)


def _dim_index(s, block: int, n: int, has_unstacked: bool):
    if isinstance(s, Unstacked):
        return block
    if isinstance(s, Chunked) and (s.total > 1 or has_unstacked):
        size = n // s.total
        return slice(block * size, (block + 1) * size)
    return slice(None)


def spec_to_indices(shape: Sequence[int], spec: ShardingSpec) -> tuple:
    """Each device's index tuple, devices in row-major order of `spec.mesh_shape`.

    As `jax._src.sharding_specs.spec_to_indices`: an int for an Unstacked
    dimension, a slice for a Chunked one, `slice(None)` for NoSharding.
    """
    if not isinstance(spec, ShardingSpec):
        raise TypeError(f"spec must be a ShardingSpec, got {type(spec).__name__}: {spec!r}.")
    return tuple(spec.indices(shape).flat)


def pmap_sharding_spec(nrep: int, axis_size: int, sharded_shape: Sequence[int], map_axis: int | None) -> ShardingSpec:
    """The ShardingSpec jax.pmap used for an argument/result mapped at `map_axis` (None: broadcast).

    `sharded_shape` is the per-device shape; `nrep` the number of devices
    (axis_size times the replication from inner pmaps, which follows the mapped
    axis in the mesh). With `map_axis=None` the value is replicated `axis_size`
    times. Follows JAX's `sharding_specs.pmap_sharding_spec`.
    """
    if axis_size < 1 or nrep < 1 or nrep % axis_size:
        raise ValueError(
            f"pmap_sharding_spec: nrep={nrep} must be a positive multiple of axis_size={axis_size}."
        )
    rank = len(tuple(sharded_shape))
    replication = nrep // axis_size
    maybe_replicate = (Replicated(replication),) if replication > 1 else ()
    if map_axis is None:
        return ShardingSpec((NoSharding(),) * rank, (Replicated(axis_size),) + maybe_replicate)
    if not 0 <= map_axis <= rank:
        raise ValueError(
            f"pmap_sharding_spec: map_axis={map_axis} is out of range for a mapped value of rank "
            f"{rank + 1} (per-device shape {tuple(sharded_shape)}); use 0..{rank}."
        )
    sharding = (NoSharding(),) * map_axis + (Unstacked(axis_size),) + (NoSharding(),) * (rank - map_axis)
    return ShardingSpec(sharding, (ShardedAxis(0),) + maybe_replicate)


def _device_id_array(devices) -> np.ndarray:
    """An int64 array of device ids from ids or JAX devices (anything with `.id`), any shape."""
    arr = np.asarray(devices)
    if arr.dtype == object:
        arr = np.vectorize(lambda d: getattr(d, "id", d), otypes=[object])(arr) if arr.size else arr
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in arr.flat):
            raise TypeError(f"devices must hold int device ids or JAX devices, got {devices!r}.")
        arr = arr.astype(np.int64)
    elif arr.dtype.kind not in "iu":
        raise TypeError(f"devices must hold int device ids or JAX devices, got dtype {arr.dtype}: {devices!r}.")
    if arr.size and arr.min() < 0:
        raise ValueError(f"devices contains negative id {int(arr.min())}; device ids are >= 0.")
    return arr.astype(np.int64)


class PmapSharding:
    """`PmapSharding(devices, sharding_spec)`: the layout of a jax.pmap argument or result.

    `devices` is an array of device ids (or JAX devices) taken in flat order;
    device i holds `spec_to_indices(shape, sharding_spec)[i]`. As JAX's
    `jax.sharding.PmapSharding` (JAX < 0.8): an Unstacked dimension is absent
    from each shard's shape.
    """

    def __init__(self, devices, sharding_spec: ShardingSpec):
        if not isinstance(sharding_spec, ShardingSpec):
            raise TypeError(
                f"sharding_spec must be a refsim ShardingSpec, got {type(sharding_spec).__name__}; "
                "build one with ShardingSpec(sharding, mesh_mapping) or pmap_sharding_spec(...)."
            )
        ids = _device_id_array(devices)
        if ids.size != sharding_spec.num_devices:
            raise ValueError(
                f"PmapSharding got {ids.size} devices but {sharding_spec!r} lays the array out over "
                f"a mesh of shape {sharding_spec.mesh_shape} ({sharding_spec.num_devices} devices); "
                "pass one device per mesh position."
            )
        if np.unique(ids).size != ids.size:
            raise ValueError(f"PmapSharding devices {ids.ravel().tolist()} are not unique.")
        ids.setflags(write=False)
        self.devices = ids
        self.sharding_spec = sharding_spec

    @classmethod
    def default(cls, shape, sharded_dim: int | None = 0, devices=None) -> "PmapSharding":
        """The layout pmap gives an array of `shape` mapped along `sharded_dim` (None: replicated on `devices`)."""
        shape = tuple(int(d) for d in shape)
        if sharded_dim is None:
            if devices is None:
                raise ValueError("One of sharded_dim or devices must be set.")
            ids = _device_id_array(devices)
            return cls(ids, pmap_sharding_spec(ids.size, ids.size, shape, None))
        if not -len(shape) <= sharded_dim < len(shape):
            raise ValueError(
                f"sharded_dim={sharded_dim} is out of range for shape={shape}; use 0..{len(shape) - 1}."
            )
        sharded_dim %= len(shape)
        n = shape[sharded_dim]
        spec = pmap_sharding_spec(n, n, shape[:sharded_dim] + shape[sharded_dim + 1:], sharded_dim)
        return cls(np.arange(n) if devices is None else devices, spec)

    # -- identity ---------------------------------------------------------------
    def __eq__(self, other):
        return (isinstance(other, PmapSharding) and self.sharding_spec == other.sharding_spec
                and np.array_equal(self.devices, other.devices))

    def __hash__(self):
        return hash((self.sharding_spec, self.devices.tobytes(), self.devices.shape))

    def __repr__(self):
        return (f"PmapSharding(sharding_spec={self.sharding_spec!r}, device_ids={self.devices.ravel().tolist()}, "
                f"device_shape={self.devices.shape})")

    # -- Sharding interface -----------------------------------------------------
    @property
    def device_set(self) -> frozenset[int]:
        return frozenset(self.devices.ravel().tolist())

    @property
    def num_devices(self) -> int:
        return int(self.devices.size)

    @property
    def is_fully_replicated(self) -> bool:
        """True when every device holds the whole array: no Unstacked entry, no Chunked cut into >1 piece."""
        return all(isinstance(s, NoSharding) or isinstance(s, Chunked) and s.total == 1
                   for s in self.sharding_spec.sharding)

    def shard_shape(self, global_shape) -> tuple[int, ...]:
        """Each device's block shape: Unstacked dimensions removed, Chunked ones divided."""
        shape = tuple(int(d) for d in global_shape)
        spec = self.sharding_spec
        if len(shape) == len(spec.sharding):
            for d, s in enumerate(spec.sharding):
                if isinstance(s, Unstacked) and shape[d] != s.size:
                    raise ValueError(
                        f"The sharded dimension must be equal to the number of devices passed to "
                        f"PmapSharding. Got sharded dimension {d} with value {shape[d]} in shape "
                        f"{shape} and the number of devices={self.num_devices}"
                    )
        spec._check_shape(shape)
        out = []
        for n, s in zip(shape, spec.sharding):
            if isinstance(s, Chunked):
                out.append(n // s.total)
            elif isinstance(s, NoSharding):
                out.append(n)
        return tuple(out)

    def devices_indices_map(self, global_shape) -> dict[int, tuple]:
        """{device_id: index tuple}, devices in flat order; ints index Unstacked dimensions."""
        self.shard_shape(global_shape)
        return dict(zip(self.devices.ravel().tolist(), spec_to_indices(global_shape, self.sharding_spec)))

    def device_replica_id_map(self, global_shape=None) -> dict[int, int]:
        """{device_id: replica id}: the device's linear position over the Replicated mesh dimensions."""
        mesh_shape = self.sharding_spec.mesh_shape
        rid = np.zeros(mesh_shape, dtype=np.int64)
        for m, assign in enumerate(self.sharding_spec.mesh_mapping):
            if isinstance(assign, Replicated):
                pos = np.arange(mesh_shape[m]).reshape([-1 if i == m else 1 for i in range(len(mesh_shape))])
                rid = rid * mesh_shape[m] + pos
        return dict(zip(self.devices.ravel().tolist(), rid.ravel().tolist()))

    @property
    def _device_assignment(self) -> tuple[int, ...]:
        return tuple(self.devices.ravel().tolist())
