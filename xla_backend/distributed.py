"""Multi-process runs under `jax.distributed`: start-up, local results, gathering.

One process per host (on one machine: several processes on 127.0.0.1, CPU
collectives over gloo, see `xla_backend.launch`). Each process sees only its
addressable shards (`LocalResult`); `gather` is a collective every process calls
that gives each of them the full refsim.Array, shard by shard.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from xla_backend import convert, platform

ENV_COORDINATOR = "XLA_BACKEND_COORDINATOR"
ENV_NUM_PROCESSES = "XLA_BACKEND_NUM_PROCESSES"
ENV_PROCESS_ID = "XLA_BACKEND_PROCESS_ID"
ENV_HANDSHAKE = "XLA_BACKEND_HANDSHAKE"  # a folder: the launcher's proof that each child joined


def initialize(coordinator_address=None, num_processes=None, process_id=None, *,
               local_device_count=None, cpu_collectives="gloo", timeout_s=120):
    """Configure the platform, then `jax.distributed.initialize`.

    Arguments default to the variables `python -m xla_backend launch` sets
    (XLA_BACKEND_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID / XLA_BACKEND_DEVICES); with
    none of them set, JAX's own cluster auto-detection (Slurm, Open MPI, TPU, ...) is used.
    On CPU the cross-process collectives are `cpu_collectives` ("gloo" or "mpi"), set
    through ``jax_cpu_collectives_implementation`` before the CPU client is created.
    """
    coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR)
    if num_processes is None and os.environ.get(ENV_NUM_PROCESSES):
        num_processes = int(os.environ[ENV_NUM_PROCESSES])
    if process_id is None and os.environ.get(ENV_PROCESS_ID):
        process_id = int(os.environ[ENV_PROCESS_ID])
    platform.configure(devices=local_device_count)
    import jax

    if platform.current_platform() == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    if coordinator_address is None:
        jax.distributed.initialize(initialization_timeout=timeout_s)
    else:
        jax.distributed.initialize(coordinator_address=coordinator_address,
                                   num_processes=num_processes, process_id=process_id,
                                   initialization_timeout=timeout_s)
    _leave_handshake(jax)
    return jax.process_index(), jax.process_count()


def _leave_handshake(jax) -> None:
    """Tell `xla_backend.launch` (through the folder in XLA_BACKEND_HANDSHAKE) that this process joined."""
    import json

    folder = os.environ.get(ENV_HANDSHAKE)
    if not folder:
        return
    me = int(os.environ.get(ENV_PROCESS_ID, jax.process_index()))
    note = {"process_id": me, "pid": os.getpid(), "jax_process_id": jax.process_index(),
            "num_processes": jax.process_count(), "device_count": jax.device_count(),
            "local_device_count": jax.local_device_count(), "by": "xla_backend.distributed.initialize",
            "joined": str(jax.process_count()) == os.environ.get(ENV_NUM_PROCESSES, str(jax.process_count()))}
    path = os.path.join(folder, f"joined-{me}-{os.getpid()}.json")
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(note, fh)
        os.replace(path + ".tmp", path)
    except OSError:  # the launcher is gone or the folder was removed: nothing to tell
        pass


def shutdown() -> None:
    import jax

    jax.distributed.shutdown()


@dataclasses.dataclass
class LocalResult:
    """One process's part of a result that spans processes: its addressable shards.

    `shards` are refsim.Shard copies of this process's devices; `gather()` (collective)
    returns the whole refsim.Array on every process.
    """

    shape: tuple
    dtype: np.dtype
    sharding: object  # refsim sharding of the whole array
    shards: list
    info: dict
    jax_array: object = dataclasses.field(repr=False, default=None)

    @classmethod
    def of(cls, jax_array, *, info=None) -> "LocalResult":
        return cls(tuple(jax_array.shape), np.dtype(jax_array.dtype),
                   convert.from_jax_sharding(jax_array.sharding), convert.local_shards(jax_array),
                   dict(info or {}), jax_array)

    def gather(self):
        return gather(self)


def gather(result):
    """Every device's shard of a result, collected on every process as a refsim.Array.

    A collective: all processes must call it with the same results. Each device's block
    is stacked along a new leading dimension over all devices and all-gathered, so the
    data of each device (replicas included) arrives unchanged. Accepts LocalResult, a
    jax.Array, a refsim.Array (returned as is) or a pytree of them.
    """
    import jax

    from refsim.array import Array

    def one(r):
        if isinstance(r, Array):
            return r
        a = r.jax_array if isinstance(r, LocalResult) else r
        info = dict(r.info) if isinstance(r, LocalResult) else {}
        return _gather_array(a, info)

    return jax.tree_util.tree_map(one, result, is_leaf=lambda x: isinstance(x, LocalResult))


def _gather_array(a, info):
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from refsim.array import Array, Shard

    order = list(a.sharding.devices_indices_map(a.shape))
    block = tuple(a.sharding.shard_shape(a.shape))
    flat = Mesh(np.array(order), ("_devices",))
    stacked_sh = NamedSharding(flat, PartitionSpec("_devices"))
    bufs = [jax.device_put(s.data.reshape((1,) + block), s.device)
            for s in sorted(a.addressable_shards, key=lambda s: order.index(s.device))]
    stacked = jax.make_array_from_single_device_arrays((len(order),) + block, stacked_sh, bufs)
    everywhere = jax.jit(lambda x: x, out_shardings=NamedSharding(flat, PartitionSpec()))(stacked)
    data = np.array(everywhere.addressable_data(0), copy=True)
    sharding = convert.from_jax_sharding(a.sharding)
    indices = a.sharding.devices_indices_map(a.shape)
    replica = sharding.device_replica_id_map(a.shape)
    shards = [Shard(int(d.id), convert._plain_index(indices[d]), data[k], int(replica[d.id]))
              for k, d in enumerate(order)]
    return Array(tuple(a.shape), np.dtype(a.dtype), sharding, shards, info={**info, "gathered": True})
