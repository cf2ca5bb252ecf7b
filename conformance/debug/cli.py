"""`python -m conformance bisect FILE.py[:NAME]`: find where XLA and refsim diverge on a reproducer.

Prints the bisect report (equation, source line, inputs' layouts, per-device grid, the
differing index ranges; a device_put case, which has no equations, is compared device by device) and optionally writes HTML/SVG/PNG pictures and refsim's
intermediate values. `--plant NAME` plants a fault of `conformance.faults` on XLA's side for the
run (`conformance.faults.catalogue`) and says on stderr whether it fired. Exit status: 0 when both
sides agree, 1 on a divergence, 2 when the file or an argument cannot be used.
"""
from __future__ import annotations

import argparse
import html
import importlib
import sys

import refsim
from conformance import validation
from conformance.debug import loader, picture
from conformance.faults import catalogue


def build_parser(prog: str = "python -m conformance bisect") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Find the first jaxpr equation where XLA and refsim "
                                                       "disagree on a conformance reproducer.")
    p.add_argument("target", help="reproducer file, optionally with a case name: FILE.py or FILE.py:NAME")
    p.add_argument("--max-ulp", type=validation.option("--max-ulp", low=0, what="0: bit-exact"), default=None,
                   help="values within this many ULP count as equal (instead of --tolerance)")
    p.add_argument("--tolerance", choices=("auto", "exact"), default="auto",
                   help="auto (default): exact values bit-exact, rounded floats within 256 (float32) / 16 (narrow "
                        "floats) units of roundoff of each value's largest magnitude; exact: bit for bit")
    p.add_argument("--policy", choices=("auto", "spec", "heuristic"), default="auto",
                   help="with --tolerance auto, floats are also held to the program's allowed set: auto (default) "
                        "under the platform's declared relaxations, spec without them; heuristic: not at all")
    p.add_argument("--metric", choices=picture.METRICS, default="ulp", help="what the device grid shows")
    p.add_argument("--html", metavar="PATH", help="write the report and device grid as an HTML page")
    p.add_argument("--svg", metavar="PATH", help="write the device grid as SVG")
    p.add_argument("--png", metavar="PATH", help="write the device grid as PNG (needs matplotlib)")
    p.add_argument("--runner", metavar="MODULE:NAME",
                   help="the XLA-side runner, called as runner(region, args) for each prefix (default "
                        "conformance.debug.region:isolated_runner: XLA compiles and runs the prefix in a worker "
                        "process, so a fatal XLA CHECK is reported as a crash; conformance.debug.region:xla_runner "
                        "compiles in this process); e.g. conformance.faults.jaxpr:reverse_first_ppermute plants a "
                        "miscompile (as --plant jaxpr:reversed_ppermute does). For a device_put case it is called "
                        "as runner(x, source, target) (default conformance.debug.movement:xla_device_put)")
    catalogue.add_plant_option(p, "bisect")
    p.add_argument("--intermediates", metavar="DIR",
                   help="also dump refsim's value of every equation as .npz files into DIR")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        case = loader.load(args.target)
    except (ValueError, TypeError, SyntaxError, ImportError) as e:
        print(f"error: cannot use {args.target}: {e}", file=sys.stderr)
        return 2
    if case.no_jaxpr:
        print(f"error: cannot bisect {args.target}: it holds the program as jax.export serialized it, with no "
              f"jaxpr to bisect. {case.no_jaxpr}.", file=sys.stderr)
        return 2
    max_ulp = args.max_ulp if args.max_ulp is not None else 0
    try:
        runner = _import_runner(args.runner) if args.runner else None
    except (ValueError, ImportError, AttributeError) as e:
        print(f"error: --runner {args.runner}: {e}", file=sys.stderr)
        return 2
    try:
        plants = catalogue.resolve(args.plant, "bisect")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if runner is not None and any(getattr(f, "stage", None) == "jaxpr" for f in plants):
        print(f"error: --runner {args.runner} and --plant {' '.join(args.plant)} both choose the runner; give "
              "one of them", file=sys.stderr)
        return 2
    try:
        with catalogue.planted(plants, lambda line: print(line, file=sys.stderr)):
            result = case.bisect(max_ulp=max_ulp, runner=runner, tolerance=args.tolerance, policy=args.policy)
    except (NotImplementedError, RuntimeError, ValueError) as e:
        if "unreduced" not in str(e):
            raise
        # JAX reads no global value of an array unreduced over some mesh axes (an output's partial values)
        print(f"error: cannot bisect {args.target}: {type(e).__name__}: {str(e).splitlines()[0]} (a value with "
              "unreduced axes has no global value to compare equation by equation; run the reproducer with "
              f"python {args.target}, which checks the value its partial values combine to)", file=sys.stderr)
        return 2
    print(f"reproducer {args.target} ({case.kind}, {len(case.inputs)} input(s))")
    if case.tolerance != "exact" and args.tolerance == "exact" and args.max_ulp is None:
        print(f"note: the reproducer compares with the {case.tolerance!r} policy; --tolerance exact compares "
              "bit-exactly. If it stops at a legitimate rounding difference, drop --tolerance exact.")
    print(result.report())
    if args.intermediates and case.kind == "device_put":
        print("no intermediates: a device_put case is one data movement with no equations")
    elif args.intermediates and case.kind == "called":
        print("no intermediates: dump them with refsim.jit(program, intermediates=DIR) on the program's function")
    elif args.intermediates:
        _dump_intermediates(case, args.intermediates)
        print(f"refsim intermediates written to {args.intermediates}")
    if not result.ok:
        if case.kind == "device_put":
            out, mesh = result.output, result.mesh
        else:
            out = next(r for r in result.divergence.outputs if not r.matched)
            mesh = result.region.mesh
        if args.svg:
            _write(args.svg, picture.render(mesh, out, metric=args.metric, format="svg"))
        if args.html:
            svg = picture.render(mesh, out, metric=args.metric, format="svg")
            _write(args.html, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>bisect "
                   f"{html.escape(args.target)}</title></head><body>\n{svg}\n<pre>"
                   f"{html.escape(result.report())}</pre>\n</body></html>\n")
        if args.png:
            try:
                picture.to_png(mesh, out, args.png, metric=args.metric)
            except ImportError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
    return 0 if result.ok else 1


def _import_runner(spec: str):
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError("expected MODULE:NAME, e.g. conformance.faults.jaxpr:reverse_first_ppermute")
    runner = getattr(importlib.import_module(module), name)
    if not callable(runner):
        raise ValueError(f"{spec} is not callable; a runner is called as runner(region, args).")
    return runner


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _dump_intermediates(case, directory: str) -> None:
    kw = case.bisect_kwargs()
    fn = kw.pop("_fn", case.program)
    if "in_specs" in kw:
        refsim.shard_map(fn, intermediates=directory, **kw)(*case.inputs)
    else:
        kw.pop("mesh")
        refsim.jit(fn, intermediates=directory, **kw)(*case.inputs)
