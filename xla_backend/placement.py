"""Putting program inputs on devices and reading results back, for every entry point.

Specs and shardings are pytree prefixes of the argument tuple, as in `jax.shard_map`
(``in_specs``) and `jax.jit` (``in_shardings``): a single leaf applies to every
argument below it.
"""
from __future__ import annotations

import numpy as np

from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec
from xla_backend import convert


def is_spec(x) -> bool:
    import jax

    return x is None or isinstance(x, (PartitionSpec, jax.sharding.PartitionSpec))


def is_sharding(x) -> bool:
    import jax

    return x is None or isinstance(x, jax.sharding.Sharding) or hasattr(x, "devices_indices_map")


def spec_to_jax(spec):
    if spec is None or not isinstance(spec, PartitionSpec):
        return spec
    return spec.to_jax()


def spec_to_refsim(spec):
    if spec is None:
        return PartitionSpec()
    return spec if isinstance(spec, PartitionSpec) else PartitionSpec.from_jax(spec)


def tree_key(tree, is_leaf):
    """A hashable key for a pytree of specs or shardings."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_leaf)
    return (tuple(leaves), treedef)


def broadcast_prefix(prefix, args: tuple, is_leaf, what: str) -> list:
    """One prefix leaf per leaf of `args`, as JAX matches in_specs/in_shardings to arguments."""
    import jax

    if is_leaf(prefix):
        return [prefix] * len(jax.tree_util.tree_leaves(args))
    if isinstance(prefix, list):
        prefix = tuple(prefix)
    try:
        nested = jax.tree_util.tree_map(
            lambda p, sub: [p] * len(jax.tree_util.tree_leaves(sub)), prefix, args, is_leaf=is_leaf
        )
    except ValueError as e:
        raise ValueError(
            f"{what}={prefix!r} is not a pytree prefix of the {len(args)} positional "
            f"argument(s): {e}. Give one spec per argument (a tuple) or one for all."
        ) from None
    return [p for group in jax.tree_util.tree_leaves(nested, is_leaf=lambda x: isinstance(x, list))
            for p in group]


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


def named(mesh, spec) -> NamedSharding:
    return NamedSharding(mesh, spec_to_refsim(spec))


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
