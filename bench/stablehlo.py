"""refsim.stablehlo beside refsim's jaxpr interpreter, program by program on the corpus.

For every program of `conformance.cases.corpus` that lowers on this platform: the time refsim
takes to run it from its jaxpr (`refsim.shard_map` / `jit` / `pmap`, trace cached: the
second and later calls), and the time `refsim.stablehlo.interpret` takes on the module JAX
lowered and on XLA's compiled per-device module (module walked once beforehand: `load`
column). After one untimed call each, the three are timed in equal, interleaved passes
(jaxpr, lowered, compiled, jaxpr, ...); each time is the median of the passes (`timing`:
median, min, max, spread), and the ratio is median lowered / median jaxpr. The issue's
target: interpreting the lowered module costs no more than ~3x the jaxpr interpretation.
Prints a table and one JSON line per program.

    python -m bench --parts stablehlo        or        python bench/stablehlo.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if __package__ in (None, ""):  # run as `python bench/stablehlo.py`: import the checkout's packages
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import _common as C  # noqa: E402

QUICK = ("psum_x", "ppermute_ring", "psum_in_scan", "explicit_reshard_sum", "pmap_psum")


def _measure(prog, repeat: int) -> dict:
    import numpy as np

    import refsim.stablehlo as sh
    from conformance.debug.explain.program import from_corpus
    from refsim import compat

    rec = dict(bench="stablehlo", program=prog.name, family=prog.family, kind=prog.kind)
    try:
        staged = from_corpus(prog)
    except Exception as e:  # noqa: BLE001 - e.g. no CPU lowering: reported, not timed
        return rec | dict(status=f"not lowered: {type(e).__name__}")
    run = prog.refsim_callable()
    args = prog.inputs(0)
    run(*args)  # trace once, as the conformance runner's later examples reuse it
    fns = {"jaxpr": lambda: run(*args)}
    kept = compat.lowered_kept_args(staged.lowered, len(staged.global_args))
    gargs = [staged.global_args[i] for i in kept]
    t = time.perf_counter()
    plan = sh.load(staged.lowered.compiler_ir("stablehlo"))
    rec["lowered_load_s"] = time.perf_counter() - t
    fns["lowered"] = lambda: sh.interpret(plan, *gargs)
    try:
        compiled = staged.compiled()
    except Exception as e:  # noqa: BLE001 - XLA:CPU cannot compile it (ragged-all-to-all)
        return _timed(rec, fns, repeat) | dict(status=f"lowered only ({type(e).__name__})")
    from conformance.debug.explain.stages import flat_in_shardings, shards_by_index

    ids = compat.partition_device_ids(compiled)
    shards = [shards_by_index(np.asarray(a)[None], s, ids) for a, s in zip(gargs, flat_in_shardings(compiled))]
    t = time.perf_counter()
    cplan = sh.load(sh.hlo_module_to_stablehlo(compiled))
    rec["compiled_load_s"] = time.perf_counter() - t
    fns["compiled"] = lambda: sh.interpret(cplan, *shards, per_device=True, num_partitions=len(ids))
    return _timed(rec, fns, repeat) | dict(status="ok")


def _timed(rec: dict, fns: dict, repeat: int) -> dict:
    """`rec` with `<name>_s` (the median) per callable and `timing` {name: stats}, timed in interleaved passes."""
    for f in fns.values():  # untimed: a first call's one-off costs are not what the passes compare
        f()
    rec["timing"] = {name: C.stats(ts) for name, ts in C.interleaved(fns, repeat).items()}
    for name, st in rec["timing"].items():
        rec[f"{name}_s"] = st["median"]
    rec["ratio"] = rec["lowered_s"] / rec["jaxpr_s"]
    return rec


def run(quick: bool = False, names=None, repeat: int | None = None) -> list[dict]:
    from xla_backend import platform

    platform.configure("cpu", 8)
    from conformance.cases import corpus

    progs = [corpus.by_name(n) for n in (names or (QUICK if quick else [p.name for p in corpus.PROGRAMS]))]
    repeat = repeat or (2 if quick else 5)
    recs = [_measure(p, repeat) for p in progs]
    for r in recs:
        C.emit(r)
    timed = [r for r in recs if "ratio" in r]
    ratios = [r["ratio"] for r in timed]
    summary = dict(bench="stablehlo", program="summary", programs=len(recs), timed=len(timed),
                   median_ratio=statistics.median(ratios) if ratios else None,
                   max_ratio=max(ratios) if ratios else None,
                   over_3x=[r["program"] for r in timed if r["ratio"] > 3])
    C.emit(summary)
    return recs + [summary]


def show(records: list[dict]) -> None:
    rows = []
    for r in records:
        if r["program"] == "summary":
            continue
        st = r.get("timing", {})
        rows.append((r["program"], C.fmt_stat(st.get("jaxpr")), C.fmt_stat(st.get("lowered")),
                     C.fmt_ratio(r.get("ratio")), C.fmt_stat(st.get("compiled")),
                     C.fmt_seconds(r.get("lowered_load_s")), r["status"]))
    s = records[-1]
    med = "-" if s["median_ratio"] is None else f"{s['median_ratio']:.2f}x"
    mx = "-" if s["max_ratio"] is None else f"{s['max_ratio']:.2f}x"
    C.table(f"StableHLO interpretation vs jaxpr interpretation, medians of interleaved passes (range) "
            f"({s['timed']} of {s['programs']} corpus programs timed; lowered/jaxpr median {med}, max {mx}; "
            f"over 3x: {s['over_3x'] or 'none'})",
            ["program", "jaxpr", "lowered", "lowered/jaxpr", "compiled", "load (walk module)", "status"], rows)


def main(argv=None):
    from conformance import validation

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{len(QUICK)} programs, 2 passes")
    ap.add_argument("--programs", help="comma-separated corpus program names")
    ap.add_argument("--repeat", type=validation.option("--repeat", integer=True, low=1),
                    help="interleaved passes (default 5)")
    args = ap.parse_args(argv)
    recs = run(args.quick, args.programs.split(",") if args.programs else None, args.repeat)
    show(recs)
    return recs


if __name__ == "__main__":
    main()
