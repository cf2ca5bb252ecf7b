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

The block yields a `firing.Planted`: the names planted (a list) and `fired`, how many times each
changed what XLA compiled or ran. A block in which a fault never fired (the program has nothing it
targets) warns on exit (`firing.FaultNotFired`), naming the fault and what it targets.

>>> from conformance.faults import compiler, inject
>>> with inject([compiler.reversed_permute_pairs, "psum_drop_member"]) as planted:   # doctest: +SKIP
...     explain(f, x, mesh=m, in_specs=P("i"), out_specs=P("i"))
>>> planted.fired                                   # doctest: +SKIP
{'reversed_permute_pairs': 1, 'psum_drop_member': 0}
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Callable, Iterable

from conformance.debug import region
from conformance.debug.explain import xla_side
from conformance.faults import firing, lowering

__all__ = ["STAGES", "inject", "mark", "stage_of"]

STAGES = ("jaxpr", "lowering", "compiler")


def mark(stage: str, name: str | None = None, targets: str | None = None) -> Callable:
    """Decorator: the function is a fault of `stage` ("jaxpr": a bisect runner; "compiler": a module edit),
    named `name` (default: the function's name), acting on `targets` (in words; default: the first
    line of its docstring). A module edit so marked counts as fired (`firing.note`) each time it
    changes a module; one that raises `firing.NothingToEdit` while planted leaves the module as it is."""
    if stage not in ("jaxpr", "compiler"):
        raise ValueError(f"stage={stage!r}; a function fault is a 'jaxpr' runner or a 'compiler' module edit "
                         "(a lowering fault is a conformance.faults.Fault).")

    def apply(fn):
        fault_name = name or getattr(fn, "__name__", "fault")
        if stage == "compiler":
            fn = _counted_edit(fn, fault_name)
        fn.stage = stage
        fn.fault_name = fault_name
        doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
        fn.fault_targets = targets or (doc[0] if doc else fault_name)
        return fn

    return apply


def _counted_edit(edit: Callable, name: str) -> Callable:
    @functools.wraps(edit)
    def counted(text: str) -> str:
        try:
            out = edit(text)
        except firing.NothingToEdit:
            if firing.is_planted(name):
                return text      # a module the planted edit cannot touch runs unchanged; the block warns
            raise
        if out != text:
            firing.note(name)
        return out

    return counted


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


def _targets(fault) -> str:
    """What `fault` acts on, in words."""
    if isinstance(fault, str):
        fault = lowering.FAULTS.get(fault)
        if fault is None:
            return ""        # an unknown name: lowering.inject refuses it, naming the choices
    if isinstance(fault, lowering.Fault):
        return fault.targets
    where = {"jaxpr": "an equation of the program bisect compiles", "compiler": "the module explain compiles"}
    return f"{where[stage_of(fault)]}: {getattr(fault, 'fault_targets', _name(fault)).rstrip('.')}"


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
def inject(faults: str | lowering.Fault | Callable | Iterable, *, warn: bool = True):
    """Plant one fault or several (any mix of stages) for the block; yields a `firing.Planted`:
    their names (a list) and `fired`, how many times each changed what XLA compiled or ran.

    Lowering faults are activated by `conformance.faults.lowering.inject` (which also drops
    every compiled executable on entry and exit); jaxpr runners and module edits are planted
    where `bisect` and `explain` pick them up. On a normal exit, a fault that never fired is
    reported with `warnings.warn(..., firing.FaultNotFired)` naming it and what it targets
    (`warn=False`: not reported, for callers that plant one fault over many programs).
    """
    one = isinstance(faults, (str, lowering.Fault)) or callable(faults)
    chosen = [faults] if one else list(faults)
    by_stage: dict[str, list] = {s: [] for s in STAGES}
    for f in chosen:
        by_stage[stage_of(f)].append(f)
    planted = firing.Planted([_name(f) for f in chosen], {_name(f): _targets(f) for f in chosen})
    with contextlib.ExitStack() as stack:
        stack.enter_context(firing.active(planted))
        if by_stage["lowering"]:
            stack.enter_context(lowering.inject(by_stage["lowering"]))
        if by_stage["compiler"]:
            stack.enter_context(_edits(by_stage["compiler"]))
        if by_stage["jaxpr"]:
            stack.enter_context(_runner(by_stage["jaxpr"]))
        yield planted
    if warn:
        for name in planted.silent:
            warnings.warn(f"conformance.faults.inject: {name} never fired inside the block: it targets "
                          f"{planted.targets[name]}, and nothing XLA compiled or ran there had it, so the "
                          "program ran unchanged and agreeing with refsim says nothing about this fault. "
                          "Plant it in a program it targets.", firing.FaultNotFired, stacklevel=3)
