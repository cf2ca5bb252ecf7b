"""Fewer ops and devices: more cuts of a failing sharded program, and a greedy loop over cuts.

`conformance.suites.sharded.candidates` cuts a program's op graph and layouts (one output, a
constraint made an identity, a layout replicated). Two more cuts:

* `earlier_values`: the program returning one earlier value instead of its outputs, so the ops
  after it go (dead code), the earliest value first. Its type comes from refsim's evaluation of
  the program (NumPy, so a value that crashes XLA costs nothing here); a float value is
  compared within 2**-10 of its largest magnitude (its exact error bound is not known), an
  integer or bool value exactly.
* `fewer_devices`: one mesh axis at a time made size 1 (the first slice along it) or halved,
  the remaining devices renumbered 0..n-1 in the same relative order (so a reversed or
  transposed order stays so). The specs, the op graph and the data stay: every axis size still
  divides what it divided.

`greedy` takes the first variant of any cut that still fails, again and again, within a time
budget, and says which cut and position each step was (a path through `candidates` alone is
what an example-database entry can replay).
"""
from __future__ import annotations

import dataclasses
import re
import time

import numpy as np

import refsim
from conformance.strategies.sharded import assemble, make_case
from conformance.suites.sharded import candidates
from conformance.verdict.compare import as_outputs
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec

__all__ = ["earlier_values", "fewer_devices", "greedy", "with_mesh"]

_DTYPES = {"float32": "float32", "int32": "int32", "bool": "bool"}


def _rebuilt(case, graph, out_shardings):
    return make_case(graph, mesh=case.mesh, args=case.args, in_shardings=case.in_shardings,
                     out_shardings=tuple(out_shardings), partitioner=case.partitioner, axis_types=case.axis_types)


def _value_types(case, names: list) -> dict:
    """{name: (shape, dtype)} of `names` (values of `case`'s function g), by refsim."""
    g = case.graph
    transform = "vmap" if g.transform == "vmap" else "none"
    # a chain repeats g's outputs once per call: the probe calls g once (its arguments are the case's)
    klass = ("plain",) if g.program_class[0] in ("jit_chain", "jit_chain_orders") else g.program_class
    probe = dataclasses.replace(g, outs=tuple((n, (), "float32", 0.0) for n in names), transform=transform,
                                program_class=klass)
    rep = NamedSharding(case.mesh, PartitionSpec())
    outs = as_outputs(_rebuilt(case, probe, (rep,) * len(names)).run(refsim))
    types = {}
    for name, arr in zip(names, outs):
        shape = tuple(int(d) for d in np.shape(np.asarray(arr)))
        types[name] = (shape[1:] if transform == "vmap" else shape, str(np.asarray(arr).dtype))
    return types


def earlier_values(case):
    """Variants of `case` returning one value its function computes before its outputs (the ops
    after that value dropped), the earliest value first."""
    g = case.graph
    if g is None:
        return
    outs = {name for name, *_ in g.outs}
    names = [n.strip() for line in g.lines for n in line.split(" = ", 1)[0].split(",")]
    names = [n for n in dict.fromkeys(names) if re.fullmatch(r"v\d+", n) and n not in outs]
    if not names:
        return
    try:
        types = _value_types(case, names)
    except Exception:  # noqa: BLE001 - refsim cannot run the program: no such variants
        return
    n_f = sum(1 for dt, _, _ in g.args if dt == "float32")
    grads = tuple(case.out_shardings[-n_f:]) if g.transform in ("grad", "vjp") and n_f else ()
    rep = NamedSharding(case.mesh, PartitionSpec())
    for name in names:
        shape, dtype = types[name]
        if dtype not in _DTYPES or (g.transform in ("grad", "vjp") and dtype != "float32"):
            continue
        err = float("inf") if dtype == "float32" else 0.0
        graph = dataclasses.replace(g, outs=((name, shape, _DTYPES[dtype], err),))
        out_sh = {"grad": grads, "vjp": (rep,) + grads}.get(g.transform, (rep,))
        if g.program_class[0] != "plain":   # a class wraps the value (a scan stacks it): replicate every output
            out_sh = (rep,) * len(assemble(graph)[2])
        try:
            yield _rebuilt(case, graph, out_sh)
        except ValueError:
            continue


def with_mesh(case, mesh: Mesh):
    """`case` with the same specs over `mesh` (same axis names)."""
    def on(s):
        return NamedSharding(mesh, s.spec)

    return make_case(case.graph, mesh=mesh, args=case.args, in_shardings=tuple(map(on, case.in_shardings)),
                     out_shardings=tuple(map(on, case.out_shardings)), partitioner=case.partitioner,
                     axis_types=case.axis_types)


def _renumbered(ids: np.ndarray) -> np.ndarray:
    flat = ids.ravel()
    return np.argsort(np.argsort(flat, kind="stable"), kind="stable").reshape(ids.shape)


def fewer_devices(case):
    """Variants of `case` on smaller meshes, the most reducing first: each axis of size > 1 made
    size 1, then each even axis halved."""
    if case.graph is None:
        return
    m = case.mesh
    ids = np.asarray(m.device_ids)
    sizes = [int(s) for s in m.axis_sizes]
    cuts = [(k, 1) for k, n in enumerate(sizes) if n > 1]
    cuts += [(k, n // 2) for k, n in enumerate(sizes) if n > 2 and n % 2 == 0]
    for k, n in cuts:
        sub = np.take(ids, range(n), axis=k)
        mesh = Mesh(tuple(sub.shape), tuple(m.axis_names), device_ids=_renumbered(sub),
                    axis_types=tuple(m.axis_types))
        try:
            yield with_mesh(case, mesh)
        except ValueError:   # a layout the smaller mesh cannot hold: not a variant
            continue


def greedy(case, fails, seconds: float, *, cuts=(earlier_values, fewer_devices, candidates), on_step=None):
    """(the smallest variant of `case` found within `seconds` for which `fails(variant)` holds,
    the accepted steps as (cut name, position) pairs). Each round tries every cut's variants in
    order and takes the first that fails; `on_step(variant, step)` sees each accepted one."""
    stop = time.monotonic() + seconds
    best, steps = case, []
    progress = True
    while progress and time.monotonic() < stop:
        progress = False
        for cut in cuts:
            for pos, cand in enumerate(cut(best)):
                if time.monotonic() > stop:
                    return best, steps
                try:
                    bad = fails(cand)
                except Exception:  # noqa: BLE001 - a variant that breaks differently is not this failure
                    bad = False
                if bad:
                    best, progress = cand, True
                    steps.append((cut.__name__, pos))
                    if on_step is not None:
                        on_step(best, steps[-1])
                    break
            if progress:
                break
    return best, steps
