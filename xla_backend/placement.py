"""Putting one value on devices and reading results back, for every entry point.

Which sharding each argument gets (specs and shardings as pytree prefixes of the
arguments) is the staging step's business, `xla_backend.staging`.
"""
from __future__ import annotations

import numpy as np

from xla_backend import convert


def canonical_numpy(x) -> np.ndarray:
    """`x` as an ndarray of the dtype JAX would use (float64 -> float32 without x64)."""
    import jax

    x = np.asarray(x)
    return x.astype(jax.dtypes.canonicalize_dtype(x.dtype), copy=False)


def to_device(x, sharding):
    """A jax.Array of `x` (NumPy, refsim.Array or jax.Array) laid out by `sharding`.

    A refsim.Array already in that layout keeps each device's own data; anything else is
    laid out from its global value. `sharding=None` keeps a refsim.Array's layout and
    places other values on the default device.
    """
    import jax

    from xla_backend.distributed import LocalResult

    if isinstance(x, LocalResult):
        x = x.jax_array
    if isinstance(x, jax.Array):
        if sharding is None:
            return x
        jsh = convert.to_jax_sharding(sharding)
        return x if x.sharding == jsh else jax.device_put(x, jsh)
    if _is_refsim_array(x):
        return convert.from_refsim(x, sharding)
    value = canonical_numpy(x)
    if sharding is None:
        return jax.device_put(value)
    return convert.put_global(value, sharding)


def keeps_layout(x) -> bool:
    """True for values that already sit on devices in a layout of their own."""
    import jax

    from xla_backend.distributed import LocalResult

    return _is_refsim_array(x) or isinstance(x, (jax.Array, LocalResult))


def _is_refsim_array(x) -> bool:
    return type(x).__name__ == "Array" and type(x).__module__.startswith("refsim")


def avals_key(jargs) -> tuple:
    return tuple((tuple(a.shape), str(a.dtype), a.sharding, getattr(a, "weak_type", False))
                 for a in jargs)


def results(outs, info):
    """Each output jax.Array as a refsim.Array (or, multi-process, a LocalResult)."""
    import jax

    from xla_backend.distributed import LocalResult

    def one(a):
        if a.is_fully_addressable:
            return convert.to_refsim(a, info=dict(info))
        return LocalResult.of(a, info=dict(info))

    return jax.tree_util.tree_map(one, outs)
