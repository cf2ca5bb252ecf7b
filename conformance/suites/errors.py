"""The errors suite: invalid programs drawn on purpose, which both sides must reject alike.

Each draw breaks one rule JAX checks: a `perm` with a repeated source or destination or an
index out of range; `axis_index_groups` of unequal sizes, with a repeated or missing index;
in_specs naming an unknown axis, one axis twice, or not dividing the shape; a collective
over an axis name the mesh does not have. refsim and XLA must both raise, with the same
exception class (compared by the nearest of NameError / IndexError / TypeError /
ValueError / NotImplementedError in its MRO, so refsim's ValueError subclasses count).
"""
from __future__ import annotations

import functools
import zlib

import numpy as np
from hypothesis import strategies as st

from conformance.cases import Program, mesh_id
from conformance.strategies import meshes
from conformance.suites.base import CheckTask, Outcome, draw
from conformance.verdict.xfails import exception_failure
import refsim
from refsim import compat
from refsim.layouts.partition_spec import PartitionSpec as P

NAME = "errors"
KINDS = ("perm_repeated_source", "perm_repeated_destination", "perm_out_of_range", "groups_unequal",
         "groups_repeated_index", "groups_missing_index", "spec_unknown_axis", "spec_repeated_axis",
         "spec_indivisible", "collective_unknown_axis")
# The smallest mesh axis each kind can be drawn on: a permutation or group error needs 3 positions,
# an indivisible dimension an axis of 2 or more.
MIN_AXIS_SIZE = {k: 3 for k in KINDS if k.startswith(("perm", "groups"))} | {"spec_indivisible": 2}
_BASES = (NameError, IndexError, TypeError, ValueError, NotImplementedError)


def _base(exc: BaseException) -> str:
    for b in _BASES:
        if isinstance(exc, b):
            return b.__name__
    return type(exc).__name__


# Module level: st.composite reads the function's source each time it decorates one (~3 ms),
# which a closure redefined per error kind would pay for each.
@st.composite
def _invalid_case(d, devices: int, kind: str, min_size: int):
    m = d(meshes(max_axes=2, max_devices=devices, sizes=(1, 2, 3, 4)).filter(
        lambda m: max(m.axis_sizes) >= min_size))
    name = max(m.axis_names, key=m.axis_size)
    n = m.axis_size(name)
    spec, local, body = P(name), 2, None
    if kind.startswith("perm"):
        i, j = d(st.integers(0, n - 1)), d(st.integers(0, n - 1))
        k = (i + 1) % n
        perm = {"perm_repeated_source": [(i, j), (i, k)], "perm_repeated_destination": [(i, j), (k, j)],
                "perm_out_of_range": [(i, n + d(st.integers(0, 2)))]}[kind]
        body = f"jax.lax.ppermute(a, {name!r}, perm={perm!r})"
    elif kind.startswith("groups"):
        idx = list(d(st.permutations(range(n))))
        groups = {"groups_unequal": [idx[:1], idx[1:]], "groups_repeated_index": [idx[:-1] + idx[:1]],
                  "groups_missing_index": [idx[:-1]]}[kind]
        # unequal groups are valid for reductions (XLA:CPU runs them); all_gather's output shape needs equal ones
        op = "all_gather" if kind == "groups_unequal" else d(st.sampled_from(["pmax", "all_gather"]))
        body = f"jax.lax.{op}(a, {name!r}, axis_index_groups={groups!r})"
    elif kind == "spec_unknown_axis":
        spec, body = P("q"), "a * 2"
    elif kind == "spec_repeated_axis":
        spec, body = P(name, name), "a * 2"
    elif kind == "spec_indivisible":
        local = d(st.integers(1, 3))
        body = "a * 2"
        if n == 1:
            return None
    else:
        body = f"jax.lax.psum(a, {d(st.sampled_from(['q', 'batch', 'X']))!r})"
    rank = 2 if kind == "spec_repeated_axis" else 1
    shape = (n * local + (1 if kind == "spec_indivisible" else 0),) + (n * 2,) * (rank - 1)
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return Program(family=kind, source=f"def f(a):\n    return {body}\n", entry="shard_map", mesh=m,
                   args=(x,), in_specs=(spec,), out_specs=spec, labels=(("kind", kind),))


def _invalid(devices: int, kind: str):
    return _invalid_case(devices, kind, MIN_AXIS_SIZE.get(kind, 1)).filter(lambda c: c is not None)


def check_invalid(cases: list, xla) -> Outcome:
    """Both sides raise, with the same exception class, for every case. A failure's signature
    (`conformance.verdict.xfails`) blames XLA when refsim raised and XLA raised otherwise or not at all."""
    for case in cases:
        raised = {}
        for side, api in (("refsim", refsim), ("xla", xla)):
            try:
                # every case raises on purpose: JAX's traceback filtering (about a third of
                # this check's CPU) changes only tracebacks, which the check never reads
                with compat.traceback_filtering_off():
                    case.run(api)
            except Exception as e:  # noqa: BLE001 - the exception class is the result
                raised[side] = e
        where = case.describe()
        if not raised:
            return Outcome("fail", f"neither refsim nor XLA rejected this invalid program:\n{where}", len(cases),
                           {"failure": {"kind": "accepted", "side": "refsim"}})
        if len(raised) == 1:
            (side, e), = raised.items()
            other = "xla" if side == "refsim" else "refsim"
            return Outcome("fail", f"only {side} rejected it ({_base(e)}: {e}); {other} accepted it:\n{where}",
                           len(cases), {"failure": {"kind": "accepted", "side": other}})
        r, x = _base(raised["refsim"]), _base(raised["xla"])
        if r != x:
            return Outcome("fail", f"refsim raised {r}: {raised['refsim']}\nXLA raised {x}: {raised['xla']}\n{where}",
                           len(cases), {"failure": exception_failure("xla", raised["xla"])})
    return Outcome("pass", examples=len(cases))


def not_drawn(devices: int) -> list[str]:
    """The kinds no mesh of `devices` devices can express (the run's plan lists them)."""
    return [f"{NAME}/{kind}: needs a mesh axis of {need} or more devices"
            for kind, need in MIN_AXIS_SIZE.items() if devices < need]


def task_chunks(*, examples: int, seed: int, devices: int):
    """The suite's tasks, one list per error kind as it is drawn."""
    for kind in KINDS:
        if devices < MIN_AXIS_SIZE.get(kind, 1):  # `not_drawn` lists it in the plan
            continue
        groups: dict = {}
        for c in draw(_invalid(devices, kind), max(1, examples // 2), seed ^ zlib.crc32(kind.encode())):
            groups.setdefault(f"{kind}[mesh={mesh_id(c.mesh)}]", []).append(c)
        yield [CheckTask(cid, NAME, kind, "float32", functools.partial(check_invalid, cs))
               for cid, cs in groups.items()]


def tasks(*, examples: int, seed: int, devices: int) -> list:
    return flatten(task_chunks(examples=examples, seed=seed, devices=devices))
