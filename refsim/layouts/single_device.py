"""`SingleDeviceSharding`: the whole array on one device, as `jax.sharding.SingleDeviceSharding`."""
from __future__ import annotations

import numpy as np


class SingleDeviceSharding:
    """`SingleDeviceSharding(device_id)`: one shard, the whole array, on device `device_id`.

    `device_id` is an int id or a JAX device (its `.id` is used).
    """

    def __init__(self, device_id, *, memory_kind: str | None = None):
        dev = getattr(device_id, "id", device_id)
        if not isinstance(dev, (int, np.integer)) or isinstance(dev, bool):
            raise TypeError(
                f"device_id must be an int device id or a JAX device, got {device_id!r} of type "
                f"{type(device_id).__name__}."
            )
        if dev < 0:
            raise ValueError(f"device_id={int(dev)} is negative; device ids are >= 0.")
        self.device_id = int(dev)
        self.memory_kind = memory_kind

    def __eq__(self, other):
        return (isinstance(other, SingleDeviceSharding) and self.device_id == other.device_id
                and self.memory_kind == other.memory_kind)

    def __hash__(self):
        return hash(("SingleDeviceSharding", self.device_id, self.memory_kind))

    def __repr__(self):
        mk = f", memory_kind={self.memory_kind}" if self.memory_kind else ""
        return f"SingleDeviceSharding(device_id={self.device_id}{mk})"

    @property
    def device_set(self) -> frozenset[int]:
        return frozenset((self.device_id,))

    @property
    def num_devices(self) -> int:
        return 1

    @property
    def is_fully_replicated(self) -> bool:
        return True

    def shard_shape(self, global_shape) -> tuple[int, ...]:
        return tuple(int(d) for d in global_shape)

    def devices_indices_map(self, global_shape) -> dict[int, tuple]:
        """{device_id: (slice(None),) * ndim}."""
        return {self.device_id: (slice(None),) * len(tuple(global_shape))}

    def device_replica_id_map(self, global_shape=None) -> dict[int, int]:
        return {self.device_id: 0}

    @property
    def _device_assignment(self) -> tuple[int, ...]:
        return (self.device_id,)
