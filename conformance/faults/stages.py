"""One entry for every planted fault: `inject(fault)` plants it at its stage for a ``with`` block.

A fault says where it enters (`stage_of`):

* "jaxpr"    a runner of `conformance.faults.jaxpr` (one equation rewritten before XLA compiles the
             region): `conformance.debug.bisect` runs the region with it when given no runner;
* "lowering" a `conformance.faults.lowering.Fault` or the name of one in `FAULTS` (JAX's lowering
             rule of a primitive replaced, `numerics.DOT_GENERAL_BF16` included, or a `patch` such
             as `compiler.XLA_CHECK_IN_COMPILE`): every XLA program lowered inside the block;
* "compiler" an edit of the lowered module of `conformance.faults.compiler` (``text -> text``):
             `conformance.debug.explain` applies it to every module it compiles.

refsim never lowers or compiles, so it still computes the right answer while XLA runs the
wrong one. Everything planted is removed on exit, normal or by an exception.

>>> from conformance.faults import compiler, inject
>>> with inject([compiler.reversed_permute_pairs, "psum_drop_member"]) as names:   # doctest: +SKIP
...     explain(f, x, mesh=m, in_specs=P("i"), out_specs=P("i"))
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable

from conformance.debug import region
from conformance.debug.explain import xla_side
from conformance.faults import lowering

__all__ = ["STAGES", "inject", "mark", "stage_of"]

STAGES = ("jaxpr", "lowering", "compiler")


def mark(stage: str, name: str | None = None) -> Callable:
    """Decorator: the function is a fault of `stage` ("jaxpr": a bisect runner; "compiler": a module edit)."""
    if stage not in ("jaxpr", "compiler"):
        raise ValueError(f"stage={stage!r}; a function fault is a 'jaxpr' runner or a 'compiler' module edit "
                         "(a lowering fault is a conformance.faults.Fault).")

    def apply(fn):
        fn.stage = stage
        fn.fault_name = name or getattr(fn, "__name__", "fault")
        return fn

    return apply


def stage_of(fault) -> str:
    """The stage `fault` enters at (`STAGES`); TypeError naming the fault when it is not a fault."""
    if isinstance(fault, (str, lowering.Fault)):
        return "lowering"
    stage = getattr(fault, "stage", None)
    if stage in ("jaxpr", "compiler") and callable(fault):
        return stage
    raise TypeError(f"inject() got {fault!r}, which is not a fault: pass a name of conformance.faults.FAULTS, a "
                    "conformance.faults.Fault, a runner of conformance.faults.jaxpr or a module edit of "
                    "conformance.faults.compiler (mark your own with conformance.faults.mark(stage)).")


def _name(fault) -> str:
    if isinstance(fault, str):
        return fault
    return getattr(fault, "name", None) or getattr(fault, "fault_name", None) or repr(fault)


@contextlib.contextmanager
def _runner(runners: list):
    if len(runners) > 1:
        raise ValueError(f"inject() got {len(runners)} jaxpr-stage faults ({', '.join(map(_name, runners))}); "
                         "bisect runs one runner: plant one at a time.")
    before = region.planted_runner
    region.planted_runner = runners[0]
    try:
        yield
    finally:
        region.planted_runner = before


@contextlib.contextmanager
def _edits(edits: list):
    before = list(xla_side.PLANTED_EDITS)
    xla_side.PLANTED_EDITS.extend(edits)
    try:
        yield
    finally:
        xla_side.PLANTED_EDITS[:] = before


@contextlib.contextmanager
def inject(faults: str | lowering.Fault | Callable | Iterable):
    """Plant one fault or several (any mix of stages) for the block; yields their names.

    Lowering faults are activated by `conformance.faults.lowering.inject` (which also drops
    every compiled executable on entry and exit); jaxpr runners and module edits are planted
    where `bisect` and `explain` pick them up.
    """
    one = isinstance(faults, (str, lowering.Fault)) or callable(faults)
    chosen = [faults] if one else list(faults)
    by_stage: dict[str, list] = {s: [] for s in STAGES}
    for f in chosen:
        by_stage[stage_of(f)].append(f)
    with contextlib.ExitStack() as stack:
        if by_stage["lowering"]:
            stack.enter_context(lowering.inject(by_stage["lowering"]))
        if by_stage["compiler"]:
            stack.enter_context(_edits(by_stage["compiler"]))
        if by_stage["jaxpr"]:
            stack.enter_context(_runner(by_stage["jaxpr"]))
        yield [_name(f) for f in chosen]
