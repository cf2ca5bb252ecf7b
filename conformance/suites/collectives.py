"""The collectives suite: every collective of the engine with every parameter JAX accepts.

Draws `examples` calls per collective with `conformance.strategies.collective_calls` over
meshes of up to `devices` devices (1-4 axes, every device order), covering axis tuples in
and out of mesh order, `axis_index_groups` of every kind, every `perm` kind, `tiled`,
gather / scatter / split / concat dimensions, pbroadcast sources, pmap and shard_map. Each draw
runs with its own exact-friendly data, with special values (NaN, ±inf, -0, subnormals, the
largest finite values) and with rounding data (`conformance.suites.base.COLLECTIVE_DATA`).
"""
from __future__ import annotations

import zlib

from conformance.strategies import COLLECTIVES, collective_calls, meshes
from conformance.suites.base import COLLECTIVE_DATA, draw, flatten, group_tasks

NAME = "collectives"
# Every dtype the strategies draw by default, plus every float8 type JAX has (XLA:CPU runs
# psum / pmax / all_gather / ppermute on all five, fnuz included: jax 0.10.2 and 0.12).
DTYPES = ("float32", "int32", "float16", "bfloat16", "bool", "int8", "uint32", "complex64",
          "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz")


def strategy(family: str, dtype: str | None, devices: int):
    """The calls of one collective (and dtype): what a failure of that case is shrunk within."""
    return collective_calls(meshes(max_devices=devices), collectives=(family,),
                            dtypes=(dtype,) if dtype else DTYPES)


def task_chunks(*, examples: int, seed: int, devices: int):
    """The suite's tasks, one list per collective as it is drawn."""
    for name in COLLECTIVES:
        s = seed ^ zlib.crc32(name.encode())
        calls = draw(strategy(name, None, devices), examples, s)
        yield group_tasks(NAME, calls, seed=s, shrink_of=lambda c: (NAME, c.family, c.dtype), data=COLLECTIVE_DATA)


def tasks(*, examples: int, seed: int, devices: int) -> list:
    return flatten(task_chunks(examples=examples, seed=seed, devices=devices))
