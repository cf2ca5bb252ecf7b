"""The sharded suite: random whole programs over the lax op set under drawn shardings.

Each chunk draws `CHUNK` programs from `conformance.strategies.sharded_programs` (deterministic
in the run's seed); every program runs with its drawn exact-friendly data and one refill of the
same kind, so the two share one XLA executable. The number of programs is `PROGRAMS_PER_EXAMPLE`
per ``--examples`` (default 20 -> 120 programs), a budget that keeps the default run within 1.5x
of its wall time without this suite. Outputs are compared by global index with the layouts the
program states (every output has an out_sharding); see `ShardedProgram.tolerances`.

A failing program is shrunk by `shrink_case`, not by redrawing: it keeps the op graph and cuts
it down (one output, then sharding constraints and reshards made identities, then replicated
in/out shardings), each step kept only if the case still fails, so the reproducer is the
smallest op graph that shows the same disagreement.
"""
from __future__ import annotations

import dataclasses
import re
import time
import zlib

from conformance.strategies.sharded import CLASSES, assemble, make_case, sharded_programs
from conformance.suites.base import draw, group_tasks
from conformance.suites.base import flatten
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec

NAME = "sharded"
PROGRAMS_PER_EXAMPLE = 6
CHUNK = 8
DATA = ("drawn", "exact")


def strategy(family: str, dtype: str | None, devices: int):
    """Sharded programs over meshes of at most `devices` devices (`family` is "sharded"), called as
    every program class (`CLASSES`: plain, scanned layers, remat, custom_vjp / custom_jvp, host
    offload, nested shard_map, a chain of jits, donated arguments)."""
    return sharded_programs(max_devices=devices, classes=CLASSES)


def task_chunks(*, examples: int, seed: int, devices: int):
    """`examples * PROGRAMS_PER_EXAMPLE` programs, `CHUNK` at a time."""
    count = examples * PROGRAMS_PER_EXAMPLE
    for k in range(0, count, CHUNK):
        s = seed ^ zlib.crc32(f"{NAME}-{k}".encode())
        cases = draw(strategy(NAME, None, devices), min(CHUNK, count - k), s)
        yield group_tasks(NAME, cases, seed=s, shrink_of=lambda c: (NAME, c.family, c.dtype), variants=len(DATA),
                          data=DATA)


def tasks(*, examples: int, seed: int, devices: int) -> list:
    return flatten(task_chunks(examples=examples, seed=seed, devices=devices))


# -- shrinking a failing program ----------------------------------------------------------------------
_SHARDING_LINE = re.compile(r"^(v\d+) = jax\.(?:lax\.with_sharding_constraint|sharding\.reshard)\(([av]\d+), ")


def candidates(case):
    """Smaller variants of a `ShardedProgram`, the most reducing first: one output of `g`, a
    sharding constraint or reshard turned into an identity, one argument or output replicated."""
    g = case.graph
    if g is None:
        return
    kw = dict(mesh=case.mesh, args=case.args, in_shardings=case.in_shardings, out_shardings=case.out_shardings,
              partitioner=case.partitioner, axis_types=case.axis_types)
    n_f = sum(1 for dt, _, _ in g.args if dt == "float32")
    # a program class other than plain changes the outputs (a scan's carry, a chain's steps): its
    # out_shardings are not g's one by one, so one output of g comes with replicated outputs
    if len(g.outs) > 1 and g.program_class[0] != "plain":
        rep = NamedSharding(case.mesh, PartitionSpec())
        for k in range(len(g.outs)):
            if g.transform in ("grad", "vjp") and g.outs[k][2] != "float32":
                continue
            small = dataclasses.replace(g, outs=(g.outs[k],))
            yield make_case(small, **dict(kw, out_shardings=(rep,) * len(assemble(small)[2])))
    if len(g.outs) > 1 and g.program_class[0] == "plain":
        for k in range(len(g.outs)):
            outs = (g.outs[k],)
            if g.transform in ("none", "vmap"):
                out_sh = (case.out_shardings[k],)
            elif g.transform == "grad":
                if g.outs[k][2] != "float32":
                    continue
                out_sh = case.out_shardings
            else:
                if g.outs[k][2] != "float32":
                    continue
                j = [i for i, o in enumerate(g.outs) if o[2] == "float32"].index(k)
                out_sh = (case.out_shardings[j],) + tuple(case.out_shardings[-n_f:])
            yield make_case(dataclasses.replace(g, outs=outs), **dict(kw, out_shardings=out_sh))
    for i, line in enumerate(g.lines):
        m = _SHARDING_LINE.match(line)
        if m:
            lines = list(g.lines)
            lines[i] = f"{m.group(1)} = {m.group(2)}"
            yield make_case(dataclasses.replace(g, lines=tuple(lines)), **kw)
    for i, s in enumerate(case.in_shardings):
        if any(p is not None for p in s.spec):
            ins = list(case.in_shardings)
            ins[i] = NamedSharding(case.mesh, PartitionSpec())
            yield make_case(g, **dict(kw, in_shardings=tuple(ins)))
    for i, s in enumerate(case.out_shardings):
        if any(p is not None for p in s.spec):
            outs = list(case.out_shardings)
            outs[i] = NamedSharding(case.mesh, PartitionSpec())
            yield make_case(g, **dict(kw, out_shardings=tuple(outs)))


def shrink_case(case, fails, seconds: float):
    """The smallest variant of `case` (see `candidates`) for which `fails(variant)` holds, found
    greedily within `seconds`; `case` itself when nothing smaller fails."""
    stop = time.monotonic() + seconds
    best = case
    progress = True
    while progress and time.monotonic() < stop:
        progress = False
        for cand in candidates(best):
            if time.monotonic() > stop:
                break
            try:
                bad = fails(cand)
            except Exception:  # noqa: BLE001 - a variant that breaks differently is not this failure
                bad = False
            if bad:
                best, progress = cand, True
                break
    return best
