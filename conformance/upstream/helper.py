"""The subprocesses a hunt runs while it writes a finding's upstream report.

    python -m conformance.upstream.helper confirm SCRIPT VALUES.npz
        Import the plain-JAX script (it sets its own device count: this process has not loaded
        JAX yet), call its ``expected()`` (the program on one device) and print
        ``CONFIRM {"agree": ..., "differences": [...]}``: whether it agrees, within the script's
        own TOLERANCE, with refsim's global outputs (``out0``, ``out1``, ... in VALUES.npz).

    python -m conformance.upstream.helper shrink CASE.json --seconds T --devices N
        Cut a case whose values disagree (refsim against XLA, in this one process) down to the
        fewest ops and devices that still disagree: first `conformance.suites.sharded.candidates`
        alone (printing ``PATH [k, ...]``, the positions an example-database entry can replay),
        then fewer devices and candidates again. Each accepted variant is printed as
        ``STEP <case data>`` (`conformance.hunt.case_to_data`) at once, so the caller keeps the
        last one even if a variant kills this process.
"""
from __future__ import annotations

import argparse
import json
import runpy
import sys

import numpy as np

# JAX is imported inside the commands: `confirm` must let the script set XLA_FLAGS first.


def confirm(script: str, values: str) -> dict:
    ns = runpy.run_path(script, run_name="upstream_confirm")
    got = ns["expected"]()
    with np.load(values, allow_pickle=False) as z:
        want = [z[f"out{k}"] for k in range(len(z.files))]
    if len(got) != len(want):
        return {"agree": False, "differences": [f"{len(got)} outputs on one device, refsim {len(want)}"]}
    diffs = [ns["differences"](k, np.asarray(g), w) for k, (g, w) in enumerate(zip(got, want))]
    diffs = [f"output {k}: {d}" for k, d in enumerate(diffs) if d]
    return {"agree": not diffs, "differences": diffs}


def shrink(case_path: str, seconds: float, devices: int) -> None:
    import time

    from xla_backend import platform as xplat

    xplat.configure("cpu", devices)
    import refsim
    import xla_backend
    from conformance.hunt import case_to_data, read_case
    from conformance.suites.sharded import candidates
    from conformance.upstream.shrink import greedy
    from conformance.verdict.compare import compare

    def fails(c) -> bool:
        return not compare(c.run(refsim), c.run(xla_backend), case=c).ok

    def show(c, step):
        print("STEP " + json.dumps(case_to_data(c)), flush=True)

    stop = time.monotonic() + seconds
    case = read_case(case_path)
    small, steps = greedy(case, fails, seconds / 2, cuts=(candidates,), on_step=show)
    print("PATH " + json.dumps([pos for _, pos in steps]), flush=True)
    greedy(small, fails, max(0.0, stop - time.monotonic()), on_step=show)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.upstream.helper")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("confirm")
    c.add_argument("script")
    c.add_argument("values")
    s = sub.add_parser("shrink")
    s.add_argument("case")
    s.add_argument("--seconds", type=float, default=60.0)
    s.add_argument("--devices", type=int, default=8)
    args = ap.parse_args(argv)
    if args.cmd == "confirm":
        print("CONFIRM " + json.dumps(confirm(args.script, args.values)), flush=True)
    else:
        shrink(args.case, args.seconds, args.devices)
    return 0


if __name__ == "__main__":
    sys.exit(main())
