"""xla_backend: run refsim's programs on real XLA through JAX.

`shard_map`, `pmap`, `jit` and `device_put` take the same arguments as their refsim
twins and return refsim.Array values copied off each device. Importing this package
does not start JAX: everything that needs it loads on first attribute access, so
`xla_backend.platform.configure(...)` can still choose the platform and device count.
"""
from __future__ import annotations

import importlib

from xla_backend import platform

_LAZY = {
    "shard_map": "xla_backend.run",
    "pmap": "xla_backend.run",
    "jit": "xla_backend.run",
    "device_put": "xla_backend.run",
    "mesh": "xla_backend.meshes",
    "jax_mesh": "xla_backend.meshes",
    "jax_devices": "xla_backend.meshes",
    "device_order": "xla_backend.meshes",
    "to_refsim": "xla_backend.convert",
    "from_refsim": "xla_backend.convert",
    "to_jax_sharding": "xla_backend.convert",
    "from_jax_sharding": "xla_backend.convert",
    "stats": "xla_backend.cache",
    "reset_stats": "xla_backend.cache",
    "clear_cache": "xla_backend.cache",
    "info": "xla_backend.provenance",
    "gather": "xla_backend.distributed",
    "LocalResult": "xla_backend.distributed",
    "launch": "xla_backend.launch",
}

__all__ = sorted([*_LAZY, "platform", "configure", "PlatformError"])

configure = platform.configure
PlatformError = platform.PlatformError


def __getattr__(name):
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'xla_backend' has no attribute {name!r}") from None
    mod = importlib.import_module(module)
    value = mod if module.rsplit(".", 1)[1] == name else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
