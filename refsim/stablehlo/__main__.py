"""`python -m refsim.stablehlo coverage FILE... [--json]`: which ops of these modules refsim.stablehlo runs.

Each FILE is a StableHLO module (text or bytecode, e.g. `jax.jit(f).lower(x).as_text()` saved to
a file) or XLA's HLO text (`compiled.as_text()`: a file starting with ``HloModule``). Prints, per
file and in total, the ops used (custom calls by target) and those without a rule; exit status 1
when any op is missing, 2 when a file cannot be read. The corpus, the examples and drawn
programs are counted by `python -m conformance explain --coverage`.
"""
from __future__ import annotations

import argparse
import json
import sys


def _read(path: str):
    from refsim import compat

    with open(path, "rb") as fh:
        data = fh.read()
    head = data.lstrip()[:64]
    if head.startswith(b"HloModule"):
        from refsim.stablehlo.hlo_text import explicit_groups, reduction_types_match_operands

        text = data.decode()
        return compat.hlo_text_to_stablehlo_bytes(reduction_types_match_operands(explicit_groups(text)))
    if head.startswith((b"module", b"#", b"func", b"//")):
        return data.decode()
    return data


def coverage_of_files(paths) -> dict:
    """{"files": {path: {"ops": [...], "missing": {op: where}}}, "ops": n, "missing": {op: [path, ...]}}."""
    import refsim.stablehlo as sh
    from refsim.stablehlo import plan
    from refsim.stablehlo.registry import op_key

    files, all_ops, missing = {}, set(), {}
    for path in paths:
        program = sh.load(_read(path))
        ops = sorted({op_key(op) for fn in program.funcs.values() for op in plan.walk(fn.body)})
        miss = sh.coverage(program)
        files[path] = {"ops": ops, "missing": miss}
        all_ops.update(ops)
        for op in miss:
            missing.setdefault(op, []).append(path)
    return {"files": files, "ops": len(all_ops), "missing": missing}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refsim.stablehlo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cov = sub.add_parser("coverage", help="which ops of the given modules have a rule")
    cov.add_argument("files", nargs="+", help="StableHLO text / bytecode or HLO text files")
    cov.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        res = coverage_of_files(args.files)
    except (OSError, ValueError, TypeError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res))
    else:
        n, miss = res["ops"], res["missing"]
        print(f"refsim.stablehlo runs {n - len(miss)} of the {n} ops used by {len(res['files'])} module(s)"
              f" ({100.0 * (n - len(miss)) / max(n, 1):.1f}%)")
        for op, where in sorted(miss.items()):
            print(f"  missing {op}: {', '.join(where)}")
    return 1 if res["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
