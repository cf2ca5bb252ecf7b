"""MPMD pipeline layouts on real devices: `refsim.mpmd`'s names over jax.Arrays (NVIDIA jaxpp's semantics).

`MpmdMesh(jax_mesh, axis)` splits a `jax.sharding.Mesh`; `MpmdArray` holds one jax.Array
per MPMD group held by this process (all of them in a single-process run, the process's
own group in a multi-process run). The rules (validation, planning, spec filtering) are
refsim.mpmd's; only the data movement is JAX: a jitted identity onto the whole mesh
(SPMD -> MPMD), `jax.device_put` or a logically stacked select (MPMD -> SPMD).
"""
from __future__ import annotations

import functools

import numpy as np

from refsim.layouts.mesh import Mesh
from refsim.mpmd import mesh as rmesh
from refsim.mpmd import plan
from refsim.mpmd.array import MpmdArrayBase
from refsim.mpmd.reshard import check_mpmd_leaf, flatten_pair, stacked_spec

__all__ = ["MpmdArray", "MpmdMesh", "MpmdSharding", "group_by_size_threshold", "logically_stacked",
           "mpmd_to_spmd_reshard", "spmd_to_mpmd_reshard"]

group_by_size_threshold = plan.group_by_size_threshold


def _jax():
    import jax

    return jax


def _as_jax_mesh(mesh):
    jax = _jax()
    if isinstance(mesh, jax.sharding.Mesh):
        return mesh
    if isinstance(mesh, Mesh):
        from xla_backend.meshes import jax_mesh

        return jax_mesh(mesh)
    raise TypeError(f"mesh must be a jax.sharding.Mesh (or a refsim.Mesh of JAX device ids), got {type(mesh).__name__}.")


def _sub_jax_mesh(jax_mesh, groups, axis: int):
    from refsim import compat

    return compat.make_jax_mesh(np.take(jax_mesh.devices, list(groups), axis=axis), jax_mesh.axis_names,
                                 getattr(jax_mesh, "axis_types", None))


class MpmdMesh:
    """`MpmdMesh(mesh, mpmd_axis_name)` over JAX devices; `.mesh` is the refsim Mesh of the same ids.

    In a multi-process run each process must hold devices of exactly one group
    (ValueError otherwise, as jaxpp checks); `my_mpmd_axis_index` is that group.
    """

    def __init__(self, mesh, mpmd_axis_name: str):
        self.jax_mesh = _as_jax_mesh(mesh)
        self.mesh = Mesh.from_jax(self.jax_mesh)
        self.refsim = rmesh.MpmdMesh(self.mesh, mpmd_axis_name)
        self.mpmd_axis_name = mpmd_axis_name
        self.mpmd_axis = self.refsim.mpmd_axis
        self.mpmd_dim = self.refsim.mpmd_dim
        if self.is_multi_process:
            by_process: dict[int, list[int]] = {}
            for d in self.jax_mesh.devices.flat:
                by_process.setdefault(d.process_index, []).append(d.id)
            for p, ids in sorted(by_process.items()):
                try:
                    self.refsim.mpmd_idx_of_devices(ids)
                except ValueError as e:
                    raise ValueError(f"process {p}: {e}") from None

    @property
    def is_multi_process(self) -> bool:
        return len({d.process_index for d in self.jax_mesh.devices.flat}) > 1

    @functools.cached_property
    def unstack(self) -> tuple:
        """Each group's jax Mesh (all axis names, the MPMD axis at size 1)."""
        return tuple(_sub_jax_mesh(self.jax_mesh, [k], self.mpmd_axis) for k in range(self.mpmd_dim))

    @functools.cached_property
    def mpmd_idx_for_mesh(self) -> dict:
        return {m: k for k, m in enumerate(self.unstack)}

    @functools.cached_property
    def device_mpmd_idx(self) -> dict:
        """{jax Device: group index}."""
        return {d: self.refsim.device_mpmd_idx[d.id] for d in self.jax_mesh.devices.flat}

    def check_mpmd_idxs(self, mpmd_indices, what: str = "mpmd_indices"):
        return self.refsim.check_mpmd_idxs(mpmd_indices, what)

    def mpmd_submesh(self, mpmd_indices) -> "MpmdMesh":
        idxs = self.refsim.mpmd_submesh(mpmd_indices)  # validates
        del idxs
        return MpmdMesh(_sub_jax_mesh(self.jax_mesh, list(mpmd_indices), self.mpmd_axis), self.mpmd_axis_name)

    def mpmd_idx_of_mesh(self, mesh, what: str = "array") -> int:
        jax = _jax()
        if isinstance(mesh, jax.sharding.Mesh):
            k = self.mpmd_idx_for_mesh.get(mesh)
            if k is not None:
                return k
            mesh = Mesh.from_jax(mesh)
        return self.refsim.mpmd_idx_of_mesh(mesh, what)

    @functools.cached_property
    def my_mpmd_axis_index(self) -> int:
        """This process's group (multi-process runs only, as jaxpp)."""
        if not self.is_multi_process:
            raise ValueError("my_mpmd_axis_index is defined only for multi-process meshes; this mesh is one process's.")
        jax = _jax()
        local = {d.id for d in jax.local_devices()}
        return self.refsim.mpmd_idx_of_devices([i for i in self.refsim.device_mpmd_idx if i in local])

    @property
    def my_mpmd_group_mesh(self):
        return self.unstack[self.my_mpmd_axis_index]

    def lowering_mesh(self):
        """The mesh programs are compiled for: this process's group mesh, or group 0's in one process."""
        return self.my_mpmd_group_mesh if self.is_multi_process else self.unstack[0]

    def held_groups(self, mesh_ids) -> list[int]:
        """The groups of `mesh_ids` whose arrays this process holds."""
        if not self.is_multi_process:
            return sorted(mesh_ids)
        return [self.my_mpmd_axis_index] if self.my_mpmd_axis_index in mesh_ids else []

    def __eq__(self, other):
        return type(other) is type(self) and self.refsim == other.refsim

    def __hash__(self):
        return hash(self.refsim)

    def __repr__(self):
        return f"xla_backend.mpmd.MpmdMesh({self.mesh!r}, mpmd_axis_name={self.mpmd_axis_name!r})"


class MpmdSharding:
    """`MpmdSharding(mpmd_mesh, mesh_ids, spec)`: refsim.mpmd.MpmdSharding's rules; `.spec`/`.sharding` are JAX's."""

    def __init__(self, mpmd_mesh: MpmdMesh, mesh_ids, spec=None, *, memory_kind: str | None = None):
        if not isinstance(mpmd_mesh, MpmdMesh):
            raise TypeError(f"mpmd_mesh must be an xla_backend.mpmd.MpmdMesh, got {type(mpmd_mesh).__name__}.")
        self.mpmd_mesh = mpmd_mesh
        self.refsim = rmesh.MpmdSharding(mpmd_mesh.refsim, mesh_ids, spec, memory_kind=memory_kind)
        self.mesh_ids = self.refsim.mesh_ids
        self.memory_kind = memory_kind

    @property
    def spec(self):
        return self.refsim.spec.to_jax()

    @property
    def is_unused(self) -> bool:
        return self.refsim.is_unused

    def _named(self, jax_mesh):
        jax = _jax()
        kw = {"memory_kind": self.memory_kind} if self.memory_kind else {}
        return jax.sharding.NamedSharding(jax_mesh, self.spec, **kw)

    @property
    def sharding(self):
        """jax NamedSharding over the submesh of sorted mesh_ids."""
        self.refsim.sharding  # ValueError for an unused sharding
        return self._named(_sub_jax_mesh(self.mpmd_mesh.jax_mesh, sorted(self.mesh_ids), self.mpmd_mesh.mpmd_axis))

    def group_sharding(self, k: int):
        return self._named(self.mpmd_mesh.unstack[k])

    def with_mesh_ids(self, mesh_ids) -> "MpmdSharding":
        return MpmdSharding(self.mpmd_mesh, mesh_ids, self.refsim.spec, memory_kind=self.memory_kind)

    def __eq__(self, other):
        return isinstance(other, MpmdSharding) and self.refsim == other.refsim

    def __hash__(self):
        return hash(self.refsim)

    def __repr__(self):
        return f"xla_backend.mpmd.MpmdSharding(mesh_ids={sorted(self.mesh_ids)}, spec={self.spec!r})"


class MpmdArray(MpmdArrayBase):
    """An MpmdArray of jax.Arrays, each a NamedSharding array on its group mesh (see refsim.mpmd.MpmdArray)."""

    _array_type_name = "jax.Array"
    _sharding_type = MpmdSharding

    def __init__(self, partially_addressable_arrays, mpmd_sharding, shape=None, dtype=None):
        type(self)._array_type = _jax().Array
        super().__init__(partially_addressable_arrays, mpmd_sharding, shape, dtype)

    def _sharding_type_of_arrays(self):
        return _jax().sharding.NamedSharding

    def _spec_of(self, arr):
        return rmesh.as_spec(arr.sharding.spec)

    def _delete_one(self, arr) -> None:
        arr.delete()

    def _is_deleted_one(self, arr) -> bool:
        return arr.is_deleted()

    def _block_one(self, arr) -> None:
        arr.block_until_ready()


def _identity(*xs):
    return xs


def _shard_bytes(sharding, shape, dtype) -> int:
    return int(np.prod(sharding.shard_shape(tuple(shape)), dtype=np.int64)) * np.dtype(dtype).itemsize


def _check_threshold(threshold):
    threshold = plan.check_threshold(threshold)
    if threshold is not None:
        return threshold
    jax = _jax()
    stats = [d.memory_stats() for d in jax.local_devices()]
    if any(s is None or "bytes_limit" not in s for s in stats):
        return None  # no memory statistics (CPU): one batch, as refsim
    free = min(s["bytes_limit"] - s.get("peak_bytes_in_use", 0) for s in stats)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        free = int(np.min(multihost_utils.process_allgather(np.int64(free))))
    return int(free // 3)


def _check_jax_array(arr, path: str, what: str):
    jax = _jax()
    if not isinstance(arr, jax.Array):
        raise TypeError(f"{what}{path} must be a jax.Array, got {type(arr).__name__}: {arr!r}.")
    if arr.is_deleted():
        raise RuntimeError(f"{what}{path} has been deleted (consumed by an earlier reshard?).")


def spmd_to_mpmd_reshard(mpmd_mesh: MpmdMesh, spmd_arrays, mpmd_shardings, threshold=None):
    """refsim.mpmd.spmd_to_mpmd_reshard on jax.Arrays: inputs are deleted batch by batch once moved.

    Each batch is one jitted identity onto the whole mesh with the MPMD axis left out of
    the specs (so every group gets the whole array); each held group then keeps its own
    devices' buffers as a jax.Array on its group mesh, and the buffers of groups not in
    mesh_ids are freed. threshold=None: a third of the smallest free device memory, or
    one batch where devices report no memory statistics (CPU).
    """
    jax = _jax()
    if not isinstance(mpmd_mesh, MpmdMesh):
        raise TypeError(f"mpmd_mesh must be an xla_backend.mpmd.MpmdMesh, got {type(mpmd_mesh).__name__}.")
    plan.check_threshold(threshold)
    paths, arrays, shardings, treedef = flatten_pair(
        spmd_arrays, mpmd_shardings, value_is_leaf=lambda x: isinstance(x, jax.Array),
        target_is_leaf=lambda x: isinstance(x, MpmdSharding), what=("spmd_arrays", "mpmd_shardings"))
    targets = []
    for path, arr, s in zip(paths, arrays, shardings):
        _check_jax_array(arr, path, "spmd_arrays")
        devs = {d.id for d in arr.sharding.device_set}
        if devs != set(mpmd_mesh.mesh.device_set):
            raise ValueError(
                f"spmd_arrays{path} is on devices {sorted(devs)}, a mesh foreign to the MpmdMesh (devices "
                f"{sorted(mpmd_mesh.mesh.device_set)}); put it on mpmd_mesh.jax_mesh first (jax.jit needs one device set)."
            )
        if not isinstance(s, MpmdSharding):
            raise TypeError(f"mpmd_shardings{path} must be an MpmdSharding, got {type(s).__name__}: {s!r}.")
        if s.mpmd_mesh != mpmd_mesh:
            raise ValueError(f"mpmd_shardings{path} is over {s.mpmd_mesh!r}, not over the mpmd_mesh passed in.")
        s = s.with_mesh_ids({0}) if s.is_unused else s
        s.refsim.sharding.shard_shape(arr.shape)
        targets.append(s)
    threshold = _check_threshold(threshold)
    batches = plan.spmd_to_mpmd_plan([_shard_bytes(a.sharding, a.shape, a.dtype) for a in arrays],
                                     [min(s.mesh_ids) for s in targets], mpmd_mesh.mpmd_dim, threshold)
    out: list = [None] * len(arrays)
    for batch in batches:
        whole = tuple(jax.sharding.NamedSharding(mpmd_mesh.jax_mesh, targets[i].spec) for i in batch)
        moved = jax.jit(_identity, out_shardings=whole)(*[arrays[i] for i in batch])
        for i in batch:
            arrays[i].delete()
        for i, res in zip(batch, moved):
            out[i] = _split_groups(mpmd_mesh, res, targets[i])
    return jax.tree_util.tree_unflatten(treedef, out)


def _split_groups(mpmd_mesh: MpmdMesh, res, target: MpmdSharding) -> MpmdArray:
    jax = _jax()
    held = mpmd_mesh.held_groups(target.mesh_ids)
    by_group: dict[int, list] = {k: [] for k in held}
    for shard in res.addressable_shards:
        k = mpmd_mesh.device_mpmd_idx[shard.device]
        if k in by_group:
            by_group[k].append(shard.data)
        else:
            shard.data.delete()  # this group does not hold the array: free its buffer now
    arrays = [jax.make_array_from_single_device_arrays(res.shape, target.group_sharding(k), by_group[k])
              for k in held]
    return MpmdArray(arrays, target, shape=res.shape, dtype=res.dtype)


def _to_jax_sharding(s, path: str):
    jax = _jax()
    if isinstance(s, jax.sharding.Sharding):
        return s
    if hasattr(s, "devices_indices_map"):
        from xla_backend.convert import to_jax_sharding

        return to_jax_sharding(s)
    raise TypeError(f"spmd_shardings{path} must be a jax (or refsim) sharding, got {type(s).__name__}: {s!r}.")


def mpmd_to_spmd_reshard(mpmd_mesh: MpmdMesh, mpmd_arrays, spmd_shardings, threshold=None):
    """refsim.mpmd.mpmd_to_spmd_reshard on jax.Arrays: the first replica laid out by `spmd_shardings`.

    One process: `jax.device_put` of a copy of group mpmd_idxs[0]'s array. Several: each
    process logically stacks its group's array (zeros where it holds no first replica)
    onto the whole mesh and a jitted select keeps slice mpmd_idxs[0]. The MpmdArrays held
    here are deleted once their batch is done; bad input deletes nothing.
    """
    jax = _jax()
    if not isinstance(mpmd_mesh, MpmdMesh):
        raise TypeError(f"mpmd_mesh must be an xla_backend.mpmd.MpmdMesh, got {type(mpmd_mesh).__name__}.")
    plan.check_threshold(threshold)
    paths, arrays, shardings, treedef = flatten_pair(
        mpmd_arrays, spmd_shardings, value_is_leaf=lambda x: isinstance(x, MpmdArray),
        target_is_leaf=lambda x: hasattr(x, "devices_indices_map"), what=("mpmd_arrays", "spmd_shardings"))
    jsh = []
    for path, arr, s in zip(paths, arrays, shardings):
        check_mpmd_leaf(mpmd_mesh, arr, path, MpmdArray)
        s = _to_jax_sharding(s, path)
        devs = {d.id for d in s.device_set}
        if not devs <= set(mpmd_mesh.mesh.device_set):
            raise ValueError(
                f"spmd_shardings{path} places the array on devices {sorted(devs - set(mpmd_mesh.mesh.device_set))} "
                "outside the MpmdMesh; use a sharding over its mesh."
            )
        if mpmd_mesh.is_multi_process and devs != set(mpmd_mesh.mesh.device_set):
            raise ValueError(f"spmd_shardings{path} must span the whole MpmdMesh in a multi-process run.")
        s.shard_shape(tuple(arr.shape))
        if not mpmd_mesh.is_multi_process and arr.first_mpmd_replica is None:
            raise ValueError(f"mpmd_arrays{path}: its first replica's group {arr.mpmd_idxs[0]} holds no array here.")
        jsh.append(s)
    threshold = _check_threshold(threshold)
    local = [_shard_bytes(a.mpmd_sharding.refsim.group_sharding(a.mpmd_idxs[0]), a.shape, a.dtype) for a in arrays]
    out: list = [None] * len(arrays)
    for batch in plan.mpmd_to_spmd_plan(local, mpmd_mesh.mpmd_dim, threshold):
        if mpmd_mesh.is_multi_process:
            results = _select_first_replicas(mpmd_mesh, [arrays[i] for i in batch], [jsh[i] for i in batch])
        else:
            # jax.device_put keeps a device's buffer when its block does not move, even with
            # may_alias=False (jax 0.10); a jitted identity first gives buffers of our own.
            results = [jax.device_put(jax.jit(_identity)(arrays[i].first_mpmd_replica)[0], jsh[i]) for i in batch]
        for i, r in zip(batch, results):
            out[i] = r
            if arrays[i].is_partially_addressable:
                arrays[i].delete()
    return jax.tree_util.tree_unflatten(treedef, out)


def _select_first_replicas(mpmd_mesh: MpmdMesh, arrays, shardings):
    jax = _jax()
    stacked = []
    for arr in arrays:
        local = arr.first_mpmd_replica
        if local is None:
            local = jax.jit(lambda: jax.numpy.zeros(arr.shape, arr.dtype),
                            out_shardings=arr.mpmd_sharding.group_sharding(mpmd_mesh.my_mpmd_axis_index))()
        stacked.append(logically_stacked(local, mpmd_mesh.jax_mesh, mpmd_mesh.mpmd_axis_name))
    firsts = tuple(a.mpmd_idxs[0] for a in arrays)
    select = jax.jit(lambda xs: tuple(x[k] for x, k in zip(xs, firsts)), out_shardings=tuple(shardings))
    results = select(tuple(stacked))
    for s in stacked:
        s.delete()
    return list(results)


def logically_stacked(array, mesh, axis_name: str, array_axis: int = 0, strict: bool = False):
    """refsim.mpmd.logically_stacked on jax.Arrays: each device's block gains a size-1 dimension, no data moves.

    `array`: a jax.Array on `mesh` itself or (this process's) group mesh, or a sequence of
    group arrays in position order (single process). In a multi-process run every process
    passes its own group's array and together they form the result.
    """
    jax = _jax()
    mesh = _as_jax_mesh(mesh)
    if axis_name not in mesh.axis_names:
        raise NameError(f"unbound axis name: {axis_name!r}. The mesh has axes {tuple(mesh.axis_names)!r}.")
    arrays = [array] if isinstance(array, jax.Array) else list(array)
    if not arrays:
        raise ValueError("logically_stacked needs at least one array.")
    first = arrays[0]
    for k, a in enumerate(arrays):
        if not isinstance(a, jax.Array) or not isinstance(a.sharding, jax.sharding.NamedSharding):
            raise TypeError(f"array[{k}] must be a jax.Array with a NamedSharding, got {a!r}.")
        if (a.shape, a.dtype, rmesh.as_spec(a.sharding.spec)) != (first.shape, first.dtype,
                                                                   rmesh.as_spec(first.sharding.spec)):
            raise ValueError(f"array[{k}] differs from array[0] in shape, dtype or spec; they must agree.")
    spec = rmesh.as_spec(first.sharding.spec)
    size = dict(zip(mesh.axis_names, mesh.devices.shape))[axis_name]
    if len(arrays) == 1 and first.sharding.mesh == mesh and size > 1 and axis_name in spec.used_axes():
        raise ValueError(f"array's spec {spec!r} shards over {axis_name!r}; reshard it so the spec does not name it.")
    new_spec = stacked_spec(spec, axis_name, array_axis, first.ndim, strict)
    shape = tuple(first.shape[:array_axis]) + (size,) + tuple(first.shape[array_axis:])
    out_sharding = jax.sharding.NamedSharding(mesh, new_spec.to_jax())
    expected = set(out_sharding.addressable_devices)
    bufs = [jax.numpy.expand_dims(s.data, array_axis) for a in arrays for s in a.addressable_shards]
    got = {b.devices().pop() for b in bufs}
    if got != expected or len(bufs) != len(expected):
        raise ValueError(
            f"the arrays' devices {sorted(d.id for d in got)} are not this process's devices of the mesh "
            f"{sorted(d.id for d in expected)}; pass every group's array (one process) or your own group's."
        )
    return jax.make_array_from_single_device_arrays(shape, out_sharding, bufs)
