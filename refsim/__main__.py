"""`python -m refsim coverage [--json] [--no-missing]`: refsim's rules vs the installed JAX's primitives."""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refsim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    cov = sub.add_parser("coverage", help="which JAX primitives have a refsim rule, and how many do not")
    cov.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    cov.add_argument("--no-missing", action="store_true", help="do not list the primitives without a rule")
    args = parser.parse_args(argv)
    if args.command == "coverage":
        from refsim.coverage import coverage, render

        c = coverage()
        print(json.dumps(c.as_dict()) if args.json else render(c, show_missing=not args.no_missing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
