"""`MpmdMesh` and `MpmdSharding`: a mesh split along one axis into MPMD groups (jaxpp's layouts).

An MpmdMesh designates one axis of a Mesh as the MPMD axis; the slice of the mesh at
position k along it is MPMD group k, which runs its own program (a pipeline stage).
Each group's mesh keeps every axis name, the MPMD axis at size 1. An `MpmdSharding`
places an array in a set of groups (`mesh_ids`), laid out inside each group by a
PartitionSpec that never names the MPMD axis: across its groups the array is replicated.
"""
from __future__ import annotations

import functools
from typing import Iterable

import numpy as np

from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec, validate_spec


def as_spec(spec, what: str = "spec") -> PartitionSpec:
    """A refsim PartitionSpec from a refsim/JAX PartitionSpec, a tuple, or None (= P())."""
    if spec is None:
        return PartitionSpec()
    if isinstance(spec, PartitionSpec):
        return spec
    if type(spec).__module__.startswith("jax"):  # jax.sharding.PartitionSpec (named `P` in some versions)
        return PartitionSpec.from_jax(spec)
    if isinstance(spec, tuple):
        return PartitionSpec(*spec)
    raise TypeError(f"{what} must be a PartitionSpec, got {spec!r} of type {type(spec).__name__}; write P('x', None).")


def filter_axes(spec, axes: Iterable[str]) -> PartitionSpec:
    """`spec` with the mesh axes `axes` removed from every entry and from unreduced/reduced.

    An entry left with no axis becomes None; a tuple left with one axis becomes that axis.
    """
    drop = set(axes)
    spec = as_spec(spec)
    parts = []
    for entry in spec:
        if isinstance(entry, tuple):
            kept = tuple(a for a in entry if a not in drop)
            parts.append(kept if len(kept) > 1 else (kept[0] if kept else None))
        else:
            parts.append(None if entry in drop else entry)
    return PartitionSpec(*parts, unreduced=spec.unreduced - drop, reduced=spec.reduced - drop)


def canonical_spec(spec, mesh, drop: Iterable[str] = ()) -> tuple:
    """Placement-equivalence key: entries as tuples of axes of size > 1, `drop` removed, trailing empties cut."""
    spec = filter_axes(spec, drop)
    entries = [tuple(a for a in spec.axes_of(d) if mesh.axis_size(a) > 1) for d in range(len(spec))]
    while entries and not entries[-1]:
        entries.pop()
    return tuple(entries)


class MpmdMesh:
    """`MpmdMesh(mesh, mpmd_axis_name)`: `mesh` split along `mpmd_axis_name` into `mpmd_dim` groups.

    As jaxpp's `MpmdMesh`: group k is `mesh` sliced at position k of the MPMD axis
    (`unstack[k]`, all axis names kept, the MPMD axis at size 1); `device_mpmd_idx`
    maps each device id to its group. refsim has no processes: a process's own group
    is `mpmd_idx_of_devices(its device ids)`.
    """

    def __init__(self, mesh: Mesh, mpmd_axis_name: str):
        if not isinstance(mesh, Mesh):
            raise TypeError(
                f"mesh must be a refsim.Mesh with device ids, got {type(mesh).__name__}: {mesh!r}; "
                "convert a JAX mesh with refsim.Mesh.from_jax(mesh)."
            )
        if not isinstance(mpmd_axis_name, str) or mpmd_axis_name not in mesh.axis_names:
            raise ValueError(
                f"mpmd_axis_name={mpmd_axis_name!r} is not an axis of the mesh (axes {mesh.axis_names!r}); "
                "name the mesh axis that enumerates the pipeline stages."
            )
        self.mesh = mesh
        self.mpmd_axis_name = mpmd_axis_name
        self.mpmd_axis = mesh.axis_names.index(mpmd_axis_name)
        self.mpmd_dim = mesh.axis_sizes[self.mpmd_axis]

    # -- groups ------------------------------------------------------------------------
    @functools.cached_property
    def unstack(self) -> tuple[Mesh, ...]:
        """The mesh of each group, in group order: the MPMD axis kept at size 1."""
        return tuple(self._take([k]) for k in range(self.mpmd_dim))

    def _take(self, groups: list[int]) -> Mesh:
        ids = np.take(self.mesh.device_ids, groups, axis=self.mpmd_axis)
        return Mesh(ids.shape, self.mesh.axis_names, device_ids=ids, axis_types=self.mesh.axis_types)

    @functools.cached_property
    def mpmd_idx_for_mesh(self) -> dict:
        """{group mesh: group index}."""
        return {m: k for k, m in enumerate(self.unstack)}

    @functools.cached_property
    def device_mpmd_idx(self) -> dict[int, int]:
        """{device id: index of the group holding it}."""
        groups = np.indices(self.mesh.axis_sizes)[self.mpmd_axis]
        return dict(zip(self.mesh.device_ids.ravel().tolist(), groups.ravel().tolist()))

    def check_mpmd_idxs(self, mpmd_indices, what: str = "mpmd_indices") -> tuple[int, ...]:
        """`mpmd_indices` as a tuple of ints, each a group of this mesh and none given twice."""
        if isinstance(mpmd_indices, (str, bytes)) or not isinstance(mpmd_indices, Iterable):
            raise TypeError(f"{what} must be a collection of group indices, got {mpmd_indices!r}.")
        idxs = list(mpmd_indices)
        for k in idxs:
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
                raise TypeError(f"{what}={idxs!r} contains {k!r}; group indices are ints in [0, {self.mpmd_dim}).")
            if not 0 <= k < self.mpmd_dim:
                raise ValueError(
                    f"{what}={idxs!r} contains group {k}, but the MPMD axis {self.mpmd_axis_name!r} has "
                    f"{self.mpmd_dim} groups (0..{self.mpmd_dim - 1})."
                )
        dupes = sorted({int(k) for k in idxs if idxs.count(k) > 1})
        if dupes:
            raise ValueError(f"{what}={idxs!r} gives group {dupes[0]} twice; name each group once.")
        return tuple(int(k) for k in idxs)

    def mpmd_submesh(self, mpmd_indices) -> "MpmdMesh":
        """The MpmdMesh of groups `mpmd_indices` (in the order given) along the MPMD axis."""
        idxs = self.check_mpmd_idxs(mpmd_indices)
        if not idxs:
            raise ValueError("mpmd_submesh needs at least one group index, got none.")
        return MpmdMesh(self._take(list(idxs)), self.mpmd_axis_name)

    def mpmd_idx_of_mesh(self, mesh, what: str = "array") -> int:
        """The group whose mesh is `mesh`; ValueError for any other (foreign) mesh."""
        k = self.mpmd_idx_for_mesh.get(mesh)
        if k is None:
            raise ValueError(
                f"{what} is on mesh {mesh!r}, which is not a group mesh of this MpmdMesh (groups: "
                f"{list(self.unstack)!r}); put it on mpmd_mesh.unstack[k] for its group k."
            )
        return k

    def mpmd_idx_of_devices(self, device_ids) -> int:
        """The one group holding all `device_ids` (a process's own group); ValueError if they span groups."""
        ids = [int(d) for d in device_ids]
        unknown = sorted(set(ids) - set(self.device_mpmd_idx))
        if unknown:
            raise ValueError(f"devices {unknown} are not in this MpmdMesh (devices {sorted(self.device_mpmd_idx)}).")
        groups = sorted({self.device_mpmd_idx[d] for d in ids})
        if len(groups) != 1:
            raise ValueError(
                f"devices {ids} lie in MPMD groups {groups}; each process must hold devices of exactly one "
                f"group. Arrange the mesh so that axis {self.mpmd_axis_name!r} splits the devices by process."
            )
        return groups[0]

    # -- identity ----------------------------------------------------------------------------
    def __eq__(self, other):
        return type(other) is type(self) and (self.mesh, self.mpmd_axis_name) == (other.mesh, other.mpmd_axis_name)

    def __hash__(self):
        return hash((self.mesh, self.mpmd_axis_name))

    def __repr__(self):
        return f"MpmdMesh({self.mesh!r}, mpmd_axis_name={self.mpmd_axis_name!r})"


class MpmdSharding:
    """`MpmdSharding(mpmd_mesh, mesh_ids, spec)`: an array in groups `mesh_ids`, laid out by `spec` in each.

    As jaxpp's `MpmdSharding`, with the MPMD axis removed from `spec` (an array is whole in
    each of its groups). `.sharding` is the NamedSharding over the submesh of `mesh_ids`
    (sorted); empty `mesh_ids` marks an unused array, which has no `.sharding`.
    """

    def __init__(self, mpmd_mesh: MpmdMesh, mesh_ids, spec=None, *, memory_kind: str | None = None):
        if not isinstance(mpmd_mesh, MpmdMesh):
            raise TypeError(f"mpmd_mesh must be a refsim MpmdMesh, got {type(mpmd_mesh).__name__}: {mpmd_mesh!r}.")
        self.mpmd_mesh = mpmd_mesh
        self.mesh_ids = frozenset(mpmd_mesh.check_mpmd_idxs(mesh_ids, "mesh_ids"))
        spec = filter_axes(as_spec(spec), {mpmd_mesh.mpmd_axis_name})
        validate_spec(spec, mpmd_mesh.mesh, what="MpmdSharding")
        self.spec = spec
        self.memory_kind = memory_kind

    @property
    def is_unused(self) -> bool:
        return not self.mesh_ids

    @property
    def sharding(self) -> NamedSharding:
        """NamedSharding(submesh of sorted mesh_ids, spec): the array replicated over its groups."""
        if self.is_unused:
            raise ValueError(
                "this MpmdSharding has empty mesh_ids (an unused array), so it has no sharding; "
                "give it a group, e.g. MpmdSharding(mpmd_mesh, {0}, spec)."
            )
        return NamedSharding(self.mpmd_mesh.mpmd_submesh(sorted(self.mesh_ids)).mesh, self.spec,
                             memory_kind=self.memory_kind)

    def group_sharding(self, k: int) -> NamedSharding:
        """The layout inside group `k`: NamedSharding(mpmd_mesh.unstack[k], spec)."""
        return NamedSharding(self.mpmd_mesh.unstack[k], self.spec, memory_kind=self.memory_kind)

    def with_mesh_ids(self, mesh_ids) -> "MpmdSharding":
        return MpmdSharding(self.mpmd_mesh, mesh_ids, self.spec, memory_kind=self.memory_kind)

    def __eq__(self, other):
        return (isinstance(other, MpmdSharding) and self.mpmd_mesh == other.mpmd_mesh
                and self.mesh_ids == other.mesh_ids and self.spec == other.spec
                and self.memory_kind == other.memory_kind)

    def __hash__(self):
        return hash((self.mpmd_mesh, self.mesh_ids, self.spec, self.memory_kind))

    def __repr__(self):
        return f"MpmdSharding(mesh_ids={sorted(self.mesh_ids)}, spec={self.spec!r}, mpmd_mesh={self.mpmd_mesh!r})"
