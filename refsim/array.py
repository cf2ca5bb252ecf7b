"""`refsim.Array`: a global array held as one block per device, like `jax.Array`.

An Array is a shape, a dtype, a sharding and one `Shard` per device of the
sharding. Each shard's index is what `sharding.devices_indices_map(shape)`
gives its device; `np.asarray(arr)` assembles the global value and checks that
devices holding the same block (replicas) agree. For a `NamedSharding` the
per-device data is kept as one mesh-major stacked ndarray (`mesh.axis_sizes +
shard_shape`) and every shard is a view of it, so placing, assembling and
checking replicas are a few NumPy calls whatever the number of devices.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import numpy as np

from refsim.errors import ReplicationError
from refsim.layouts import stacking
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec
from refsim.values import as_jax_array, canonical_dtype, check_numeric_dtype


@dataclasses.dataclass(frozen=True, eq=False)
class Shard:
    """One device's block: `data` is `global[index]` (an int index drops that dimension, as pmap's)."""

    device_id: int
    index: tuple
    data: np.ndarray
    replica_id: int = 0


def _normalize_index(index: tuple, shape: tuple) -> tuple:
    """Comparable form of an index: (start, stop) per sliced dimension, an int for an int index."""
    out = []
    for i, n in zip(index, shape):
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step != 1:
                raise ValueError(f"shard index {index!r} has a slice with step {step}; shard slices have step 1.")
            out.append((start, stop))
        else:
            out.append(int(i))
    return tuple(out)


def _as_sharding(sharding):
    """A refsim sharding; JAX's NamedSharding / SingleDeviceSharding are converted by device id."""
    if hasattr(sharding, "devices_indices_map") and type(sharding).__module__.startswith("refsim"):
        return sharding
    tname = type(sharding).__name__
    if tname == "NamedSharding" and hasattr(sharding, "mesh") and hasattr(sharding.mesh, "devices"):
        return NamedSharding(Mesh.from_jax(sharding.mesh), PartitionSpec.from_jax(sharding.spec))
    if tname == "SingleDeviceSharding" and hasattr(sharding, "device_set"):
        from refsim.layouts.single_device import SingleDeviceSharding

        return SingleDeviceSharding(next(iter(sharding.device_set)).id)
    if hasattr(sharding, "devices_indices_map") and hasattr(sharding, "shard_shape"):
        return sharding
    raise TypeError(
        f"sharding should be a refsim sharding (NamedSharding, PmapSharding, SingleDeviceSharding, "
        f"HloSharding) or a JAX NamedSharding, got {sharding!r} of type {tname}."
    )


def _stackable(sharding) -> bool:
    """Whether the vectorised mesh-major path applies (a NamedSharding over concrete device ids)."""
    return (isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh)
            and sharding.logical_device_ids is None)  # permuted placement: the generic path


class Array:
    """A global array of `shape`/`dtype` laid out by `sharding`, one `Shard` per device.

    The constructor checks one shard per device of the sharding, each index
    selecting the same elements as `sharding.devices_indices_map(shape)`, and
    data of `sharding.shard_shape(shape)` and `dtype`; raises ValueError as
    `jax.make_array_from_single_device_arrays` does. Shards are stored in the
    sharding's device order with the sharding's own index and replica id.
    """

    __array_priority__ = 100

    def __init__(self, shape, dtype, sharding, shards: Sequence[Shard], *, info: dict | None = None):
        sharding = _as_sharding(sharding)
        shape = tuple(int(d) for d in shape)
        dtype = np.dtype(dtype)
        index_map = sharding.devices_indices_map(shape)
        block_shape = tuple(sharding.shard_shape(shape))
        shards = list(shards)
        if len(shards) != len(index_map):
            raise ValueError(
                f"Expected {len(index_map)} per-device arrays (this is how many devices are addressable "
                f"by the sharding), but got {len(shards)}"
            )
        by_id = {}
        for s in shards:
            if not isinstance(s, Shard):
                raise TypeError(f"shards must be refsim.Shard objects, got {type(s).__name__}: {s!r}.")
            by_id[int(s.device_id)] = s
        if set(by_id) != set(index_map) or len(by_id) != len(shards):
            missing, extra = set(index_map) - set(by_id), set(by_id) - set(index_map)
            msg = "Addressable devices and per-device arrays devices do not match."
            if missing:
                msg += f" Sharding contains devices {missing} that are not present in per-device arrays."
            if extra:
                msg += f" Per-device arrays contain devices {extra} that are not present in the sharding."
            if len(by_id) != len(shards):
                msg += " Some device appears in more than one shard."
            raise ValueError(msg)
        replica_ids = sharding.device_replica_id_map(shape)
        ordered = []
        for dev, index in index_map.items():
            s = by_id[dev]
            data = s.data if isinstance(s.data, np.ndarray) else np.asarray(s.data)
            if _normalize_index(tuple(s.index), shape) != _normalize_index(index, shape):
                raise ValueError(
                    f"shard of device {dev} has index {s.index!r}, but {sharding!r} puts {index!r} on that "
                    f"device for shape {shape}; build shards from sharding.devices_indices_map(shape)."
                )
            if data.dtype != dtype:
                raise ValueError(
                    f"Input buffers to `Array` must have matching dtypes. Got {data.dtype}, expected "
                    f"{dtype} for the shard of device {dev}"
                )
            if data.shape != block_shape:
                raise ValueError(
                    f"Expected shard shape {block_shape} doesn't match the single device array shape "
                    f"{data.shape} (device {dev}). Shape of Array is {dtype}{list(shape)} with sharding "
                    f"{sharding!r}"
                )
            ordered.append(Shard(dev, index, data, replica_ids[dev]))
        self._init(shape, dtype, sharding, ordered, info, None)

    def _init(self, shape, dtype, sharding, shards, info, stacked, replicas_agree=False):
        self._shape = shape
        self._dtype = dtype
        self._sharding = sharding
        # None until first asked for: an Array made from a stacked value builds its Shard
        # objects only when `.shards` is read, so a call costs the same at 8 or 65536 devices.
        self._shard_list = shards
        self._stacked = stacked  # mesh-major ndarray the shard data are views of, or None
        # True when whoever built the Array already checked that replicas agree (the
        # interpreter checks out_specs' replication claims), so np.asarray need not again.
        self._replicas_agree = replicas_agree
        self.info = dict(info) if info else {"backend": "refsim"}

    @classmethod
    def _trusted(cls, shape, dtype, sharding, shards, info, stacked=None, replicas_agree=False) -> "Array":
        obj = cls.__new__(cls)
        obj._init(shape, np.dtype(dtype), sharding, shards, info, stacked, replicas_agree)
        return obj

    @classmethod
    def from_trusted_shards(cls, shape, dtype, sharding, shards: Sequence[Shard], *,
                            info: dict | None = None) -> "Array":
        """An Array from `shards` without the constructor's checks: internal, for a reader that
        built them itself from a layout it already checked, i.e. one Shard per device of the
        refsim `sharding` in its device order, each with the index and replica id that
        ``sharding.devices_indices_map(shape)`` / ``device_replica_id_map(shape)`` give and data
        of ``sharding.shard_shape(shape)`` and `dtype` (`xla_backend.convert.to_refsim` checks
        the layout once per (sharding, shape) through the constructor, then each shard's shape
        and dtype). Replicas are still compared when the global value is read."""
        return cls._trusted(tuple(shape), dtype, sharding, list(shards), info)

    @property
    def _shards(self) -> list[Shard]:
        self._check_alive()
        if self._shard_list is None:
            self._shard_list = _shards_of_stacked(self._stacked, self._sharding, self._shape)
        return self._shard_list

    # -- basic facts ----------------------------------------------------------
    shape = property(lambda self: self._shape)
    dtype = property(lambda self: self._dtype)
    sharding = property(lambda self: self._sharding)
    ndim = property(lambda self: len(self._shape))
    size = property(lambda self: int(np.prod(self._shape, dtype=np.int64)))

    @property
    def shards(self) -> list[Shard]:
        """One Shard per device, in the sharding's device order."""
        return list(self._shards)

    addressable_shards = shards  # JAX's name

    # -- donation --------------------------------------------------------------
    def delete(self) -> None:
        """Consume the array (`jax.Array.delete`; `refsim.jit(..., donate_argnums=...)` does it to a
        donated argument): reading its value or its shards afterwards raises RuntimeError, as JAX's does."""
        self._deleted = True

    def is_deleted(self) -> bool:
        return getattr(self, "_deleted", False)

    def _check_alive(self) -> None:
        if getattr(self, "_deleted", False):
            raise RuntimeError(f"Array has been deleted with shape={self._dtype}{list(self._shape)}: it was "
                               "donated (donate_argnums) or deleted; use the program's outputs instead.")

    @property
    def is_fully_replicated(self) -> bool:
        return self._sharding.is_fully_replicated

    def shard(self, device_id: int) -> Shard:
        """The Shard on `device_id`."""
        if self._shard_list is None:  # one device's shard without building all of them
            layout = _stacked_layout(self._sharding, self._shape)
            k = layout.position.get(int(device_id))
            if k is not None:
                return Shard(layout.device_ids[k], layout.indices[k], self._stacked[layout.positions[k]],
                             layout.replica_ids[k])
        for s in self._shards:
            if s.device_id == device_id:
                return s
        raise ValueError(
            f"device {device_id} holds no shard of this Array; its devices are "
            f"{[s.device_id for s in self._shards]}."
        )

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of unsized object")
        return self._shape[0]

    def __repr__(self):
        return f"refsim.Array(shape={self._shape}, dtype={self._dtype}, sharding={self._sharding!r})"

    # -- the global value ------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        """The global value; ReplicationError if devices holding the same block disagree."""
        self._check_alive()
        if copy is False:
            raise ValueError("refsim.Array assembles its global value, so np.asarray(arr, copy=False) cannot avoid a copy.")
        unreduced = getattr(getattr(self._sharding, "spec", None), "unreduced", None)
        if unreduced:  # JAX refuses to read partial sums as a global value; so does refsim
            from refsim import compat

            raise compat.unreduced_read_error(
                f"cannot read a refsim.Array unreduced over mesh axes {sorted(unreduced)} "
                f"(sharding {self._sharding!r}) as one global value: each device holds a partial "
                "sum, and JAX refuses this read too. Reduce it first, e.g. "
                "jax.reshard(x, P(...)) without unreduced inside refsim.jit, or read the partial "
                "sums per device with x.addressable_shards.")
        if _stackable(self._sharding):
            value = self._assemble_stacked()
        else:
            value = self._assemble_generic()
        if copy and (value.base is not None or not value.flags.writeable):
            value = value.copy()     # np.array(arr): a copy of its own, not a view of the shards
        return value if dtype is None else value.astype(dtype)

    def _assemble_stacked(self) -> np.ndarray:
        if self._stacked is None:
            # shards held apart (e.g. read off XLA's devices): one copy into the global buffer,
            # not a stacked copy and then a transposed one
            return self._assemble_generic()
        mesh = self._sharding.mesh
        stacked = self.to_stacked(mesh)
        if not self._replicas_agree:
            bad = stacking.first_replica_mismatch(stacked, mesh, self._sharding.spec)
            if bad is not None:
                self._raise_replication(*bad)
        return stacking.stacked_to_global(stacked, mesh, self._sharding.spec)

    def _assemble_generic(self) -> np.ndarray:
        """Each distinct block written once into one global buffer (replicas checked against the
        first holder of their block); when one block is the whole array (fully replicated), a
        read-only view of its data, no copy."""
        shards = self._shards
        full = tuple((0, n) for n in self._shape)
        if shards and all(_normalize_index(s.index, self._shape) == full for s in shards):
            first = shards[0]
            for s in shards[1:]:
                self._check_replica(first, s)
            view = np.asarray(first.data).view()
            view.setflags(write=False)
            return view
        out = np.empty(self._shape, dtype=self._dtype)
        owner: dict[tuple, Shard] = {}
        for s in shards:
            key = _normalize_index(s.index, self._shape)
            first = owner.get(key)
            if first is None:
                owner[key] = s
                out[s.index] = s.data
                continue
            self._check_replica(first, s)
        return out

    def _check_replica(self, first: Shard, s: Shard) -> None:
        """ReplicationError unless `s` holds what `first` holds (NaN equal to NaN)."""
        if np.array_equal(first.data, s.data):
            return
        diff = stacking.differing(first.data, s.data)
        if diff.any():
            local = tuple(int(i) for i in np.argwhere(diff)[0])
            self._raise_replication(first.device_id, s.device_id, local)

    def _raise_replication(self, dev_a: int, dev_b: int, local: tuple):
        """ReplicationError naming both devices and the first differing global index."""
        a, b = self.shard(dev_a), self.shard(dev_b)
        gidx = _global_index(a.index, local, self._shape)
        err = ReplicationError(
            f"replicas disagree: devices {dev_a} and {dev_b} both hold block {a.index!r} of the global "
            f"array (shape {self._shape}, sharding {self._sharding!r}) but differ first at global index "
            f"{gidx}: device {dev_a} has {a.data[local].tolist()!r}, device {dev_b} has "
            f"{b.data[local].tolist()!r}. A value laid out with replicas must be identical on every "
            "replica; check the out_specs (an axis the spec does not name means 'replicated over it')."
        )
        err.devices, err.index = (dev_a, dev_b), gidx
        raise err

    # -- mesh-major stacked form ----------------------------------------------------
    @classmethod
    def from_stacked(cls, stacked, mesh: Mesh, spec, *, info: dict | None = None,
                     replicas_checked: bool = False) -> "Array":
        """The Array whose device at mesh position p holds `stacked[p]` (a view, no copy).

        `stacked` has shape `mesh.axis_sizes + local_shape`, with size-1 mesh
        dimensions allowed (the value is invariant there; read as broadcast
        views). The global array is `NamedSharding(mesh, spec)`'s tiling of the
        local blocks, as `jax.shard_map`'s out_specs; devices along axes `spec`
        leaves unnamed are replicas, and each keeps its own data. `replicas_checked=True`
        says the caller has verified that those replicas agree (np.asarray then skips the
        check). Costs O(1) Python whatever the number of devices: Shards are built when
        first read.
        """
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh must be a refsim.Mesh with device ids, got {type(mesh).__name__}: {mesh!r}.")
        sharding = NamedSharding(mesh, spec if isinstance(spec, PartitionSpec) else PartitionSpec(*spec))
        stacking.check_concrete_spec(sharding.spec, "from_stacked")
        stacked = stacking.broadcast_stacked(np.asarray(stacked), mesh)
        local = stacked.shape[mesh.ndim:]
        if len(sharding.spec) > len(local):
            raise ValueError(
                f"spec {sharding.spec!r} has {len(sharding.spec)} entries but the local blocks "
                f"(stacked.shape[{mesh.ndim}:] = {local}) have rank {len(local)}; drop trailing entries."
            )
        counts = sharding.num_shards(len(local))
        shape = tuple(n * c for n, c in zip(local, counts))
        return cls._trusted(shape, stacked.dtype, sharding, None, info, stacked, bool(replicas_checked))

    def to_stacked(self, mesh: Mesh) -> np.ndarray:
        """`mesh.axis_sizes + shard_shape` ndarray of each device's own data (shard_map in_specs view)."""
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh must be a refsim.Mesh with device ids, got {type(mesh).__name__}: {mesh!r}.")
        if self._stacked is not None and (self._sharding.mesh is mesh or self._sharding.mesh == mesh):
            return self._stacked
        have = {s.device_id for s in self._shards}
        if set(mesh.device_set) != have:
            raise ValueError(
                f"to_stacked(mesh) needs a mesh over exactly this Array's devices {sorted(have)}, but the "
                f"mesh has devices {sorted(mesh.device_set)}; pass the mesh of arr.sharding."
            )
        by_id = {s.device_id: s.data for s in self._shards}
        block = self._shards[0].data.shape
        return np.stack([by_id[d] for d in mesh.device_ids.ravel().tolist()]).reshape(mesh.axis_sizes + block)


def _global_index(index: tuple, local: tuple, shape: tuple) -> tuple:
    """The global coordinates of element `local` of the block at `index`."""
    out, k = [], 0
    for i, n in zip(index, shape):
        if isinstance(i, slice):
            out.append(i.indices(n)[0] + local[k])
            k += 1
        else:
            out.append(int(i))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Per-device facts of one (NamedSharding, shape), in mesh row-major order."""

    device_ids: list
    indices: list
    replica_ids: list
    positions: list  # mesh coordinates (tuples), row-major
    position: dict  # device id -> row-major mesh position


@functools.lru_cache(maxsize=64)  # a 65536-device layout holds a few MiB of index tuples
def _stacked_layout(sharding: NamedSharding, shape: tuple) -> _Layout:
    """Device ids, indices and replica ids of `sharding` for `shape`, computed once with NumPy.

    Every device's index is one of `num_shards[d]` slices per dimension, so the slices
    are built per dimension and picked by the block-index grid.
    """
    mesh = sharding.mesh
    n, nd = mesh.size, len(shape)
    block = sharding.shard_shape(shape)
    counts = sharding.num_shards(nd)
    grid = sharding.block_index_grid(nd).reshape(n, nd)
    per_dim = [[slice(None)] if c == 1 else [slice(b * k, (b + 1) * k) for b in range(c)]
               for k, c in zip(block, counts)]
    cols = [grid[:, d] if counts[d] > 1 else np.zeros(n, np.int64) for d in range(nd)]
    indices = list(zip(*[np.asarray(per_dim[d], dtype=object)[cols[d]].tolist() for d in range(nd)])) \
        if nd else [()] * n
    ids = mesh.device_ids.ravel().tolist()
    return _Layout(ids, indices, sharding.replica_id_grid().ravel().tolist(), list(np.ndindex(*mesh.axis_sizes)),
                   dict(zip(ids, range(n))))


def _shards_of_stacked(stacked: np.ndarray, sharding: NamedSharding, shape: tuple) -> list[Shard]:
    """One Shard per device, each a view of `stacked` at the device's mesh position."""
    layout = _stacked_layout(sharding, shape)
    return [Shard(d, i, stacked[p], r) for d, i, r, p in
            zip(layout.device_ids, layout.indices, layout.replica_ids, layout.positions)]


def device_put(x, sharding) -> Array:
    """Lay out `x` (array-like, or an Array: resharded via its global value) by `sharding`.

    As `jax.device_put(x, sharding)`: device d holds `x[sharding.devices_indices_map(shape)[d]]`.
    Onto a sharding with `unreduced` axes each device holds a partial sum, as JAX puts it: what
    it already held under `x`'s own NamedSharding (a NumPy value counts as replicated), zeros
    elsewhere (`refsim.layouts.unreduced.decompose`).
    `x` gets JAX's canonical dtype (64-bit -> 32-bit unless x64 is on); non-numeric, None and
    ragged inputs are rejected as `refsim.values.as_jax_array` says, except NumPy's StringDType
    arrays, which `jax.device_put` places too (data movement only: no refsim program takes them).
    The data is copied once and made read-only; the shards are views of it.
    """
    return put(x, sharding, copy=True)


def put(x, sharding, *, copy: bool) -> Array:
    """`device_put`; with ``copy=False`` the shards are read-only views of `x` itself (for a value
    nobody else writes to: refsim's interpreter places the results it computed this way)."""
    sharding = _as_sharding(sharding)
    if _stackable(sharding) and sharding.spec.unreduced:
        return _put_unreduced(x, sharding)
    value = as_jax_array(x, arg="x", api="refsim.device_put", strings=True)
    if copy and (not isinstance(x, np.ndarray) or np.may_share_memory(value, x)):
        value = np.array(value, copy=True)       # else as_jax_array's dtype conversion made it new
    else:
        value = value.view()                     # read-only flag on a view: `x` stays as it was
    value.setflags(write=False)
    info = None  # the result is refsim's placement, whatever produced x
    if _stackable(sharding):
        stacking.check_concrete_spec(sharding.spec, "device_put")
        sharding.shard_shape(value.shape)  # rank / divisibility errors, as JAX's
        stacked = stacking.global_to_stacked(value, sharding.mesh, sharding.spec)
        return Array._trusted(value.shape, value.dtype, sharding, None, info, stacked, True)
    index_map = sharding.devices_indices_map(value.shape)
    rid = sharding.device_replica_id_map(value.shape)
    shards = [Shard(d, idx, value[idx], rid[d]) for d, idx in index_map.items()]
    return Array._trusted(value.shape, value.dtype, sharding, shards, info)


def _put_unreduced(x, sharding: NamedSharding) -> Array:
    """`device_put` onto a sharding unreduced over some mesh axes (see `device_put`)."""
    from refsim.layouts import unreduced

    mesh, spec = sharding.mesh, sharding.spec
    src = getattr(getattr(x, "sharding", None), "spec", None)
    if getattr(src, "unreduced", None):
        if not (isinstance(x, Array) and isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh
                and x.sharding.spec.unreduced == spec.unreduced):
            raise ValueError(
                f"device_put of a value unreduced over {sorted(src.unreduced)} onto {sharding!r}: "
                "only a move between layouts unreduced over the same axes of the same mesh keeps the "
                "partial sums; reduce it first (jax.reshard(x, P(...)) inside refsim.jit).")
        parts = unreduced.partial_sums(np.asarray(x.to_stacked(mesh)), mesh, x.sharding.spec)
    else:
        value = as_jax_array(x, arg="x", api="refsim.device_put")
        names = getattr(getattr(getattr(x, "sharding", None), "mesh", None), "axis_names", None)
        same_mesh = names is not None and tuple(names) == tuple(mesh.axis_names)
        parts = unreduced.decompose(value, src if same_mesh else None, mesh, spec.unreduced, spec)
    shape = parts.shape[mesh.ndim:]
    sharding.shard_shape(shape)  # rank / divisibility errors, as JAX's
    stacked = unreduced.stacked_of_partials(parts, mesh, spec)
    stacked.setflags(write=False)
    return Array._trusted(shape, stacked.dtype, sharding, None, None, stacked, True)


def _check_dtype(values: Sequence[np.ndarray], dtype, fname: str) -> np.dtype:
    if dtype is None:
        if not values:
            raise ValueError(f"If the Array has no shards, `dtype` must be provided via the `dtype` argument to `refsim.{fname}`.")
        return values[0].dtype
    dtype = np.dtype(dtype)
    if values and values[0].dtype != dtype:
        raise ValueError(
            f"If `dtype` is provided to `refsim.{fname}`, it must match the dtype of the shards. "
            f"Got dtype={dtype} and shard dtype={values[0].dtype}`."
        )
    return dtype


def without_trailing_nones(sharding, ndim: int):
    """A NamedSharding whose spec is longer than `ndim` only by None entries, cut to `ndim`: JAX's
    `make_array_from_callback` (and `lax.full(..., sharding=)`, built on it) accepts such a spec
    where `device_put` and `jit` reject it, and lays the array out as the shorter spec does."""
    spec = getattr(sharding, "spec", None)
    if not isinstance(sharding, NamedSharding) or spec is None or len(spec) <= ndim:
        return sharding
    if any(e is not None for e in spec[ndim:]):
        return sharding          # the rank error stands (JAX fails on it with an IndexError)
    cut = type(spec)(*spec[:ndim], unreduced=spec.unreduced, reduced=spec.reduced)
    return NamedSharding(sharding.mesh, cut, memory_kind=sharding.memory_kind,
                         _logical_device_ids=sharding._logical_device_ids)


def make_array_from_callback(shape, sharding, data_callback: Callable[[tuple], Any], dtype=None) -> Array:
    """An Array whose device d holds `data_callback(index_d)`, as `jax.make_array_from_callback`.

    The callback gets each device's index from `devices_indices_map(shape)`; for
    a fully replicated sharding it is called once with `(slice(None),) * ndim`. As JAX's, a
    spec longer than the rank by trailing None entries is accepted (the array gets the spec cut
    to its rank: the same placement).
    """
    sharding = without_trailing_nones(_as_sharding(sharding), len(tuple(shape)))
    shape = tuple(int(d) for d in shape)
    index_map = sharding.devices_indices_map(shape)
    def call(idx):
        return as_jax_array(data_callback(idx), arg=f"data_callback({idx!r})",
                            api="refsim.make_array_from_callback")

    if sharding.is_fully_replicated:
        once = call((slice(None),) * len(shape))
        values = [once] * len(index_map)
    else:
        values = [call(idx) for idx in index_map.values()]
    if dtype is not None:  # JAX canonicalises the requested dtype too (float64 -> float32, x64 off)
        asked = check_numeric_dtype(dtype, arg="dtype", api="refsim.make_array_from_callback")
        dtype = canonical_dtype(asked)
        if dtype != asked:
            import warnings

            warnings.warn(f"Explicitly requested dtype {asked} requested in refsim.make_array_from_callback is not "
                          f"available, and will be truncated to dtype {dtype} (as in JAX). To enable more dtypes, set "
                          "the jax_enable_x64 configuration option.", UserWarning, stacklevel=2)
    dtype = _check_dtype(values, dtype, "make_array_from_callback")
    shards = [Shard(d, idx, v) for (d, idx), v in zip(index_map.items(), values)]
    return Array(shape, dtype, sharding, shards)


def make_array_from_single_device_arrays(shape, sharding, arrays, *, dtype=None) -> Array:
    """An Array from per-device blocks, as `jax.make_array_from_single_device_arrays`.

    `arrays` is a list/tuple in the order of `sharding.devices_indices_map(shape)`,
    or of `refsim.Shard`s / single-device JAX arrays (matched by their device id),
    or a dict {device_id: block}. A spec longer than the rank by trailing None entries is
    accepted, as JAX's is (see `make_array_from_callback`).
    """
    sharding = without_trailing_nones(_as_sharding(sharding), len(tuple(shape)))
    shape = tuple(int(d) for d in shape)
    index_map = sharding.devices_indices_map(shape)
    if isinstance(arrays, dict):
        pairs = [(int(d), a) for d, a in arrays.items()]
    elif isinstance(arrays, (list, tuple)):
        order = list(index_map)  # plain blocks are taken in this order; extras get ids no sharding has
        pairs = [(_device_of(a, order[k] if k < len(order) else -1 - k), a) for k, a in enumerate(arrays)]
    else:
        raise TypeError(
            "refsim.make_array_from_single_device_arrays `arrays` argument must be a list or tuple, "
            f"but got {type(arrays)}."
        )
    values = [np.asarray(a.data if isinstance(a, Shard) else a) for _, a in pairs]
    dtype = _check_dtype(values, dtype, "make_array_from_single_device_arrays")
    shards = [Shard(d, index_map.get(d, ()), v) for (d, _), v in zip(pairs, values)]
    return Array(shape, dtype, sharding, shards)


def _device_of(a, fallback: int) -> int:
    """The device of a Shard or a single-device JAX array; `fallback` for a plain block."""
    if isinstance(a, Shard):
        return a.device_id
    devs = getattr(a, "devices", None)
    if callable(devs) and not isinstance(a, np.ndarray):
        ds = devs()
        if len(ds) == 1:
            return next(iter(ds)).id
    return fallback
