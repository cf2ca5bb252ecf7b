"""`MpmdArray`: one logical array held by some MPMD groups of an MpmdMesh (jaxpp's MpmdArray).

Each holding group keeps the whole array as an ordinary array on its group mesh; the
groups hold replicas. A process sees only its own group's array, so an MpmdArray is
"partially addressable". `MpmdArrayBase` holds the backend-free rules (validation,
addressability, all-or-nothing deletion); refsim's `MpmdArray` holds refsim.Arrays and
xla_backend's holds jax.Arrays.
"""
from __future__ import annotations

import numpy as np

from refsim.array import Array
from refsim.layouts.named_sharding import NamedSharding
from refsim.mpmd.mesh import MpmdSharding, as_spec, canonical_spec


class MpmdArrayBase:
    """Backend-free part of an MpmdArray; subclasses say how to read, delete and wait on one array."""

    _array_type: type = object
    _array_type_name = "array"
    _sharding_type: type = object

    # -- backend hooks ----------------------------------------------------------------------
    def _mesh_of(self, arr):
        return arr.sharding.mesh

    def _spec_of(self, arr):
        return as_spec(arr.sharding.spec)

    def _delete_one(self, arr) -> None:
        raise TypeError("an MpmdArray backend must say how to delete one array")

    def _is_deleted_one(self, arr) -> bool:
        return False

    def _block_one(self, arr) -> None:
        return None

    # -- construction -------------------------------------------------------------------------
    def __init__(self, partially_addressable_arrays, mpmd_sharding, shape=None, dtype=None):
        if not isinstance(mpmd_sharding, self._sharding_type):
            raise TypeError(
                f"mpmd_sharding must be a {self._sharding_type.__name__}, got {type(mpmd_sharding).__name__}: "
                f"{mpmd_sharding!r}."
            )
        if not isinstance(partially_addressable_arrays, (list, tuple)):
            raise TypeError(
                "partially_addressable_arrays must be a list of arrays (one per group held here), got "
                f"{type(partially_addressable_arrays).__name__}."
            )
        if mpmd_sharding.is_unused:
            raise ValueError(
                "mpmd_sharding has empty mesh_ids: an MpmdArray must live in at least one group; "
                "spmd_to_mpmd_reshard places unused arrays on group 0."
            )
        mpmd_mesh = mpmd_sharding.mpmd_mesh
        by_group: dict[int, object] = {}
        where: dict[int, int] = {}
        for i, arr in enumerate(partially_addressable_arrays):
            if not isinstance(arr, self._array_type):
                raise TypeError(
                    f"partially_addressable_arrays[{i}] must be a {self._array_type_name}, got "
                    f"{type(arr).__name__}: {arr!r}."
                )
            if not isinstance(arr.sharding, self._sharding_type_of_arrays()):
                raise ValueError(
                    f"partially_addressable_arrays[{i}] has sharding {arr.sharding!r}; an MPMD group's array "
                    "must have a NamedSharding over its group mesh (mpmd_mesh.unstack[k])."
                )
            k = mpmd_mesh.mpmd_idx_of_mesh(self._mesh_of(arr), what=f"partially_addressable_arrays[{i}]")
            if k not in mpmd_sharding.mesh_ids:
                raise ValueError(
                    f"partially_addressable_arrays[{i}] is on group {k}, which is not in mesh_ids="
                    f"{sorted(mpmd_sharding.mesh_ids)}; put it on one of those groups or add {k} to mesh_ids."
                )
            if k in by_group:
                raise ValueError(
                    f"partially_addressable_arrays[{where[k]}] and [{i}] are both on group {k}; "
                    "give each group's array once."
                )
            by_group[k], where[k] = arr, i
        arrays = [by_group[k] for k in sorted(by_group)]
        if not arrays and (shape is None or dtype is None):
            raise ValueError(
                "If the MpmdArray holds no group's array here, `shape` and `dtype` must be provided "
                "(this process's group does not hold the array)."
            )
        shape = tuple(int(d) for d in (shape if shape is not None else arrays[0].shape))
        dtype = np.dtype(dtype if dtype is not None else arrays[0].dtype)
        target = canonical_spec(mpmd_sharding.spec, mpmd_mesh.mesh, {mpmd_mesh.mpmd_axis_name})
        for k in sorted(by_group):
            arr, i = by_group[k], where[k]
            if tuple(arr.shape) != shape or np.dtype(arr.dtype) != dtype:
                raise ValueError(
                    f"partially_addressable_arrays[{i}] (group {k}) is {np.dtype(arr.dtype)}{list(arr.shape)} but "
                    f"the MpmdArray is {dtype}{list(shape)}; every group must hold the same shape and dtype."
                )
            got = canonical_spec(self._spec_of(arr), mpmd_mesh.mesh, {mpmd_mesh.mpmd_axis_name})
            if got != target:
                raise ValueError(
                    f"partially_addressable_arrays[{i}] (group {k}) is laid out by {self._spec_of(arr)!r}, but "
                    f"mpmd_sharding.spec is {mpmd_sharding.spec!r} (compared with the MPMD axis "
                    f"{mpmd_mesh.mpmd_axis_name!r} and size-1 axes dropped); reshard it to the sharding's spec."
                )
        self._mpmd_sharding = mpmd_sharding
        self._mpmd_idxs = tuple(sorted(mpmd_sharding.mesh_ids))
        self._arrays = dict(zip(sorted(by_group), arrays))
        self._shape, self._dtype = shape, dtype
        self._deleted = False

    def _sharding_type_of_arrays(self):
        return NamedSharding

    # -- facts -----------------------------------------------------------------------------------
    shape = property(lambda self: self._shape)
    dtype = property(lambda self: self._dtype)
    ndim = property(lambda self: len(self._shape))
    size = property(lambda self: int(np.prod(self._shape, dtype=np.int64)))
    mpmd_sharding = property(lambda self: self._mpmd_sharding)
    mpmd_mesh = property(lambda self: self._mpmd_sharding.mpmd_mesh)
    spec = property(lambda self: self._mpmd_sharding.spec)

    @property
    def sharding(self):
        """The sharding over the submesh of all groups holding the array (not one group's sharding)."""
        return self._mpmd_sharding.sharding

    @property
    def mpmd_idxs(self) -> tuple[int, ...]:
        """The groups holding the array, ascending."""
        return self._mpmd_idxs

    @property
    def addressable_mpmd_idxs(self) -> tuple[int, ...]:
        """The groups whose array this process holds."""
        return tuple(self._arrays)

    @property
    def is_mpmd_replicated(self) -> bool:
        """True when more than one group holds the array."""
        return len(self._mpmd_idxs) > 1

    @property
    def is_partially_addressable(self) -> bool:
        """True when this process holds the array of at least one of its groups."""
        return bool(self._arrays)

    # -- access ------------------------------------------------------------------------------------
    def _check_live(self, what: str) -> None:
        if self.is_deleted():
            raise RuntimeError(f"{what}: this MpmdArray {self!r} has been deleted.")

    @property
    def to_mpmd_local_array(self):
        """This process's array: one array, a list (one per group, single-controller), or None if none held."""
        if not self._arrays:
            return None
        self._check_live("to_mpmd_local_array")
        arrs = list(self._arrays.values())
        return arrs[0] if len(arrs) == 1 else arrs

    @property
    def first_mpmd_replica(self):
        """The array of the lowest holding group `mpmd_idxs[0]` if held here, else None."""
        if not self._arrays:
            return None
        self._check_live("first_mpmd_replica")
        return self._arrays.get(self._mpmd_idxs[0])

    def group_array(self, mpmd_idx: int):
        """The array held by group `mpmd_idx`; ValueError if that group does not hold it here."""
        if mpmd_idx not in self._mpmd_idxs:
            raise ValueError(
                f"MPMD group {mpmd_idx} does not hold this array; it lives in groups {list(self._mpmd_idxs)}. "
                "Read it from one of those groups, or reshard it there first."
            )
        if mpmd_idx not in self._arrays:
            raise ValueError(
                f"MPMD group {mpmd_idx} holds this array, but not in this process (it holds groups "
                f"{list(self._arrays)}); read it on a process of group {mpmd_idx}."
            )
        self._check_live(f"group_array({mpmd_idx})")
        return self._arrays[mpmd_idx]

    # -- lifetime ------------------------------------------------------------------------------------
    def is_deleted(self) -> bool:
        """Whether the array was deleted; RuntimeError if only some groups' arrays were deleted."""
        if self._deleted:
            return True
        states = {k: self._is_deleted_one(a) for k, a in self._arrays.items()}
        if any(states.values()) and not all(states.values()):
            gone = [k for k, s in states.items() if s]
            raise RuntimeError(
                f"the arrays of groups {gone} of this MpmdArray were deleted but those of groups "
                f"{[k for k, s in states.items() if not s]} were not; delete MpmdArrays only as a whole "
                "(MpmdArray.delete)."
            )
        return bool(states) and all(states.values())

    def delete(self) -> None:
        """Delete every held group's array, or none: the state of all is checked first.

        Deleting twice is a no-op, as for jax.Array; an array not held here cannot be deleted.
        """
        if not self._arrays:
            raise ValueError(
                f"this process holds none of the array's groups {list(self._mpmd_idxs)}, so it has nothing "
                "to delete; call delete on a process of one of those groups."
            )
        if self.is_deleted():  # raises, deleting nothing, when only some are deleted
            return
        for arr in self._arrays.values():
            self._delete_one(arr)
        self._deleted = True

    def block_until_ready(self):
        """Wait for every held group's array; returns self."""
        self._check_live("block_until_ready")
        for arr in self._arrays.values():
            self._block_one(arr)
        return self

    def __repr__(self):
        return (f"{type(self).__name__}(shape={self._shape}, dtype={self._dtype}, mpmd_idxs={self._mpmd_idxs}, "
                f"spec={self.spec!r})")


class MpmdArray(MpmdArrayBase):
    """An MpmdArray of refsim.Arrays: `MpmdArray(arrays, mpmd_sharding, shape=None, dtype=None)`.

    `arrays` holds refsim.Arrays on group meshes `mpmd_mesh.unstack[k]`, k in mesh_ids, no
    group twice, all of one shape and dtype and laid out by the sharding's spec (ValueError
    otherwise, as jaxpp asserts). refsim.Arrays own no device memory: `delete` drops the
    MpmdArray's references, and using it afterwards raises RuntimeError as a deleted jax.Array.
    """

    _array_type = Array
    _array_type_name = "refsim.Array"
    _sharding_type = MpmdSharding

    def _delete_one(self, arr) -> None:
        pass  # the references are dropped below

    def delete(self) -> None:
        super().delete()
        self._arrays = {k: None for k in self._arrays}

    def _check_live(self, what: str) -> None:
        if self._deleted:
            raise RuntimeError(f"{what}: this MpmdArray {self!r} has been deleted.")
