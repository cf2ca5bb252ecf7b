"""`NamedSharding`: an array laid out over a Mesh by a PartitionSpec.

Dimension i is cut into prod(sizes of spec[i]'s axes) equal blocks; the device
at mesh position p holds block number ``linear index of p over spec[i]'s axes
(major to minor)``. Devices that differ only along axes the spec does not use
hold the same block (replicas), numbered by their linear index over those axes.
This is `jax.sharding.NamedSharding`'s placement.

Two details follow JAX exactly: the memory kind (`device`, `pinned_host`,
`unpinned_host`; `None` means the platform default `device` on a concrete mesh)
is part of equality and hashing, and `_logical_device_ids` permutes which device
of the mesh takes which mesh position (JAX builds the HLO tile assignment from
these ids, so device ``mesh.device_ids.flat[ids[k]]`` plays flat position k).
"""
from __future__ import annotations

import numpy as np

from refsim import compat
from refsim.layouts.tiling import block_shape
from refsim.layouts.mesh import AbstractMesh, Mesh
from refsim.layouts.partition_spec import PartitionSpec, UNCONSTRAINED, validate_spec


# The memory kinds each platform's devices report (`device.addressable_memories()`); the
# default memory of every platform is `device`. refsim models the CPU platform's set unless
# told otherwise with `set_platform`.
PLATFORM_MEMORY_KINDS = {
    "cpu": ("device", "pinned_host", "unpinned_host"),
    "cuda": ("device", "pinned_host", "unpinned_host"),
    "rocm": ("device", "pinned_host"),
    "tpu": ("device", "pinned_host", "unpinned_host"),
}
DEFAULT_MEMORY_KIND = "device"
_platform = ["cpu"]


def set_platform(platform: str) -> str:
    """Make refsim validate memory kinds as `platform` does; returns the previous platform."""
    if platform not in PLATFORM_MEMORY_KINDS:
        raise ValueError(
            f"platform={platform!r} is not one refsim knows the memory kinds of; use one of "
            f"{sorted(PLATFORM_MEMORY_KINDS)}."
        )
    old, _platform[0] = _platform[0], platform
    return old


def memory_kinds(platform: str | None = None) -> tuple[str, ...]:
    """The memory kinds devices of `platform` (default: refsim's current platform) can address."""
    return PLATFORM_MEMORY_KINDS[platform or _platform[0]]


def _check_memory_kind(kind, concrete: bool):
    """JAX's memory-kind check: ValueError naming the valid kinds; None -> the default on a Mesh."""
    if kind is None:
        return DEFAULT_MEMORY_KIND if concrete else None
    if not isinstance(kind, str):  # JAX's C++ constructor fails with std::bad_cast here
        raise TypeError(
            f"memory_kind must be a str such as 'pinned_host', got {kind!r} of type {type(kind).__name__}."
        )
    kinds = memory_kinds()
    if kind not in kinds:
        if concrete:
            raise ValueError(
                f"Could not find memory addressable by device {_platform[0]}. Device {_platform[0]} can "
                f"address the following memory kinds: {', '.join(kinds)}. Got memory kind: {kind}"
            )
        raise ValueError(
            f"Got invalid memory kind: {kind}. Valid memory kinds are: {', '.join(kinds)}"
        )
    return kind


def _check_logical_ids(ids, mesh) -> tuple[int, ...] | None:
    """`_logical_device_ids` as a tuple: a permutation of the mesh's flat positions 0..n-1."""
    if ids is None:
        return None
    try:
        out = tuple(int(i) for i in np.asarray(ids).ravel())
    except (TypeError, ValueError):
        raise TypeError(
            f"_logical_device_ids must be a sequence of ints, got {ids!r}."
        ) from None
    n = mesh.size
    if len(out) != n:  # JAX fails reshaping them to the mesh shape
        raise ValueError(
            f"_logical_device_ids={out!r} has {len(out)} entries but the mesh has {n} devices; "
            f"give a permutation of 0..{n - 1}."
        )
    bad = [i for i in out if not 0 <= i < n]
    if bad:
        raise IndexError(
            f"_logical_device_ids={out!r} contains {bad[0]}, outside 0..{n - 1}: the ids are positions "
            "in the mesh's flat device list, not device ids."
        )
    if len(set(out)) != n:
        # JAX accepts duplicates and then leaves some devices without a shard; refsim refuses.
        dup = next(i for i in out if out.count(i) > 1)
        raise ValueError(
            f"_logical_device_ids={out!r} names position {dup} more than once; give a permutation "
            f"of 0..{n - 1} so that every device holds one block."
        )
    return out


class NamedSharding:
    """`NamedSharding(mesh, spec)`: placement of an array over `mesh` by `spec`."""

    def __init__(self, mesh: AbstractMesh, spec: PartitionSpec | None = None, *, memory_kind: str | None = None,
                 _logical_device_ids=None):
        if not isinstance(mesh, AbstractMesh):
            raise TypeError(
                f"mesh must be a refsim Mesh or AbstractMesh, got {type(mesh).__name__}; "
                "convert a JAX mesh with refsim.Mesh.from_jax(mesh)."
            )
        if spec is None:
            spec = PartitionSpec()
        elif not isinstance(spec, PartitionSpec):
            if compat.is_jax_partition_spec(spec):
                spec = PartitionSpec.from_jax(spec)
            elif isinstance(spec, tuple):
                spec = PartitionSpec(*spec)
            else:
                raise TypeError(
                    f"spec must be a PartitionSpec, got {spec!r}; write P('x', None) for example."
                )
        validate_spec(spec, mesh)
        self.mesh = mesh
        self.spec = spec
        self._memory_kind = _check_memory_kind(memory_kind, isinstance(mesh, Mesh))
        self._logical_device_ids = _check_logical_ids(_logical_device_ids, mesh)

    @property
    def memory_kind(self) -> str | None:
        """The memory the shards live in; `device` by default on a concrete mesh, as JAX reports."""
        return self._memory_kind

    @property
    def logical_device_ids(self) -> tuple[int, ...] | None:
        """JAX's `_logical_device_ids`: the mesh position each flat tile slot is taken from."""
        return self._logical_device_ids

    @property
    def placement_ids(self) -> np.ndarray:
        """int64 array of the mesh shape: the device that plays each mesh position.

        Equals `mesh.device_ids` unless `_logical_device_ids` permutes it, in which case
        position with flat index k is played by device `mesh.device_ids.flat[ids[k]]`.
        """
        ids = self._concrete_mesh("placement_ids").device_ids
        if self._logical_device_ids is None:
            return ids
        out = ids.ravel()[list(self._logical_device_ids)].reshape(ids.shape)
        out.setflags(write=False)
        return out

    def with_memory_kind(self, kind: str) -> "NamedSharding":
        """The same sharding in memory `kind` (`jax.sharding.NamedSharding.with_memory_kind`)."""
        return self.update(memory_kind=kind)

    def update(self, **kwargs) -> "NamedSharding":
        """A copy with any of `mesh`, `spec`, `memory_kind`, `_logical_device_ids` replaced, as JAX's."""
        unknown = set(kwargs) - {"mesh", "spec", "memory_kind", "_logical_device_ids"}
        if unknown:
            raise TypeError(
                f"NamedSharding.update got unexpected keyword(s) {sorted(unknown)}; it takes mesh, spec, "
                "memory_kind and _logical_device_ids."
            )
        spec = kwargs.get("spec", self.spec)
        if not isinstance(spec, PartitionSpec) and type(spec).__name__ != "PartitionSpec":
            spec = PartitionSpec(*spec)
        mesh = kwargs.get("mesh", self.mesh)
        kind = kwargs.get("memory_kind", self._memory_kind)
        if "memory_kind" not in kwargs and not isinstance(mesh, Mesh) and kind == DEFAULT_MEMORY_KIND:
            kind = None  # the default kind was filled in by the old concrete mesh
        return NamedSharding(mesh, spec, memory_kind=kind,
                             _logical_device_ids=kwargs.get("_logical_device_ids", self._logical_device_ids))

    # -- identity --------------------------------------------------------------
    def _key(self):
        return (self.mesh, self.spec, self._memory_kind, self._logical_device_ids)

    def __eq__(self, other):
        return isinstance(other, NamedSharding) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        # The default kind is left out so the common case reads as it always did.
        mk = f", memory_kind={self._memory_kind}" if self._memory_kind not in (None, DEFAULT_MEMORY_KIND) else ""
        ldi = "" if self._logical_device_ids is None else f", logical_device_ids={self._logical_device_ids}"
        return f"NamedSharding(mesh={self.mesh!r}, spec={self.spec!r}{mk}{ldi})"

    def __reduce__(self):
        return (_rebuild, (self.mesh, self.spec, self._memory_kind, self._logical_device_ids))

    # -- basic facts -------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return self.mesh.size

    @property
    def device_set(self) -> frozenset[int]:
        return self._concrete_mesh("device_set").device_set

    @property
    def is_fully_replicated(self) -> bool:
        """True when every device holds the whole array (no dimension cut, nothing unreduced)."""
        if self.mesh.size == 1:
            return True
        if self.spec.unreduced:  # JAX: any unreduced axis means partial sums, even a size-1 one
            return False
        return all(self.mesh.axis_size(a) == 1 for a in self.spec.used_axes())

    def _concrete_mesh(self, what: str) -> Mesh:
        if not isinstance(self.mesh, Mesh):
            raise ValueError(
                f"{what} needs device ids, but this NamedSharding is over an AbstractMesh "
                f"{self.mesh!r}; build it over a refsim.Mesh."
            )
        return self.mesh

    def _check_rank(self, shape) -> tuple[int, ...]:
        shape = tuple(int(d) for d in shape)
        if len(self.spec) > len(shape):
            raise ValueError(
                f"Sharding {self!r} is only valid for values of rank at least {len(self.spec)}, "
                f"but was applied to a value of rank {len(shape)}. Drop trailing spec entries or "
                "pass an array of higher rank."
            )
        return shape

    def num_shards(self, ndim: int) -> tuple[int, ...]:
        """How many blocks each of `ndim` array dimensions is cut into."""
        return tuple(
            int(np.prod([self.mesh.axis_size(a) for a in self.spec.axes_of(d)], dtype=np.int64))
            for d in range(ndim)
        )

    def shard_shape(self, global_shape) -> tuple[int, ...]:
        """The shape of each device's block; IndivisibleError if a cut is uneven."""
        shape = self._check_rank(global_shape)
        return block_shape(lambda: f"Sharding {self!r}", shape, self.num_shards(len(shape)))

    # -- vectorised placement -------------------------------------------------------
    def block_index_grid(self, ndim: int) -> np.ndarray:
        """int64 array of shape mesh_shape + (ndim,): the block each device holds per dimension."""
        mesh_shape = self.mesh.axis_sizes
        grid = np.zeros(mesh_shape + (ndim,), dtype=np.int64)
        for d in range(ndim):
            idx = np.zeros(mesh_shape, dtype=np.int64)
            for a in self.spec.axes_of(d):
                k = self.mesh.axis_index(a)
                pos = np.arange(mesh_shape[k]).reshape([-1 if i == k else 1 for i in range(len(mesh_shape))])
                idx = idx * mesh_shape[k] + pos
            grid[..., d] = idx
        return grid

    def replica_id_grid(self) -> np.ndarray:
        """int64 array of mesh shape: each device's linear index over the axes the spec leaves unused."""
        used = set(self.spec.used_axes())
        sizes = self.mesh.axis_sizes
        rid = np.zeros(sizes, dtype=np.int64)
        for k, (name, size) in enumerate(zip(self.mesh.axis_names, sizes)):
            if name not in used:
                rid = rid * size + np.arange(size).reshape([-1 if i == k else 1 for i in range(len(sizes))])
        return rid

    def devices_indices_map(self, global_shape) -> dict[int, tuple]:
        """{device_id: tuple of slices} as `jax.sharding.NamedSharding.devices_indices_map`.

        Unsharded dimensions get `slice(None)`; sharded ones `slice(start, stop)`.
        """
        mesh = self._concrete_mesh("devices_indices_map")
        shape = self._check_rank(global_shape)
        block = self.shard_shape(shape)
        counts = self.num_shards(len(shape))
        grid = self.block_index_grid(len(shape)).reshape(mesh.size, len(shape))
        out = {}
        for dev, blocks in zip(self.placement_ids.ravel().tolist(), grid.tolist()):
            out[dev] = tuple(
                slice(None) if c == 1 else slice(b * n, (b + 1) * n)
                for b, n, c in zip(blocks, block, counts)
            )
        return out

    def device_replica_id_map(self, global_shape=None) -> dict[int, int]:
        """{device_id: replica id}: replicas of one block are numbered 0, 1, ... in mesh order."""
        self._concrete_mesh("device_replica_id_map")
        return dict(zip(self.placement_ids.ravel().tolist(), self.replica_id_grid().ravel().tolist()))

    # -- conversions (defined in their own modules) ------------------------------
    def to_hlo(self, ndim: int):
        """The `refsim.HloSharding` of this sharding for an array of rank `ndim`."""
        from refsim.layouts.hlo_sharding import HloSharding, TileAssignment, named_to_hlo

        hlo = named_to_hlo(self, ndim)
        if self._logical_device_ids is None:
            return hlo
        # JAX: the tile assignment is the logical ids put through the iota's reshape/transpose,
        # i.e. each tile slot holding position p now holds logical_ids[p].
        ids = np.asarray(self._logical_device_ids, dtype=np.int64)
        if hlo.kind == "replicated":
            ta, types = TileAssignment.from_array(ids.reshape([1] * ndim + [-1])), ("replicated",)
        elif hlo.kind != "tiled":
            return hlo
        else:
            ta = TileAssignment.from_array(ids[hlo.tile_assignment.array()])
            types = ("replicated",) if hlo.replicate_on_last_tile_dim else hlo.subgroup_types
        return HloSharding.subgroup(ta, types)

    def to_shardy(self, ndim: int | None = None, *, mesh_name: str | None = "mesh", open_dims: bool = False,
                  modify_wrt_axis_types: bool = False) -> str:
        """Shardy's `#sdy.sharding<@mesh, [...]>` text for this sharding (see refsim.layouts.shardy)."""
        from refsim.layouts.shardy import named_to_shardy

        return named_to_shardy(self, ndim, mesh_name=mesh_name, open_dims=open_dims,
                               modify_wrt_axis_types=modify_wrt_axis_types)

    def with_spec(self, spec) -> "NamedSharding":
        return NamedSharding(self.mesh, spec, memory_kind=self._memory_kind,
                             _logical_device_ids=self._logical_device_ids)

    @property
    def has_unconstrained(self) -> bool:
        return any(p is UNCONSTRAINED for p in self.spec)


def _rebuild(mesh, spec, memory_kind, logical_device_ids):
    return NamedSharding(mesh, spec, memory_kind=memory_kind, _logical_device_ids=logical_device_ids)
