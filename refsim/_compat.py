"""Every difference between supported JAX versions (0.10 … 0.12+) lives here.

Other modules import JAX internals only through this module, so a JAX upgrade
touches one file.
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def jax_version() -> tuple[int, ...]:
    import jax

    return tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())


def _jax_axis_type(t):
    from jax.sharding import AxisType as JaxAxisType

    return getattr(JaxAxisType, t.name if hasattr(t, "name") else str(t))


def make_abstract_mesh(axis_sizes, axis_names, axis_types=None):
    """A `jax.sharding.AbstractMesh` for the given sizes, names and refsim/JAX axis types."""
    from jax.sharding import AbstractMesh

    kw = {}
    if axis_types is not None:
        kw["axis_types"] = tuple(_jax_axis_type(t) for t in axis_types)
    return AbstractMesh(tuple(axis_sizes), tuple(axis_names), **kw)


def make_jax_mesh(devices, axis_names, axis_types=None):
    """A `jax.sharding.Mesh` over an ndarray of JAX devices."""
    from jax.sharding import Mesh

    kw = {}
    if axis_types is not None:
        kw["axis_types"] = tuple(_jax_axis_type(t) for t in axis_types)
    return Mesh(devices, tuple(axis_names), **kw)
