"""`python -m conformance check SCRIPT.py [ARGS...]`: run a script in oracle mode (like `coverage run`).

    python -m conformance check [--report FILE] [--platform P] [--devices N] [--plant NAME] SCRIPT.py [ARGS...]

Every distributed program the script executes (jit, pjit, pmap, eager shard_map,
transformations applied outside jit, eager operations on sharded arrays) is also run on refsim
and compared; disagreements are printed as they happen (report and reproducer), and at the end
the summary line ``conformance oracle: N calls checked, D disagreed, S not checkable; E
distributed executions seen, M not intercepted`` and the census (with a WARNING line when
nothing was checked). `--plant NAME` runs the script with a fault of `conformance.faults` planted
on XLA's side (`conformance.faults.catalogue`: the lowering and numerics faults) and says whether
it fired. Exit status: the script's own when it fails, else 1 if any call disagreed, else 0; 2 for
bad arguments.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys

from conformance import validation
from conformance.arguments import Parser   # one-line errors, exit 2, as the other subcommands
from conformance.faults import catalogue
from conformance.oracle import intercept
from conformance.oracle.session import Session
from xla_backend import platform


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="python -m conformance check",
                                 description="Run SCRIPT.py with every distributed JAX call checked against refsim.")
    ap.add_argument("--report", metavar="FILE", help="write the JSON report (counts, reasons, one record per call)")
    ap.add_argument("--platform", default="cpu", help="JAX platform (default cpu)")
    ap.add_argument("--devices", type=validation.device_count_option("--devices"), default=8,
                    help="virtual CPU devices (default 8)")
    ap.add_argument("--repro-dir", metavar="DIR", help="where reproducers go (default: a temporary folder)")
    catalogue.add_plant_option(ap, "check")
    ap.add_argument("script", help="the Python script to run")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    ours = argv[:next((i for i, a in enumerate(argv) if not a.startswith("-")), len(argv))]
    if not any(a in ("-h", "--help") for a in ours) and len(ours) == len(argv):
        ap.error("missing SCRIPT.py, the Python script to run")
    args = ap.parse_args(argv)
    try:
        plants = catalogue.resolve(args.plant, "check")
    except ValueError as e:
        ap.error(str(e))
    if not os.path.isfile(args.script):
        ap.error(f"script {args.script!r} does not exist; pass the path of a Python file")
    if args.report and os.path.isdir(args.report):
        ap.error(f"--report {args.report!r} is a folder; pass a file name such as oracle.json")
    platform.configure(args.platform, args.devices)
    session = Session(repro_dir=args.repro_dir, echo=lambda text: print(text, file=sys.stderr))
    session.context = args.script
    intercept.install(session)
    status = 0
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [args.script] + list(args.args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    try:
        with catalogue.planted(plants, lambda text: print(text, file=sys.stderr)):
            try:
                runpy.run_path(args.script, run_name="__main__")
            except SystemExit as e:
                code = e.code
                status = code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        intercept.uninstall()
    for line in session.summary_lines():
        print(line)
    if args.report:
        session.write_report(args.report)
        print(f"conformance oracle report: {args.report}")
    if status:
        return status
    return 1 if session.counts()["disagreed"] else 0
