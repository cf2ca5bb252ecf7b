"""`NamedSharding`: an array laid out over a Mesh by a PartitionSpec.

Dimension i is cut into prod(sizes of spec[i]'s axes) equal blocks; the device
at mesh position p holds block number ``linear index of p over spec[i]'s axes
(major to minor)``. Devices that differ only along axes the spec does not use
hold the same block (replicas), numbered by their linear index over those axes.
This is `jax.sharding.NamedSharding`'s placement.
"""
from __future__ import annotations

import numpy as np

from refsim.errors import IndivisibleError
from refsim.layouts.mesh import AbstractMesh, Mesh
from refsim.layouts.partition_spec import PartitionSpec, UNCONSTRAINED, validate_spec


class NamedSharding:
    """`NamedSharding(mesh, spec)`: placement of an array over `mesh` by `spec`."""

    def __init__(self, mesh: AbstractMesh, spec: PartitionSpec | None = None, *, memory_kind: str | None = None):
        if not isinstance(mesh, AbstractMesh):
            raise TypeError(
                f"mesh must be a refsim Mesh or AbstractMesh, got {type(mesh).__name__}; "
                "convert a JAX mesh with refsim.Mesh.from_jax(mesh)."
            )
        if spec is None:
            spec = PartitionSpec()
        elif not isinstance(spec, PartitionSpec):
            if type(spec).__name__ == "PartitionSpec":  # a jax.sharding.PartitionSpec
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
        self.memory_kind = memory_kind

    # -- identity --------------------------------------------------------------
    def _key(self):
        return (self.mesh, self.spec, self.memory_kind)

    def __eq__(self, other):
        return isinstance(other, NamedSharding) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        mk = f", memory_kind={self.memory_kind}" if self.memory_kind else ""
        return f"NamedSharding(mesh={self.mesh!r}, spec={self.spec!r}{mk})"

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
        counts = self.num_shards(len(shape))
        for d, (n, c) in enumerate(zip(shape, counts)):
            if n % c:
                raise IndivisibleError(
                    f"Sharding {self!r} implies that array axis {d} is partitioned {c} times, but "
                    f"the dimension size is {n} (full shape: {shape}, per-dimension tiling "
                    f"factors: {list(counts)} should evenly divide the shape)"
                )
        return tuple(n // c for n, c in zip(shape, counts))

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
        for dev, blocks in zip(mesh.device_ids.ravel().tolist(), grid.tolist()):
            out[dev] = tuple(
                slice(None) if c == 1 else slice(b * n, (b + 1) * n)
                for b, n, c in zip(blocks, block, counts)
            )
        return out

    def device_replica_id_map(self, global_shape=None) -> dict[int, int]:
        """{device_id: replica id}: replicas of one block are numbered 0, 1, ... in mesh order."""
        mesh = self._concrete_mesh("device_replica_id_map")
        return dict(zip(mesh.device_ids.ravel().tolist(), self.replica_id_grid().ravel().tolist()))

    # -- conversions (defined in their own modules) ------------------------------
    def to_hlo(self, ndim: int):
        """The `refsim.HloSharding` of this sharding for an array of rank `ndim`."""
        from refsim.layouts.hlo_sharding import named_to_hlo

        return named_to_hlo(self, ndim)

    def to_shardy(self, ndim: int | None = None, *, mesh_name: str | None = "mesh", open_dims: bool = False,
                  modify_wrt_axis_types: bool = False) -> str:
        """Shardy's `#sdy.sharding<@mesh, [...]>` text for this sharding (see refsim.layouts.shardy)."""
        from refsim.layouts.shardy import named_to_shardy

        return named_to_shardy(self, ndim, mesh_name=mesh_name, open_dims=open_dims,
                               modify_wrt_axis_types=modify_wrt_axis_types)

    def with_spec(self, spec) -> "NamedSharding":
        return NamedSharding(self.mesh, spec, memory_kind=self.memory_kind)

    @property
    def has_unconstrained(self) -> bool:
        return any(p is UNCONSTRAINED for p in self.spec)
