"""How `conformance.explain` judges healthy programs' stages: by the allowed set, the heuristic, or not at all.

    python -m bench.explain_allowed

Runs `explain` at the defaults (policy "auto": the allowed set under XLA:CPU's declared relaxations,
docs/debugging.md "Every stage against the allowed set") over the healthy programs of
tests/conformance/debug/test_debug_explain_healthy.py: the corpus (as `explain --corpus` does), the op
catalogue, the four examples/ models and seven drawn programs per family. Counts the float output
elements of the executed stage by the rule that judged them (`Explanation.allowed_set`), lists every
program whose outputs leave the spec's allowed set (boundary, op, the relaxations that cover it) and
every divergence, and counts the notes of outputs held to the heuristic (no bound rule, or the bound
walk failed). Prints a table and one JSON line; nothing is timed.
"""
from __future__ import annotations

import collections
import importlib
import os
import sys

DEVICES = 8


def _configure():
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={DEVICES}").strip()


def programs():
    """(name, thunk returning an Explanation) of every healthy program."""
    from conformance.cases import corpus
    from conformance.debug.explain import explain, op_catalogue
    from conformance.debug.explain import program as prog
    from conformance.debug.explain.core import explain_case, explain_staged
    from conformance.strategies.programs import FAMILIES
    from conformance.suites import base, programs as suite

    for p in corpus.PROGRAMS:
        yield f"corpus:{p.name}", lambda p=p: explain_staged(prog.from_corpus(p), rtol=p.tol)
    for name, fn, args in op_catalogue.programs():
        yield f"catalogue:{name}", lambda fn=fn, args=args: explain(fn, *args)
    for name in ("transformer_jit", "transformer_fsdp", "pipeline", "moe"):
        mod = importlib.import_module(f"examples.{name}")
        yield f"examples:{name}", lambda mod=mod: explain(mod.train_step, *mod.init())
    for fam in FAMILIES:
        for case in base.draw(suite.strategy(fam, None, 8), 7, 7):
            if case.entry != "device_put":
                yield f"drawn:{case.case_id}", lambda case=case: explain_case(case)


def main(argv=None) -> int:
    _configure()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # examples/
    from bench import _common as C

    counts = collections.Counter()
    deviations, diverged, held, skipped = [], {}, collections.Counter(), {}
    n = 0
    for name, run in programs():
        try:
            e = run()
        except NotImplementedError as err:            # no lowering on this platform (pbroadcast on CPU)
            skipped[name] = str(err).splitlines()[0][:100]
            continue
        n += 1
        counts.update(e.allowed_set.get("executed") or e.allowed_set.get("compiled") or {})
        if e.deviation is not None:
            d = e.deviation
            deviations.append({"program": name, "boundary": d.boundary, "op": d.op, "elements": d.count,
                               "relaxations": list(d.relaxations)})
        if e.diverged_in:
            diverged[name] = e.diverged_in
        for note in e.notes:
            if "no bound rule" in note or "allowed set not" in note:
                held[note.split(": ", 1)[1][:70] if note.startswith("output ") else note[:70]] += 1
    print(f"{n} healthy programs explained ({len(skipped)} not lowered on this platform)")
    print(f"{'rule':<28}{'elements':>10}")
    for key in ("allowed", "heuristic", "undecidable", "relaxed_only", "outside"):
        print(f"{key:<28}{counts.get(key, 0):>10}")
    for d in deviations:
        print(f"leaves the spec's set: {d['program']} at {d['boundary']} ({d['op']}), {d['elements']} element(s), "
              f"covered by {', '.join(d['relaxations']) or 'no declared relaxation'}")
    for k, v in diverged.items():
        print(f"diverged: {k} in {v}")
    for k, v in sorted(held.items(), key=lambda kv: -kv[1]):
        print(f"held to the heuristic ({v}): {k}")
    C.emit({"bench": "explain_allowed", "programs": n, "counts": dict(counts), "deviations": deviations,
            "diverged": diverged, "held": dict(held)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
