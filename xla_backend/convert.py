"""Conversions between refsim values/shardings and JAX ones, device by device.

Devices correspond by id: refsim device id == JAX ``device.id``. `to_refsim` copies
every addressable shard off its device (data, index, replica id) without assembling
the global value, so replicas that disagree on the device stay visible.
"""
from __future__ import annotations

import dataclasses
import functools
from collections import OrderedDict

import numpy as np

from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec
from xla_backend import meshes


def _single_device_cls():
    from refsim.layouts.single_device import SingleDeviceSharding

    return SingleDeviceSharding


def to_jax_sharding(sharding):
    """The `jax.sharding.Sharding` placing data exactly as a refsim sharding does.

    NamedSharding maps to NamedSharding over `jax_mesh(mesh)`; SingleDeviceSharding to
    SingleDeviceSharding; a JAX sharding is returned unchanged.
    """
    import jax

    if sharding is None or isinstance(sharding, jax.sharding.Sharding):
        return sharding
    if isinstance(sharding, PartitionSpec):
        raise TypeError(
            f"got a bare PartitionSpec {sharding!r} where a sharding is needed; wrap it as "
            "refsim.NamedSharding(mesh, spec)."
        )
    if isinstance(sharding, NamedSharding):
        if not isinstance(sharding.mesh, Mesh):
            raise ValueError(
                f"{sharding!r} is over an AbstractMesh; XLA needs devices: build it over "
                "xla_backend.mesh(shape, names)."
            )
        return _named_to_jax(sharding)
    if type(sharding).__name__ == "SingleDeviceSharding":
        (dev,) = meshes.jax_devices([sharding.device_id]).tolist()
        return jax.sharding.SingleDeviceSharding(dev)
    raise TypeError(
        f"{type(sharding).__name__} has no jax.sharding equivalent that xla_backend can build "
        "(JAX >= 0.10 lays pmap arrays out by NamedSharding); pass a refsim NamedSharding or "
        "SingleDeviceSharding, or the global value np.asarray(array)."
    )


@functools.lru_cache(maxsize=1024)
def _named_to_jax(sharding):
    # Equal refsim NamedShardings (mesh with ids, spec, memory kind) give one JAX object: every
    # argument placed and every executable looked up converts the same few layouts again.
    import jax

    kw = {"memory_kind": sharding.memory_kind} if sharding.memory_kind else {}
    return jax.sharding.NamedSharding(meshes.jax_mesh(sharding.mesh), sharding.spec.to_jax(), **kw)


def from_jax_sharding(sharding):
    """The refsim sharding equal to a JAX NamedSharding, SingleDeviceSharding or GSPMDSharding.

    Equal JAX shardings give the same refsim object (a bounded cache): reading results back
    converts the same few layouts over and over, and one object keeps refsim's per-(sharding,
    shape) index cache warm."""
    try:
        return _from_jax_sharding_cached(sharding)
    except TypeError as e:
        if "unhashable" not in str(e):
            raise
        return _from_jax_sharding(sharding)


@functools.lru_cache(maxsize=512)
def _from_jax_sharding_cached(sharding):
    return _from_jax_sharding(sharding)


def _from_jax_sharding(sharding):
    import jax

    if isinstance(sharding, jax.sharding.NamedSharding):
        mk = sharding.memory_kind
        return NamedSharding(Mesh.from_jax(sharding.mesh), PartitionSpec.from_jax(sharding.spec),
                             memory_kind=None if mk in (None, "device") else mk)
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        (dev,) = sharding.device_set
        return _single_device_cls()(dev.id)
    if type(sharding).__name__ == "GSPMDSharding":
        return _gspmd_to_named(sharding)
    raise TypeError(
        f"JAX sharding {sharding!r} ({type(sharding).__name__}) has no refsim equivalent; "
        "give the program NamedSharding out_shardings so its results are comparable."
    )


def _gspmd_to_named(sharding):
    """The refsim NamedSharding placing data as a JAX GSPMDSharding does.

    A GSPMDSharding is an HloSharding over a device assignment: tile position t of its tile
    assignment holds block t and lives on device ``device_assignment[ids[t]]``. That is a
    NamedSharding over a mesh shaped like the tile assignment (axes ``gspmd0``, ...), each data
    dimension split over its own axis and a ``last_tile_dim_replicate`` axis left unused.
    Manual subgroups and maximal shardings have no NamedSharding: TypeError.
    """
    from refsim.layouts.hlo_sharding import HloSharding

    hlo = HloSharding.parse(str(sharding._hlo_sharding))
    assigned = np.array([d.id for d in sharding._device_assignment], dtype=np.int64)
    mk = sharding.memory_kind
    memory_kind = None if mk in (None, "device") else mk
    if hlo.kind == "replicated":
        mesh = Mesh(assigned.shape, ("gspmd0",), device_ids=assigned)
        return NamedSharding(mesh, PartitionSpec(), memory_kind=memory_kind)
    if hlo.kind != "tiled" or hlo.subgroup_types:
        raise TypeError(
            f"JAX sharding {sharding!r} ({hlo.kind} HloSharding {hlo}) has no refsim equivalent; "
            "give the program NamedSharding out_shardings so its results are comparable.")
    ids = hlo.tile_assignment.array()
    names = tuple(f"gspmd{k}" for k in range(ids.ndim))
    mesh = Mesh(ids.shape, names, device_ids=assigned[ids])
    spec = PartitionSpec(*(names[k] if ids.shape[k] > 1 else None for k in range(hlo.data_rank)))
    return NamedSharding(mesh, spec, memory_kind=memory_kind)


def local_shards(jax_array):
    """[refsim.Shard] copied off this process's devices, in the sharding's device order.

    JAX defines no device indices for a sharding with unreduced axes (each device along them
    holds a partial sum, `devices_indices_map` raises NotImplementedError); those come from
    refsim's equal sharding, which places a partial sum as if the unreduced axes were
    replicated and gives every device its own replica id (no two hold the same values).
    """
    from refsim.array import Shard

    shape = tuple(jax_array.shape)
    try:
        order = {d.id: k for k, d in enumerate(jax_array.sharding.devices_indices_map(shape))}
        index = replica = None
    except NotImplementedError:
        ref = from_jax_sharding(jax_array.sharding)
        index, replica = ref.devices_indices_map(shape), ref.device_replica_id_map(shape)
        order = {d: k for k, d in enumerate(index)}
    shards = sorted(jax_array.addressable_shards, key=lambda s: order[s.device.id])
    return [
        Shard(int(s.device.id), _plain_index(s.index if index is None else index[s.device.id]),
              np.array(_host(s.data), copy=True), int(s.replica_id if replica is None else replica[s.device.id]))
        for s in shards
    ]


def _host(data):
    """A single-device jax.Array as NumPy: a PRNG key array as refsim's structured key array."""
    from refsim import compat as _compat

    return _compat.to_numpy(data)


def _plain_index(index) -> tuple:
    # JAX writes unsharded dims as slice(None, None, None); keep them, normalise steps only.
    return tuple(slice(i.start, i.stop) if isinstance(i, slice) else int(i) for i in index)


def to_refsim(jax_array, *, info=None):
    """A refsim.Array with every shard of a (fully addressable) jax.Array, device by device.

    The layout JAX gives (each device's index) is checked against refsim's reading of the
    sharding by refsim.Array's constructor the first time a (sharding, shape) is read back;
    later reads of that layout reuse the checked plan (`_READBACK`) and check only each
    device's shard shape and dtype. In a multi-process run use
    `xla_backend.distributed.gather` (collective) instead.
    """
    from refsim.array import Array

    if not jax_array.is_fully_addressable:
        raise ValueError(
            f"to_refsim(jax_array): the array spans {len(jax_array.sharding.device_set)} devices "
            "of several processes and this process sees only its own shards; call "
            "xla_backend.distributed.gather(result) on every process to collect all of them."
        )
    shape = tuple(jax_array.shape)
    dtype, is_key = _dtype_facts(jax_array.dtype)
    try:
        key = (jax_array.sharding, shape)
        plan = _READBACK.get(key)
    except TypeError:   # an unhashable sharding: checked on every read
        key = plan = None
    if plan is not None:
        shards = _planned_shards(jax_array, plan, dtype, _host if is_key else np.asarray)
        if shards is not None:
            _READBACK.move_to_end(key)
            return Array.from_trusted_shards(shape, dtype, plan.sharding, shards, info=info)
    sharding = from_jax_sharding(jax_array.sharding)
    out = Array(shape, dtype, sharding, local_shards(jax_array), info=info)
    if key is not None:
        _READBACK[key] = _Plan(sharding, tuple((s.device_id, s.index, s.replica_id) for s in out.shards),
                               tuple(sharding.shard_shape(shape)))
        if len(_READBACK) > READBACK_MAX_ENTRIES:
            _READBACK.popitem(last=False)
    return out


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A layout already checked by refsim.Array's constructor: the refsim sharding, each
    device's (id, index, replica id) in its device order, and the block shape."""

    sharding: object
    devices: tuple
    block: tuple


READBACK_MAX_ENTRIES = 2048  # a plan is a few small tuples
_READBACK: "OrderedDict[tuple, _Plan]" = OrderedDict()  # (JAX sharding, shape) -> _Plan


def _dtype_facts(jax_dtype) -> tuple:
    """(refsim's NumPy dtype, whether it is a PRNG key dtype) of a JAX dtype."""
    try:
        return _dtype_facts_cached(jax_dtype)
    except TypeError:   # an unhashable dtype
        return _dtype_facts_uncached(jax_dtype)


def _dtype_facts_uncached(jax_dtype) -> tuple:
    from refsim import compat as _compat

    return _compat.physical_dtype(jax_dtype), _compat.prng_impl_of(jax_dtype) is not None


_dtype_facts_cached = functools.lru_cache(maxsize=256)(_dtype_facts_uncached)


def _planned_shards(jax_array, plan: _Plan, dtype, host):
    """Every device's shard copied off the device (`host`: to NumPy) and placed by `plan`; None
    when the devices, a shard's shape or its dtype differ from the plan (the checking
    constructor then says how)."""
    from refsim.array import Shard

    by_id = {s.device.id: s.data for s in jax_array.addressable_shards}
    if len(by_id) != len(plan.devices):
        return None
    out = []
    for dev, index, replica in plan.devices:
        data = by_id.get(dev)
        if data is None:
            return None
        data = np.array(host(data), copy=True)
        if data.shape != plan.block or data.dtype != dtype:
            return None
        out.append(Shard(dev, index, data, replica))
    return out


def from_refsim(array, sharding=None):
    """A jax.Array with each device's data taken from the refsim.Array's own shard.

    Per-device data is kept (replicas that differ stay different on the devices). With
    `sharding` (refsim or JAX) different from the array's, the data is laid out anew
    from the global value instead.
    """
    import jax

    jsh = to_jax_sharding(array.sharding if sharding is None else sharding)
    if sharding is not None and to_jax_sharding(array.sharding) != jsh:
        glob = np.asarray(array)
        return jax.make_array_from_callback(glob.shape, jsh, lambda idx: glob[idx], dtype=glob.dtype)
    devs = {d.id: d for d in jsh.addressable_devices}
    bufs = [jax.device_put(s.data, devs[s.device_id]) for s in array.shards if s.device_id in devs]
    return jax.make_array_from_single_device_arrays(tuple(array.shape), jsh, bufs)


def put_global(value, sharding):
    """Lay a global NumPy value out by `sharding` (refsim or JAX) on JAX's devices.

    Works in multi-process runs: each process fills only its addressable devices.
    """
    import jax

    value = np.asarray(value)
    jsh = to_jax_sharding(sharding)
    # dtype given: a process that holds none of the devices (multi-process) cannot infer it
    return jax.make_array_from_callback(value.shape, jsh, lambda idx: value[idx], dtype=value.dtype)
