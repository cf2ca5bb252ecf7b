"""`python -m conformance explain REPRO.py[:NAME] [--json]`: which stage miscompiled a reproducer.

Evaluates the reproducer's program at every stage (jaxpr by refsim, lowered StableHLO and
compiled per-device HLO by refsim.stablehlo, executed on the platform) and prints where
they first diverge, the op, its source line and the per-device errors; `--json` prints one
JSON object instead. `--corpus` runs every program of `conformance.cases.corpus` and prints how
many interpret and agree at each stage, naming the ops refsim.stablehlo lacks; `--coverage`
counts the ops of every module of the corpus, the examples/ models, the op catalogue and drawn
programs that refsim.stablehlo runs. `--plant NAME` plants a fault of `conformance.faults` on
XLA's side for the run (`conformance.faults.catalogue`) and says on stderr whether it fired.
Exit status: 0 when every stage agrees, 1 on a divergence, 2 when the input cannot be used.
"""
from __future__ import annotations

import argparse
import json
import sys

from conformance import validation
from conformance.debug import loader
from conformance.debug.explain import explain
from conformance.debug.explain.corpus_check import check_corpus, summary
from conformance.debug.explain.coverage import collect, coverage
from conformance.debug.explain.stages import STAGES
from conformance.faults import catalogue


def build_parser(prog: str = "python -m conformance explain") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Find the compiler stage (lowering, compiler, backend) "
                                                       "where a program's result first changes.")
    p.add_argument("target", nargs="?", help="reproducer file, optionally with a case name: FILE.py or FILE.py:NAME")
    p.add_argument("--json", action="store_true", help="print one JSON object (diverged_in, op, source, stages, ...)")
    p.add_argument("--max-ulp", type=validation.option("--max-ulp", low=0, what="0: bit-exact"), default=0,
                   help="values within this many ULP count as equal (instead of --tolerance)")
    p.add_argument("--tolerance", choices=("auto", "exact"), default="auto",
                   help="auto (default): exact where the program is exact, else within 256 (float32) / 16 (narrow "
                        "floats) units of roundoff of each value's largest magnitude; exact: bit for bit")
    p.add_argument("--policy", choices=("auto", "spec", "heuristic"), default="auto",
                   help="with --tolerance auto, how float outputs are judged at every stage: auto (default): the "
                        "program's allowed set under the platform's declared relaxations (a stage that agrees only "
                        "under one is reported, exit 0); spec: the allowed set without them (exit 1); heuristic: "
                        "256 units of roundoff between adjacent stages only")
    p.add_argument("--corpus", action="store_true", help="check every corpus program at every stage instead")
    p.add_argument("--coverage", action="store_true",
                   help="count the ops of every lowered and compiled module of the corpus, the examples, the op "
                        "catalogue and drawn programs that refsim.stablehlo runs (exit 1 when one is missing)")
    p.add_argument("--drawn", type=int, default=1, metavar="N",
                   help="with --coverage: programs drawn per family of the programs generator (default 1)")
    catalogue.add_plant_option(p, "explain")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        plants = catalogue.resolve(args.plant, "explain")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with catalogue.planted(plants, lambda line: print(line, file=sys.stderr)):
        return _run(args)


def _run(args) -> int:
    if args.corpus:
        return _corpus(args)
    if args.coverage:
        cov = coverage(collect(drawn=args.drawn))
        print(json.dumps(cov.as_dict()) if args.json else cov.render())
        return 1 if cov.missing else 0
    if not args.target:
        print("error: give a reproducer FILE.py[:NAME], or --corpus", file=sys.stderr)
        return 2

    try:
        case = loader.load(args.target)
    except (ValueError, TypeError, SyntaxError, ImportError, OSError) as e:
        print(f"error: cannot use {args.target}: {e}", file=sys.stderr)
        return 2
    if case.kind == "device_put":
        print(f"error: {args.target} is a device_put case (one data movement, no program to lower); use "
              "python -m conformance bisect on it.", file=sys.stderr)
        return 2

    kw = case.bisect_kwargs()
    fn = kw.pop("_fn", case.program)
    try:
        exp = explain(fn, *case.inputs, max_ulp=args.max_ulp, tolerance=args.tolerance, policy=args.policy, **kw)
    except (ValueError, TypeError, RuntimeError, NotImplementedError) as e:  # JAX refused to lower it
        print(f"error: cannot lower {args.target}: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(exp.to_json()))
    else:
        print(f"reproducer {args.target} ({case.kind}, {len(case.inputs)} input(s))")
        if case.no_jaxpr:
            print("note: the program is the StableHLO jax.export serialized (its jaxpr is not kept): the jaxpr stage "
                  "is not evaluated, and the lowered stage is the program as it was when checked")
        print(exp.report())
    return 1 if exp.diverged_in else 0


def _corpus(args) -> int:
    rows = check_corpus()
    if args.json:
        print(json.dumps({"programs": [{"name": r.name, "status": r.status, "diverged_in": r.diverged_in,
                                        "seconds": r.seconds} for r in rows], "summary": summary(rows)}))
    else:
        width = max(len(r.name) for r in rows)
        print(f"{'program':<{width}}  " + "  ".join(f"{s:<9}" for s in STAGES[1:]))
        for r in rows:
            print(f"{r.name:<{width}}  " + "  ".join(f"{_short(r.status[s]):<9}" for s in STAGES[1:]))
        s = summary(rows)
        print("agree with the stage before: " + ", ".join(f"{k} {s[k]}/{s['programs']}" for k in STAGES[1:]))
        for r in rows:
            for stage in STAGES[1:]:
                if r.status[stage] not in ("agrees",):
                    print(f"  {r.name} {stage}: {r.status[stage]}")
    return 1 if any(r.diverged_in for r in rows) else 0


def _short(status: str) -> str:
    return status if status in ("agrees", "DIFFERS") else status.split(":", 1)[0]
