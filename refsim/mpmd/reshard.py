"""SPMD <-> MPMD resharding and `logically_stacked`, on refsim.Arrays (jaxpp's semantics).

`spmd_to_mpmd_reshard` gives each array to the groups of its MpmdSharding, whole in each
group and laid out there by the sharding's spec; `mpmd_to_spmd_reshard` lays the value
of each MpmdArray's first replica (its lowest group) out by an ordinary sharding of the
whole mesh. Both validate every leaf before moving anything, so bad input changes nothing,
and batch the work as `refsim.mpmd.plan` says (the batches do not change the values).
"""
from __future__ import annotations

import numpy as np

from refsim.array import Array, device_put
from refsim.layouts import stacking
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec
from refsim.mpmd import plan
from refsim.mpmd.array import MpmdArray
from refsim.mpmd.mesh import MpmdMesh, MpmdSharding, as_spec, filter_axes


def flatten_pair(values, targets, *, value_is_leaf, target_is_leaf, what: tuple[str, str]):
    """Flat leaves (with key paths) of two pytrees of one structure; ValueError naming both otherwise."""
    import jax

    vals, vdef = jax.tree_util.tree_flatten_with_path(values, is_leaf=value_is_leaf)
    tgts, tdef = jax.tree_util.tree_flatten(targets, is_leaf=target_is_leaf)
    if vdef != tdef:
        raise ValueError(
            f"{what[0]} and {what[1]} must be pytrees of the same structure, got {vdef} and {tdef}; "
            f"give one {what[1][:-1]} per leaf of {what[0]}."
        )
    paths = [jax.tree_util.keystr(p) or "<root>" for p, _ in vals]
    return paths, [v for _, v in vals], tgts, vdef


def resolve_unused(s: MpmdSharding) -> MpmdSharding:
    """An unused MpmdSharding (empty mesh_ids) placed on group 0, as jaxpp does."""
    return s.with_mesh_ids({0}) if s.is_unused else s


def _check_mpmd_sharding(mpmd_mesh, s, path: str, sharding_type=MpmdSharding):
    if not isinstance(s, sharding_type):
        raise TypeError(f"mpmd_shardings{path} must be a {sharding_type.__name__}, got {type(s).__name__}: {s!r}.")
    if s.mpmd_mesh != mpmd_mesh:
        raise ValueError(
            f"mpmd_shardings{path} is over {s.mpmd_mesh!r}, not over the mpmd_mesh passed in ({mpmd_mesh!r}); "
            "build the MpmdSharding with this mpmd_mesh."
        )
    return resolve_unused(s)


def _shard_bytes(sharding, shape, dtype) -> int:
    return int(np.prod(sharding.shard_shape(shape), dtype=np.int64)) * np.dtype(dtype).itemsize


def _check_on_mesh(mpmd_mesh: MpmdMesh, sharding, path: str, what: str) -> None:
    devs = frozenset(sharding.device_set)
    if devs != mpmd_mesh.mesh.device_set:
        raise ValueError(
            f"{what}{path} is on devices {sorted(devs)}, a mesh foreign to the MpmdMesh (devices "
            f"{sorted(mpmd_mesh.mesh.device_set)}); put it on mpmd_mesh.mesh first (jax.jit needs one device set)."
        )


def spmd_to_mpmd_reshard(mpmd_mesh: MpmdMesh, spmd_arrays, mpmd_shardings, threshold=None):
    """A pytree of MpmdArrays: leaf i of `spmd_arrays` given to the groups of `mpmd_shardings` leaf i.

    Each array (a refsim.Array over the devices of `mpmd_mesh.mesh`) is whole in every
    group of its sharding's mesh_ids, laid out there by the sharding's spec (the MPMD axis
    removed); empty mesh_ids place it on group 0. Work runs in the batches of
    `plan.spmd_to_mpmd_plan` (interleaved largest-first per group, each weighing shard
    bytes x mpmd_dim, under `threshold` bytes; None: one batch). The inputs are consumed in
    jaxpp's sense (refsim.Arrays hold no device memory, so they stay readable).
    """
    if not isinstance(mpmd_mesh, MpmdMesh):
        raise TypeError(f"mpmd_mesh must be a refsim MpmdMesh, got {type(mpmd_mesh).__name__}.")
    threshold = plan.check_threshold(threshold)
    paths, arrays, shardings, treedef = flatten_pair(
        spmd_arrays, mpmd_shardings, value_is_leaf=lambda x: isinstance(x, Array),
        target_is_leaf=lambda x: isinstance(x, MpmdSharding), what=("spmd_arrays", "mpmd_shardings"))
    targets = []
    for path, arr, s in zip(paths, arrays, shardings):
        if not isinstance(arr, Array):
            raise TypeError(f"spmd_arrays{path} must be a refsim.Array, got {type(arr).__name__}: {arr!r}.")
        _check_on_mesh(mpmd_mesh, arr.sharding, path, "spmd_arrays")
        s = _check_mpmd_sharding(mpmd_mesh, s, path)
        stacking.check_concrete_spec(s.spec, f"mpmd_shardings{path}")
        s.sharding.shard_shape(arr.shape)  # IndivisibleError before anything moves
        targets.append(s)
    batches = plan.spmd_to_mpmd_plan([_shard_bytes(a.sharding, a.shape, a.dtype) for a in arrays],
                                     [min(s.mesh_ids) for s in targets], mpmd_mesh.mpmd_dim, threshold)
    out: list = [None] * len(arrays)
    for batch in batches:
        for i in batch:
            out[i] = _to_groups(arrays[i], targets[i])
    import jax

    return jax.tree_util.tree_unflatten(treedef, out)


def _to_groups(arr: Array, target: MpmdSharding) -> MpmdArray:
    """The MpmdArray of `arr`'s global value in every group of `target` (replicas share read-only memory)."""
    value = np.asarray(arr)
    value.setflags(write=False)
    mpmd_mesh = target.mpmd_mesh
    groups = sorted(target.mesh_ids)
    sub = mpmd_mesh.mpmd_submesh(groups)
    stacked = stacking.global_to_stacked(value, sub.mesh, target.spec)
    ax = mpmd_mesh.mpmd_axis
    per_group = [
        Array.from_stacked(stacked[(slice(None),) * ax + (slice(j, j + 1),)], mpmd_mesh.unstack[k], target.spec)
        for j, k in enumerate(groups)
    ]
    return MpmdArray(per_group, target)


def mpmd_to_spmd_reshard(mpmd_mesh: MpmdMesh, mpmd_arrays, spmd_shardings, threshold=None):
    """A pytree of refsim.Arrays: each MpmdArray's first replica laid out by its leaf of `spmd_shardings`.

    The value is that of group `mpmd_idxs[0]` (jaxpp selects the first replica; other
    groups' replicas are not read). Targets are refsim shardings over devices of
    `mpmd_mesh`. Batches follow `plan.mpmd_to_spmd_plan`. The MpmdArrays are consumed:
    deleted once every leaf is done; on bad input nothing is deleted.
    """
    if not isinstance(mpmd_mesh, MpmdMesh):
        raise TypeError(f"mpmd_mesh must be a refsim MpmdMesh, got {type(mpmd_mesh).__name__}.")
    threshold = plan.check_threshold(threshold)
    paths, arrays, shardings, treedef = flatten_pair(
        mpmd_arrays, spmd_shardings, value_is_leaf=lambda x: isinstance(x, MpmdArray),
        target_is_leaf=lambda x: hasattr(x, "devices_indices_map"), what=("mpmd_arrays", "spmd_shardings"))
    for path, arr, s in zip(paths, arrays, shardings):
        check_mpmd_leaf(mpmd_mesh, arr, path, MpmdArray)
        if not hasattr(s, "devices_indices_map"):
            raise TypeError(f"spmd_shardings{path} must be a refsim sharding, got {type(s).__name__}: {s!r}.")
        devs = frozenset(s.device_set)
        if not devs <= mpmd_mesh.mesh.device_set:
            raise ValueError(
                f"spmd_shardings{path} places the array on devices {sorted(devs - mpmd_mesh.mesh.device_set)} "
                f"outside the MpmdMesh (devices {sorted(mpmd_mesh.mesh.device_set)}); use a sharding over its mesh."
            )
        s.shard_shape(arr.shape)
        if arr.first_mpmd_replica is None:
            raise ValueError(
                f"mpmd_arrays{path}: its first replica lives in group {arr.mpmd_idxs[0]}, whose array is not "
                f"held here (held: groups {list(arr.addressable_mpmd_idxs)})."
            )
    local = [_shard_bytes(a.mpmd_sharding.group_sharding(a.mpmd_idxs[0]), a.shape, a.dtype) for a in arrays]
    out: list = [None] * len(arrays)
    for batch in plan.mpmd_to_spmd_plan(local, mpmd_mesh.mpmd_dim, threshold):
        for i in batch:
            out[i] = device_put(np.asarray(arrays[i].first_mpmd_replica), shardings[i])
    for arr in arrays:
        arr.delete()
    import jax

    return jax.tree_util.tree_unflatten(treedef, out)


def check_mpmd_leaf(mpmd_mesh, arr, path: str, array_type) -> None:
    """TypeError/ValueError/RuntimeError for a leaf that is no live MpmdArray of `mpmd_mesh`."""
    if not isinstance(arr, array_type):
        raise TypeError(f"mpmd_arrays{path} must be an {array_type.__name__}, got {type(arr).__name__}: {arr!r}.")
    if arr.mpmd_mesh != mpmd_mesh:
        raise ValueError(
            f"mpmd_arrays{path} lives on {arr.mpmd_mesh!r}, a mesh foreign to the mpmd_mesh passed in "
            f"({mpmd_mesh!r})."
        )
    if arr.is_partially_addressable and arr.is_deleted():
        raise RuntimeError(f"mpmd_arrays{path} has been deleted (consumed by an earlier reshard?).")


def stacked_spec(spec, axis_name: str, array_axis: int, ndim: int, strict: bool) -> PartitionSpec:
    """The spec of a logically stacked array: `axis_name` inserted as the entry of the new dimension."""
    spec = as_spec(spec)
    if axis_name in spec.used_axes():
        if strict:
            raise ValueError(f"axis_name {axis_name!r} already shards a dimension in spec {spec!r} (strict=True).")
        spec = filter_axes(spec, {axis_name})
    if not 0 <= array_axis <= ndim:
        raise ValueError(f"array_axis={array_axis} is out of range for a rank-{ndim} array; use 0..{ndim}.")
    parts = list(spec.padded(ndim))
    return PartitionSpec(*parts[:array_axis], axis_name, *parts[array_axis:])


def logically_stacked(array, mesh: Mesh, axis_name: str, array_axis: int = 0, strict: bool = False) -> Array:
    """One Array on `mesh` whose slice k along a new dimension `array_axis` is what position k of `axis_name` holds.

    `array` is a refsim.Array over `mesh` itself, or a sequence of refsim.Arrays, one per
    position along `axis_name` (MPMD group k's array on the mesh slice k), all of one shape,
    dtype and spec. The result has shape shape[:array_axis] + (n,) + shape[array_axis:],
    spec with `axis_name` inserted there; every device keeps its own block (no data moves),
    as jaxpp's `logically_stacked`. strict=True rejects a spec already naming `axis_name`.
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a refsim.Mesh, got {type(mesh).__name__}.")
    ax = mesh.axis_index(axis_name)
    if isinstance(array, Array):
        if not isinstance(array.sharding, NamedSharding) or array.sharding.mesh.device_ids.tobytes() != \
                mesh.device_ids.tobytes() or array.sharding.mesh.axis_names != mesh.axis_names:
            raise ValueError(
                f"array is laid out by {array.sharding!r}, not by a NamedSharding over mesh {mesh!r}; pass one "
                "array per group as a list, or an array on this mesh."
            )
        spec = array.sharding.spec
        if mesh.axis_sizes[ax] > 1 and axis_name in spec.used_axes():
            raise ValueError(
                f"array's spec {spec!r} shards over {axis_name!r}, so its devices along that axis hold different "
                "blocks, not one array each; reshard it so the spec does not name the axis."
            )
        stacked, shape = array.to_stacked(mesh), array.shape
    else:
        arrays = list(array)
        if len(arrays) != mesh.axis_sizes[ax]:
            raise ValueError(
                f"got {len(arrays)} arrays but axis {axis_name!r} has size {mesh.axis_sizes[ax]}; give one per position."
            )
        mm = MpmdMesh(mesh, axis_name)
        blocks = []
        for k, a in enumerate(arrays):
            if not isinstance(a, Array):
                raise TypeError(f"array[{k}] must be a refsim.Array, got {type(a).__name__}.")
            got = mm.mpmd_idx_of_mesh(getattr(a.sharding, "mesh", None), what=f"array[{k}]")
            if got != k:
                raise ValueError(f"array[{k}] is on the mesh of position {got}; list the arrays in position order.")
            if (a.shape, a.dtype, a.sharding.spec) != (arrays[0].shape, arrays[0].dtype, arrays[0].sharding.spec):
                raise ValueError(
                    f"array[{k}] is {a.dtype}{list(a.shape)} with spec {a.sharding.spec!r} but array[0] is "
                    f"{arrays[0].dtype}{list(arrays[0].shape)} with {arrays[0].sharding.spec!r}; they must agree."
                )
            blocks.append(a.to_stacked(mm.unstack[k]))
        stacked, spec, shape = np.concatenate(blocks, axis=ax), arrays[0].sharding.spec, arrays[0].shape
    new_spec = stacked_spec(spec, axis_name, array_axis, len(shape), strict)
    return Array.from_stacked(np.expand_dims(stacked, mesh.ndim + array_axis), mesh, new_spec)
