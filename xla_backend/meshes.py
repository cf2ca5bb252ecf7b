"""Meshes over the real devices JAX has, in any device order.

A refsim `Mesh` names devices by integer id; on the XLA side that id is the JAX
device's ``.id`` (as `refsim.Mesh.from_jax` reads it), so one refsim mesh means
the same placement on both sides and `jax_mesh` is a lookup by id.
"""
from __future__ import annotations

import functools

import numpy as np

from refsim.layouts.mesh import Mesh
from xla_backend import platform

ORDERS = ("default", "reversed", "transposed", "random")


def device_order(shape, order="default") -> np.ndarray:
    """Positions into the device list, arranged in the mesh `shape`, for a named order.

    "default": row-major 0..n-1 (as `jax.sharding.Mesh(np.array(devices).reshape(shape))`);
    "reversed": n-1..0; "transposed": the default grid of the reversed shape, transposed
    (so the first mesh axis varies fastest; equals "default" for 1-D meshes);
    ("random", seed): a seeded permutation (numpy's default_rng).
    """
    shape = tuple(int(s) for s in shape)
    n = int(np.prod(shape, dtype=np.int64))
    if isinstance(order, str):
        if order == "default":
            return np.arange(n).reshape(shape)
        if order == "reversed":
            return np.arange(n)[::-1].reshape(shape)
        if order == "transposed":
            return np.arange(n).reshape(shape[::-1]).T.copy()
        if order == "random":
            raise ValueError(
                "order='random' needs a seed so the mesh can be rebuilt: pass order=('random', seed)."
            )
    elif isinstance(order, tuple) and len(order) == 2 and order[0] == "random":
        seed = order[1]
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
            raise TypeError(f"order=('random', {seed!r}): the seed must be an int.")
        return np.random.default_rng(int(seed)).permutation(n).reshape(shape)
    raise ValueError(
        f"order={order!r} is not a device order; use one of 'default', 'reversed', "
        "'transposed', ('random', seed), or an explicit array of device ids."
    )


def _devices_by_id() -> dict:
    return {d.id: d for d in platform.require()}


def mesh(shape, names, order="default", *, axis_types=None) -> Mesh:
    """A refsim Mesh over JAX's devices (`jax.devices()`), arranged in `order`.

    `order` is a named order (see `device_order`) or an explicit int array/sequence of
    JAX device ids (of the mesh's shape, or flat with prod(shape) entries). Raises
    ValueError, as `jax.make_mesh` does, when JAX has fewer devices than the mesh needs.
    """
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    n = int(np.prod(shape, dtype=np.int64))
    if isinstance(order, (str, tuple)) and (isinstance(order, str) or (order and order[0] == "random")):
        devs = platform.require(n)
        ids = np.asarray([d.id for d in devs[:n]], dtype=np.int64)[device_order(shape, order)]
    else:
        ids = np.asarray(order)
        if ids.dtype.kind not in "iu":
            raise TypeError(
                f"order={order!r}: explicit device ids must be integers (JAX device .id values)."
            )
        if ids.size != n:
            raise ValueError(
                f"order has {ids.size} device ids but mesh shape {shape} needs {n}; give one id "
                "per mesh position."
            )
        ids = ids.reshape(shape).astype(np.int64)
        _check_ids(ids)
    return Mesh(shape, names, device_ids=ids, axis_types=axis_types)


def _check_ids(ids: np.ndarray) -> None:
    have = _devices_by_id()
    missing = sorted({int(i) for i in ids.ravel()} - set(have))
    if missing:
        raise ValueError(
            f"device ids {missing} are not JAX devices; JAX has ids {sorted(have)}. Build the "
            "mesh with xla_backend.mesh(shape, names, order=...) or use ids from jax.devices()."
        )


def jax_devices(ids) -> np.ndarray:
    """An object ndarray of the JAX devices with the given ids (same shape as `ids`)."""
    ids = np.asarray(ids, dtype=np.int64)
    _check_ids(ids)
    have = _devices_by_id()
    out = np.empty(ids.shape, dtype=object)
    for pos, i in np.ndenumerate(ids):
        out[pos] = have[int(i)]
    return out


@functools.lru_cache(maxsize=256)
def _jax_mesh_cached(refsim_mesh: Mesh):
    from refsim import compat as _compat

    return _compat.make_jax_mesh(jax_devices(refsim_mesh.device_ids), refsim_mesh.axis_names,
                                 refsim_mesh.axis_types)


def jax_mesh(refsim_mesh):
    """The `jax.sharding.Mesh` whose device at each position has the refsim mesh's id there."""
    if not isinstance(refsim_mesh, Mesh):
        import jax

        if isinstance(refsim_mesh, jax.sharding.Mesh):
            return refsim_mesh
        raise TypeError(
            f"mesh must be a refsim.Mesh (with device ids), got {type(refsim_mesh).__name__}; "
            "build one with xla_backend.mesh(shape, names)."
        )
    return _jax_mesh_cached(refsim_mesh)
