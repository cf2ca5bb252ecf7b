"""What one more data set of an already compiled program costs the main job (issue 29).

    python -m bench.data_sets [--suite all] [--examples 20] [--data-per-program 10] [--passes 3]
                              [--families] [--json FILE]

Draws the plan of ``python -m conformance run --examples N --seed 0`` with ``--data-per-program D``,
runs every data set of its program cases once on refsim, on XLA and through the comparison (the
warm-up: every structure traced and compiled), then makes ``--passes`` more passes as the runner
does, structure after structure: the first data set of each structure untimed (it refills the
bounded caches a pass over more structures than they hold has evicted, as a run's first data set
of a structure does), each later one timed, each side separately with ``time.perf_counter``, in
this one process. Prints the median over passes of milliseconds per data set for refsim (``case.run(refsim)``),
the XLA side (``case.run(xla_backend)``: argument placement, dispatch, execution, read-back) and the
comparison (``verdict.compare.compare``); with ``--families``, per family too. Cases the xfails file
lists as crashing, and data sets that raise on either side, are left out (and counted).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench import _common as C

SIDES = ("refsim", "xla", "compare")


def data_sets(suite: str, examples: int, data_per_program: int, seed: int = 0) -> list[list]:
    """The program cases (one per data set) of the plan, a list per drawn structure, crash-listed
    cases left out."""
    from conformance.engine import plan as plan_mod
    from conformance.engine import runner
    from conformance.suites import base
    from conformance.verdict import xfails

    xf = xfails.load(None, platform="cpu")
    out = []
    for chunk in runner.plan_chunks(suite, examples=examples, seed=seed):
        for task in plan_mod.with_data(chunk, data_per_program, seed):
            entry = xf.lookup(task.case_id) if isinstance(task, base.ProgramTask) else None
            if isinstance(task, base.ProgramTask) and not (entry is not None and (entry.crash or entry.aborts)):
                out.extend(plan_mod.structures(task.variants))
    return out


def measure(structures: list[list], passes: int) -> dict:
    """{"data_sets" (timed per pass), "left_out", "ms": {side: median}, "each": {side: [per pass]},
    "families": {...}} over the data sets after each structure's first."""
    import refsim
    import xla_backend
    from conformance.verdict.compare import compare

    ok, left_out = [], 0
    for group in structures:   # warm-up: trace and compile every structure
        kept = []
        for case in group:
            try:
                compare(case.run(refsim), case.run(xla_backend), case=case)
                kept.append(case)
            except Exception:  # noqa: BLE001 - a data set that raises is not what this measures
                left_out += 1
        if len(kept) > 1:
            ok.append(kept)
        else:
            left_out += len(kept)
    each = {s: [] for s in SIDES}
    fam: dict = {}
    timed = sum(len(g) - 1 for g in ok)
    for _ in range(passes):
        tot = dict.fromkeys(SIDES, 0.0)
        for first, *rest in ok:
            compare(first.run(refsim), first.run(xla_backend), case=first)
            for case in rest:
                t0 = time.perf_counter()
                want = case.run(refsim)
                t1 = time.perf_counter()
                got = case.run(xla_backend)
                t2 = time.perf_counter()
                compare(want, got, case=case)
                t3 = time.perf_counter()
                f = fam.setdefault(case.case_id.split("[")[0], {s: 0.0 for s in SIDES} | {"n": 0})
                for side, dt in zip(SIDES, (t1 - t0, t2 - t1, t3 - t2)):
                    tot[side] += dt
                    f[side] += dt
                f["n"] += 1
        for side in SIDES:
            each[side].append(1000 * tot[side] / max(1, timed))
    families = {f: {s: 1000 * v[s] / v["n"] for s in SIDES} | {"data_sets": v["n"] // passes}
                for f, v in fam.items()}
    return {"data_sets": timed, "structures": len(ok), "left_out": left_out,
            "ms": {s: statistics.median(v) for s, v in each.items()}, "each": each, "families": families}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.data_sets", description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="all")
    ap.add_argument("--examples", type=int, default=20)
    ap.add_argument("--data-per-program", type=int, default=10)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--families", action="store_true", help="print the cost per family too")
    ap.add_argument("--json", metavar="FILE", help="also append the JSON lines to FILE")
    a = ap.parse_args(argv)
    if a.passes < 1:
        ap.error(f"--passes {a.passes}: pass 1 or more timed passes")
    from xla_backend import platform

    platform.configure("cpu", 8)
    res = measure(data_sets(a.suite, a.examples, a.data_per_program), a.passes)
    C.open_json(a.json)
    C.emit(C.machine())
    C.emit({"bench": "data_sets", "suite": a.suite, "examples_option": a.examples,
            "data_per_program": a.data_per_program, "passes": a.passes, **res})
    C.close_json()
    rows = [[side, f"{res['ms'][side]:.3f}", ", ".join(f"{v:.3f}" for v in res["each"][side])] for side in SIDES]
    rows.append(["total", f"{sum(res['ms'].values()):.3f}", ""])
    C.table(f"ms per data set after a structure's first, warm ({res['data_sets']} data sets of "
            f"{res['structures']} structures, {res['left_out']} left out)",
                  ["side", "median", "each pass"], rows)
    if a.families:
        fam = sorted(res["families"].items(), key=lambda kv: -sum(kv[1][s] for s in SIDES))
        C.table("ms per data set by family (all passes)", ["family", "data sets", *SIDES],
                      [[f, str(v["data_sets"]), *(f"{v[s]:.2f}" for s in SIDES)] for f, v in fam])
    return 0


if __name__ == "__main__":
    sys.exit(main())
