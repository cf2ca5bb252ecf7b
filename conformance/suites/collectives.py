"""The collectives suite: every collective of the engine with every parameter JAX accepts.

Draws `examples` calls per collective with `conformance.strategies.collective_calls` over
meshes of up to `devices` devices (1-4 axes, every device order), covering axis tuples in
and out of mesh order, `axis_index_groups` of every kind, every `perm` kind, `tiled`,
gather / scatter / split / concat dimensions, pbroadcast sources, pmap and shard_map.
"""
from __future__ import annotations

import zlib

from conformance.suites.base import draw, group_tasks

NAME = "collectives"


def strategy(family: str, dtype: str | None, devices: int):
    """The calls of one collective (and dtype): what a failure of that case is shrunk within."""
    from conformance.strategies import collective_calls, meshes
    from conformance.strategies.arrays import DEFAULT_DTYPES

    return collective_calls(meshes(max_devices=devices), collectives=(family,),
                            dtypes=(dtype,) if dtype else DEFAULT_DTYPES)


def tasks(*, examples: int, seed: int, devices: int) -> list:
    from conformance.strategies import COLLECTIVES

    out = []
    for name in COLLECTIVES:
        s = seed ^ zlib.crc32(name.encode())
        calls = draw(strategy(name, None, devices), examples, s)
        out += group_tasks(NAME, calls, seed=s, shrink_of=lambda c: (NAME, c.family, c.dtype))
    return out
