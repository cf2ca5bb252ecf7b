"""Every corpus program through every stage: which interpret, which agree, which ops are missing.

`check_corpus()` returns one row per program of `conformance.cases.corpus`; `python -m
conformance explain --corpus` prints them. A program whose module uses an op refsim.stablehlo
has no rule for is reported with the op's name, never silently skipped.
"""
from __future__ import annotations

import dataclasses

from conformance.debug.explain.core import explain_staged
from conformance.debug.explain.program import from_corpus
from conformance.debug.explain.stages import STAGES


@dataclasses.dataclass
class Row:
    name: str
    status: dict        # stage -> "agrees" | "DIFFERS" | "error: ..." | "missing: op, ..."
    seconds: dict       # stage -> seconds
    diverged_in: str | None
    note: str = ""


def _status(exp, st) -> str:
    if st.missing_ops:
        return "missing: " + ", ".join(sorted(st.missing_ops))
    if st.status == "crashed":
        return "crashed: " + (st.reason or "")[:120]
    if st.error:
        return "error: " + st.error.splitlines()[0][:120]
    if st.name == "jaxpr":
        return "ran"
    return {True: "agrees", False: "DIFFERS", None: "n/a"}[exp.agrees.get(st.name)]


def check_program(prog) -> Row:
    try:
        staged = from_corpus(prog)
    except NotImplementedError:
        # no lowering for this platform (pbroadcast on CPU): the GPU lowering still shows the lowered stage
        try:
            staged = from_corpus(prog, lowering_platforms=("cuda",))
        except Exception as e:  # noqa: BLE001 - reported per program
            msg = f"not lowered: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
            return Row(prog.name, {s: msg if s != "jaxpr" else "-" for s in STAGES}, {}, None, prog.xla_note)
    exp = explain_staged(staged, rtol=prog.tol)
    return Row(prog.name, {st.name: _status(exp, st) for st in exp.stages},
               {st.name: st.seconds for st in exp.stages}, exp.diverged_in, prog.xla_note)


def check_corpus(names=None) -> list[Row]:
    from conformance.cases import corpus

    progs = corpus.PROGRAMS if not names else [corpus.by_name(n) for n in names]
    return [check_program(p) for p in progs]


def summary(rows) -> dict:
    """{stage: number of programs whose stage interpreted (ran) and agreed with the stage before}."""
    out = {}
    for s in STAGES[1:]:
        out[s] = sum(1 for r in rows if r.status.get(s) == "agrees")
    out["programs"] = len(rows)
    return out
