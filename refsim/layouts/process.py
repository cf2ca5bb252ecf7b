"""Per-process views of a sharding: who owns each device, and host-local <-> global data.

In a multi-process JAX run every device belongs to one process (`device.process_index`)
and each process addresses only its own devices. refsim simulates any number of
processes without starting them: a `ProcessMap` gives the process of each device id, and
every view takes the process to look from. The rules follow JAX:
`Sharding.is_fully_addressable` / `addressable_devices`, `Mesh.local_mesh`
(`jax/_src/mesh.py`: the process's devices must form a sub-cube of the mesh),
`get_process_index_and_count`, `local_to_global_shape` and `num_addressable_indices`
(`jax/_src/sharding_impls.py`), `jax.make_array_from_process_local_data`
(`jax/_src/array.py`), and `multihost_utils.host_local_array_to_global_array` /
`global_array_to_host_local_array` (local shape = global shape with each sharded dim
divided by how many processes split it).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from refsim import compat
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec


class NonUniformShardingError(ValueError):
    """The processes of a sharding do not hold equal, disjoint-or-identical slices of a dimension."""


class ProcessMap:
    """Device id -> process index for a simulated multi-process run."""

    def __init__(self, mapping: Mapping[int, int]):
        self._of = {int(d): int(p) for d, p in dict(mapping).items()}
        bad = {d: p for d, p in self._of.items() if p < 0 or d < 0}
        if bad:
            raise ValueError(f"ProcessMap got negative device ids or process indices {bad}; both must be >= 0.")
        self._ids = np.array(sorted(self._of), dtype=np.int64)
        self._procs = np.array([self._of[d] for d in self._ids.tolist()], dtype=np.int64)

    @classmethod
    def contiguous(cls, device_ids, num_processes: int) -> "ProcessMap":
        """Devices sorted by id, split into `num_processes` equal consecutive blocks (as JAX
        numbers the devices of a multi-process CPU or GPU run: process p owns the p-th block)."""
        ids = sorted(int(i) for i in np.asarray(device_ids).ravel())
        if not isinstance(num_processes, (int, np.integer)) or num_processes < 1 or len(ids) % num_processes:
            raise ValueError(
                f"num_processes={num_processes!r} must be a positive int dividing the {len(ids)} devices; "
                "every process holds the same number of devices."
            )
        k = len(ids) // int(num_processes)
        return cls({d: i // k for i, d in enumerate(ids)})

    @classmethod
    def from_jax(cls, devices=None) -> "ProcessMap":
        """The process of every JAX device (`jax.devices()` by default)."""
        if devices is None:
            import jax

            devices = jax.devices()
        return cls({d.id: d.process_index for d in devices})

    # -- basic facts -------------------------------------------------------------------
    @property
    def num_processes(self) -> int:
        return len(set(self._of.values()))

    @property
    def process_indices(self) -> tuple[int, ...]:
        return tuple(sorted(set(self._of.values())))

    def process_of(self, device_id: int) -> int:
        try:
            return self._of[int(device_id)]
        except KeyError:
            raise ValueError(
                f"device id {device_id} is in no process of this ProcessMap (devices "
                f"{self._ids.tolist()}); build the map over every device of the mesh."
            ) from None

    def devices_of(self, process_index: int) -> tuple[int, ...]:
        """The device ids process `process_index` addresses, ascending."""
        return tuple(self._ids[self._procs == process_index].tolist())

    def process_grid(self, ids: np.ndarray) -> np.ndarray:
        """The process index of every device id in an int array (vectorised lookup)."""
        ids = np.asarray(ids, dtype=np.int64)
        pos = np.searchsorted(self._ids, ids)
        pos = np.clip(pos, 0, max(len(self._ids) - 1, 0))
        if ids.size and (len(self._ids) == 0 or np.any(self._ids[pos] != ids)):
            missing = sorted(set(ids.ravel().tolist()) - set(self._ids.tolist()))
            raise ValueError(f"device ids {missing} are in no process of this ProcessMap.")
        return self._procs[pos]

    def __eq__(self, other):
        return isinstance(other, ProcessMap) and self._of == other._of

    def __hash__(self):
        return hash(tuple(sorted(self._of.items())))

    def __repr__(self):
        return "ProcessMap({" + ", ".join(f"{p}: {list(self.devices_of(p))}" for p in self.process_indices) + "})"

    # -- addressability ----------------------------------------------------------------
    def _check_process(self, process_index: int) -> int:
        if process_index not in self.process_indices:
            raise ValueError(
                f"process_index={process_index!r} is not a process of {self!r}; use one of "
                f"{list(self.process_indices)}."
            )
        return int(process_index)

    def addressable_devices(self, sharding, process_index: int) -> frozenset[int]:
        """Devices of `sharding` (or a Mesh) that process `process_index` addresses."""
        self._check_process(process_index)
        ids = _placement_ids(sharding)
        return frozenset(ids[self.process_grid(ids) == process_index].tolist())

    def is_fully_addressable(self, sharding, process_index: int) -> bool:
        """True when every device of `sharding` belongs to `process_index` (JAX's property)."""
        ids = _placement_ids(sharding)
        return bool(np.all(self.process_grid(ids) == self._check_process(process_index)))

    def addressable_devices_indices_map(self, sharding, global_shape, process_index: int) -> dict:
        """`devices_indices_map` restricted to the process's devices, in the sharding's order."""
        mine = self.addressable_devices(sharding, process_index)
        return {d: idx for d, idx in sharding.devices_indices_map(global_shape).items() if d in mine}

    def local_mesh(self, mesh: Mesh, process_index: int) -> Mesh:
        """The sub-mesh of the process's devices, as `jax.sharding.Mesh.local_mesh`.

        The smallest box of mesh positions holding all the process's devices must hold
        only them; otherwise ValueError, as JAX's `_get_local_mesh`.
        """
        self._check_process(process_index)
        local = self.process_grid(mesh.device_ids) == process_index
        if not local.any():
            raise ValueError(f"process {process_index} owns no device of {mesh!r}.")
        box = []
        for k in range(mesh.ndim):
            hit = np.flatnonzero(local.any(axis=tuple(a for a in range(mesh.ndim) if a != k)))
            box.append(slice(int(hit.min()), int(hit.max()) + 1))
        if not local[tuple(box)].all():
            raise ValueError(
                "When passing host local inputs to pjit, devices connected to a single host must form a "
                f"contiguous subcube of the global device mesh; process {process_index}'s devices "
                f"{list(self.devices_of(process_index))} do not in {mesh!r}. Order the mesh so that "
                "each process's devices are one block."
            )
        sub = mesh.device_ids[tuple(box)]
        return Mesh(sub.shape, mesh.axis_names, device_ids=sub, axis_types=mesh.axis_types)

    # -- uniformity and shapes -------------------------------------------------------------
    def process_index_and_count(self, sharding, dim: int, ndim: int, process_index: int) -> tuple[int, int]:
        """(index, count) of the distinct slice sets processes hold along `dim`.

        As JAX's `get_process_index_and_count`: processes holding the same slices share an
        index; NonUniformShardingError when processes hold different numbers of slices or
        overlapping unequal sets. The index orders the distinct sets by their first slice
        (JAX leaves that order to a Python set).
        """
        self._check_process(process_index)
        if self.is_fully_addressable(sharding, process_index) or sharding.is_fully_replicated:
            return (0, 1)
        n = sharding.num_devices
        per_proc: dict[int, set] = {}
        all_slices = set()
        for d, idx in sharding.devices_indices_map((n,) * ndim).items():
            sl = idx[dim]
            key = sl.indices(n)[:2]
            per_proc.setdefault(self.process_of(d), set()).add(key)
            all_slices.add(key)
        mine = frozenset(per_proc[process_index])
        if any(len(v) != len(mine) for v in per_proc.values()):
            raise NonUniformShardingError(
                f"tensor_sharding={sharding!r} is non-uniform on dim={dim} as some processes have "
                "different number of slices."
            )
        unique = sorted({frozenset(v) for v in per_proc.values()}, key=lambda s: min(s))
        if sum(len(u) for u in unique) != len(all_slices):
            raise NonUniformShardingError(f"tensor_sharding={sharding!r} is non-uniform on dim={dim}")
        return unique.index(mine), len(unique)

    def local_to_global_shape(self, sharding, local_shape, process_index: int) -> tuple:
        """The global shape a process's local data implies; None in non-uniform dimensions."""
        out = []
        for d, n in enumerate(local_shape):
            try:
                out.append(int(n) * self.process_index_and_count(sharding, d, len(local_shape), process_index)[1])
            except NonUniformShardingError:
                out.append(None)
        return tuple(out)

    def num_addressable_indices(self, sharding, dim: int, global_shape, process_index: int) -> int:
        """How many indices of `dim` the process's devices hold, together (JAX's function)."""
        idx = self.addressable_devices_indices_map(sharding, global_shape, process_index)
        n = global_shape[dim]
        unique = {i[dim].indices(n)[:2] for i in idx.values()}
        return sharding.shard_shape(global_shape)[dim] * len(unique)


def _placement_ids(sharding) -> np.ndarray:
    if isinstance(sharding, Mesh):
        return sharding.device_ids
    if isinstance(sharding, NamedSharding):
        return sharding.placement_ids
    ds = getattr(sharding, "device_set", None)
    if ds is None:
        raise TypeError(f"{sharding!r} is not a refsim sharding or Mesh.")
    return np.array(sorted(ds), dtype=np.int64)


# -- building arrays from per-process data ------------------------------------------------------

def _per_process(local_data, processes: ProcessMap, needed) -> dict:
    if isinstance(local_data, Mapping):
        data = {int(p): np.asarray(v) for p, v in local_data.items()}
        missing = sorted(set(needed) - set(data))
        if missing:
            raise ValueError(
                f"local_data has no entry for process(es) {missing}, which own devices of the sharding; "
                "give {process_index: host-local array} for every such process."
            )
        return data
    value = np.asarray(local_data)
    return {p: value for p in needed}


def make_array_from_process_local_data(sharding: NamedSharding, local_data, global_shape=None, *,
                                       processes: ProcessMap):
    """The global refsim.Array each process's host-local data makes, as
    `jax.make_array_from_process_local_data` run on every process at once.

    `local_data` is {process_index: ndarray} (or one ndarray every process holds). Along
    a dimension where the local size equals the global size a device takes its slice
    directly; elsewhere the process's distinct slices are packed in ascending order in
    the local data. `global_shape=None` is inferred by `local_to_global_shape`.
    """
    from refsim.array import Array, Shard

    needed = sorted({processes.process_of(d) for d in _placement_ids(sharding).ravel().tolist()})
    data = _per_process(local_data, processes, needed)
    if processes.num_processes == 1:
        (only,) = data.values()
        if global_shape is not None and tuple(global_shape) != only.shape:
            raise ValueError(
                "When calling `make_array_from_process_local_data` on a single process, global_shape "
                f"should be None or equal to local_data.shape.Got global_shape={tuple(global_shape)} and "
                f"local_data.shape={only.shape}."
            )
    shapes = {}
    for p in needed:
        if global_shape is None:
            g = processes.local_to_global_shape(sharding, data[p].shape, p)
            if None in g:
                raise ValueError(
                    "Unable to compute global_shape due to non-uniform sharding. Specify global shape "
                    f"directly. Partially computed global_shape={g}."
                )
        elif None in tuple(global_shape):
            raise ValueError(f"global_shape={tuple(global_shape)} has Nones. This is not supported.")
        else:
            g = tuple(int(n) for n in global_shape)
        shapes[p] = g
    shape = shapes[needed[0]]
    if any(s != shape for s in shapes.values()):
        raise ValueError(
            f"the processes' local data imply different global shapes {shapes}; give every process "
            "local data of the same shape, or pass global_shape."
        )
    dtypes = {data[p].dtype for p in needed}
    if len(dtypes) > 1:
        raise ValueError(f"the processes' local data have different dtypes {sorted(map(str, dtypes))}.")
    block = sharding.shard_shape(shape)
    shards = []
    for p in needed:
        local = data[p]
        if local.ndim != len(shape):
            raise ValueError(f"process {p}'s local data has rank {local.ndim} but global_shape={shape}.")
        for i, (n, g) in enumerate(zip(local.shape, shape)):
            if n != g:
                have = processes.num_addressable_indices(sharding, i, shape, p)
                if have != n:
                    raise ValueError(
                        "Invalid host data, each dimension should match either global or process shape. "
                        f"In dimension {i}, the process data has {n} elements. Process addresses {have} "
                        f"elements and global_shape={shape}."
                    )
        index_map = processes.addressable_devices_indices_map(sharding, shape, p)
        starts = [sorted({idx[i].indices(shape[i])[0] for idx in index_map.values()}) for i in range(len(shape))]
        for dev, idx in index_map.items():
            sel = []
            for i, sl in enumerate(idx):
                if local.shape[i] == shape[i]:
                    sel.append(sl)
                else:
                    k = starts[i].index(sl.indices(shape[i])[0]) * block[i]
                    sel.append(slice(k, k + block[i]))
            shards.append(Shard(dev, idx, np.asarray(local[tuple(sel)])))
    return Array(shape, shards[0].data.dtype, sharding, shards)


def _check_pspec(pspec) -> PartitionSpec:
    if pspec is None:
        raise ValueError(
            "`None` is not a valid input to the pspecs argument. Please use "
            "jax.sharding.PartitionSpec() if you wanted to replicate your input."
        )
    if isinstance(pspec, PartitionSpec):
        return pspec
    if compat.is_jax_partition_spec(pspec):
        return PartitionSpec.from_jax(pspec)
    return PartitionSpec(*pspec)


def local_to_global_dims(mesh: Mesh, local: Mesh, spec: PartitionSpec, shape, to_global: bool) -> tuple:
    """`shape` converted between a process's host-local view (over its `local` mesh) and the
    global view (over `mesh`) of an array laid out by `spec`, as `jax.experimental.multihost_utils`
    does: each dimension scales by (global / local) ways it is split (`to_global`) or back.
    ValueError when a dimension does not divide."""
    out = []
    for d, n in enumerate(shape):
        axes = spec.axes_of(d)
        g = int(np.prod([mesh.axis_size(a) for a in axes], dtype=np.int64))
        l_ = int(np.prod([local.axis_size(a) for a in axes], dtype=np.int64))
        frm, to = (l_, g) if to_global else (g, l_)
        if n % frm:
            raise ValueError(
                f"dimension {d} of size {n} cannot be split over axes {axes} ({frm} ways); make it a "
                f"multiple of {frm}."
            )
        out.append(n // frm * to)
    return tuple(out)


def host_local_array_to_global_array(local_inputs, global_mesh: Mesh, pspec, *, processes: ProcessMap):
    """The global Array made of each process's host-local array, as
    `multihost_utils.host_local_array_to_global_array` run on every process.

    Process p's local array is laid out over its local mesh by `pspec`; the global shape
    multiplies each sharded dim by how many processes split it.
    """
    from refsim.array import Array, Shard

    spec = _check_pspec(pspec)
    owners = sorted({processes.process_of(d) for d in global_mesh.device_ids.ravel().tolist()})
    data = _per_process(local_inputs, processes, owners)
    gsh = NamedSharding(global_mesh, spec)
    shapes, shards = set(), []
    for p in owners:
        local_mesh = processes.local_mesh(global_mesh, p)
        arr = data[p]
        shapes.add(local_to_global_dims(global_mesh, local_mesh, spec, arr.shape, True))
        lmap = NamedSharding(local_mesh, spec).devices_indices_map(arr.shape)
        shards.extend((d, arr[idx]) for d, idx in lmap.items())
    if len(shapes) != 1:
        raise ValueError(f"the processes' local arrays imply different global shapes {sorted(shapes)}.")
    (shape,) = shapes
    gmap = gsh.devices_indices_map(shape)
    return Array(shape, shards[0][1].dtype, gsh, [Shard(d, gmap[d], np.asarray(v)) for d, v in shards])


def global_array_to_host_local_array(arr, global_mesh: Mesh, pspec, *, processes: ProcessMap) -> dict:
    """{process_index: host-local ndarray} of a global Array, as
    `multihost_utils.global_array_to_host_local_array` run on every process.

    Each process gets the blocks its devices hold (after laying `arr` out by
    `NamedSharding(global_mesh, pspec)`), assembled over its local mesh.
    """
    from refsim.array import Array, device_put

    spec = _check_pspec(pspec)
    gsh = NamedSharding(global_mesh, spec)
    if not (isinstance(arr, Array) and arr.sharding == gsh):
        arr = device_put(np.asarray(arr), gsh)
    out = {}
    for p in sorted({processes.process_of(d) for d in global_mesh.device_ids.ravel().tolist()}):
        local_mesh = processes.local_mesh(global_mesh, p)
        lshape = local_to_global_dims(global_mesh, local_mesh, spec, arr.shape, False)
        local = np.empty(lshape, dtype=arr.dtype)
        for d, idx in NamedSharding(local_mesh, spec).devices_indices_map(lshape).items():
            local[idx] = arr.shard(d).data
        out[p] = local
    return out
