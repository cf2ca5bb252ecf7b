"""Oracle mode on large arrays: a plain call beside the same call checked by `conformance.oracle`.

    python -m bench.oracle_large [--quick] [--mib 8 64 512] [--ops reshape,transpose,...] [--passes 3]
                                 [--against DIR]

For float32 arrays of `--mib` MiB laid out ``P('x')`` over 8 virtual CPU devices: a jit
``reshape`` ((n, 4096, 32) -> (n, 2048, 2, 32)), ``transpose`` (-> (n, 32, 4096)) and
``elementwise`` (``x * 2 + 1``), and ``device_put`` of the NumPy value onto the mesh (what
`pytest --conformance-oracle` checks as a reshard). Each (op, size) is timed in interleaved
passes: the plain call (no oracle installed), then the call with a `conformance.oracle` session
installed (`intercept.install`), each ending when XLA's result is ready; the checked call's
oracle record gives the oracle's own seconds (its report's `overhead`: host copies, refsim,
comparison; the wait for XLA's asynchronously dispatched result counts as XLA's) and, where the
oracle records them, the phases. Medians of the passes with their range.

Everything runs in one child process with 8 host devices (``XLA_FLAGS``), so the bench can
run beside other parts; ``--against DIR`` runs the same child on the checkout in DIR as well
(its oracle code, this file's driver), interleaved by size, for a before/after table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OPS = ("reshape", "transpose", "elementwise", "device_put")
MIBS = (8, 64, 512)
QUICK = dict(mibs=(4,), passes=1)
PASSES = 3
DEVICES = 8


# -- the child: one process with 8 host devices, the oracle code of its PYTHONPATH ---------------------
def _child(mibs, ops, passes) -> None:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={DEVICES}")
    # JAX reads XLA_FLAGS when it loads: imported only now
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    from conformance.oracle import intercept
    from conformance.oracle.session import Session

    mesh = jax.make_mesh((DEVICES,), ("x",), devices=jax.devices()[:DEVICES])
    lay = NamedSharding(mesh, P("x"))
    for mib in mibs:
        n = int(mib * 2**20 // (4096 * 32 * 4))
        value = np.arange(n * 4096 * 32, dtype=np.float32).reshape(n, 4096, 32)
        x = jax.device_put(value, lay)
        progs = {
            "reshape": jax.jit(lambda a: jnp.reshape(a, (n, 2048, 2, 32)), out_shardings=lay),
            "transpose": jax.jit(lambda a: jnp.transpose(a, (0, 2, 1)), out_shardings=lay),
            "elementwise": jax.jit(lambda a: a * 2 + 1, out_shardings=lay),
        }

        def call(op):
            if op == "device_put":
                return jax.device_put(value, lay).block_until_ready()
            return progs[op](x).block_until_ready()

        for op in ops:
            call(op)                                               # compile, touch the memory once
            session = Session()
            intercept.install(session)                             # one untimed check: the oracle's imports
            try:
                call(op)
            finally:
                intercept.uninstall()
            plain, checked, overhead, phases, outcome = [], [], [], [], set()
            for _ in range(passes):
                t = time.perf_counter()
                call(op)
                plain.append(time.perf_counter() - t)
                intercept.install(session)
                try:
                    t = time.perf_counter()
                    call(op)
                    checked.append(time.perf_counter() - t)
                finally:
                    intercept.uninstall()
                rec = [c for c in session.calls if c["via"] in ("jit call", "device_put")][-1]
                overhead.append(rec["seconds"])
                phases.append(rec.get("phases") or {})
                outcome.add(rec["outcome"])
            print(json.dumps({"op": op, "mib": mib, "shape": list(value.shape), "plain": plain, "checked": checked,
                              "overhead": overhead, "phases": phases, "outcome": sorted(outcome)}), flush=True)


def _run_child(checkout: str, mibs, ops, passes) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=checkout + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--mib", *map(str, mibs), "--ops", ",".join(ops),
           "--passes", str(passes)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=checkout)
    if proc.returncode != 0:
        raise RuntimeError(f"bench.oracle_large child on {checkout} failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _median_phases(phases: list[dict]) -> dict:
    from bench import _common as C

    keys = list(dict.fromkeys(k for p in phases for k in p))
    return {k: C.stats([p.get(k, 0.0) for p in phases])["median"] for k in keys}


def run(quick: bool = False, mibs=None, ops=None, passes: int | None = None, against: str | None = None) -> list[dict]:
    """One record per (commit, op, size): plain and checked call times, the oracle's own seconds and phases."""
    from bench import _common as C

    mibs = tuple(mibs or (QUICK["mibs"] if quick else MIBS))
    ops = tuple(ops or OPS)
    passes = passes or (QUICK["passes"] if quick else PASSES)
    sides = [("this commit", ROOT)] + ([("baseline", os.path.abspath(against))] if against else [])
    records = []
    for mib in mibs:                       # the sides interleaved by size: load hits both alike
        for label, checkout in sides:
            for r in _run_child(checkout, (mib,), ops, passes):
                plain, checked, over = C.stats(r["plain"]), C.stats(r["checked"]), C.stats(r["overhead"])
                commit = C.git_commit(checkout)
                if commit == "unknown":             # an exported tree (git archive): named by its folder
                    commit = os.path.basename(checkout.rstrip(os.sep))
                rec = dict(bench="oracle_large", variant=label, commit=commit, op=r["op"],
                           mib=r["mib"], shape=r["shape"], devices=DEVICES, plain=plain, checked=checked,
                           overhead=over, ratio=checked["median"] / plain["median"] if plain["median"] > 0 else None,
                           phases=_median_phases(r["phases"]), outcome=r["outcome"])
                C.emit(rec)
                records.append(rec)
    return records


PHASES = ("host_inputs", "trace", "host_outputs", "refsim", "policy", "compare", "summaries")


def show(records: list[dict]) -> None:
    from bench import _common as C

    rows = []
    for r in records:
        ph = r.get("phases") or {}
        rows.append((r["op"], f"{r['mib']:g} MiB", r["variant"], C.fmt_stat(r["plain"]), C.fmt_stat(r["checked"]),
                     C.fmt_stat(r["overhead"]), "-" if r["ratio"] is None else f"{r['ratio']:.1f}x",
                     ", ".join(f"{k} {C.fmt_seconds(ph[k])}" for k in PHASES if ph.get(k, 0) >= 5e-4) or "-",
                     ",".join(r["outcome"])))
    C.table("oracle on large arrays: float32 over 8 CPU devices, P('x')",
            ["op", "size", "commit", "plain call", "checked call", "oracle's own", "checked / plain",
             "oracle phases (medians)", "outcome"], rows)


def main(argv=None):
    from conformance import validation

    ap = argparse.ArgumentParser(prog="python -m bench.oracle_large", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 MiB, one pass: checks the code paths")
    ap.add_argument("--mib", type=validation.option("--mib", low=4), nargs="+",
                    help="array sizes in MiB (multiples of 4; default 8 64 512)")
    ap.add_argument("--ops", help=f"comma-separated subset of {','.join(OPS)}")
    ap.add_argument("--passes", type=validation.option("--passes", integer=True, low=1))
    ap.add_argument("--against", metavar="DIR", help="also run the checkout in DIR (its conformance/refsim)")
    ap.add_argument("--json", metavar="FILE", help="also append every JSON line to FILE")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",")] if args.ops else list(OPS)
    bad = [o for o in ops if o not in OPS]
    if bad:
        ap.error(f"--ops={args.ops!r}: unknown op(s) {bad}; choose from {','.join(OPS)}.")
    if args.child:
        _child(args.mib or MIBS, ops, args.passes or PASSES)
        return []
    from bench import _common as C

    C.open_json(args.json)
    try:
        if args.json:
            C.emit(C.machine())
        recs = run(args.quick, args.mib, ops, args.passes, args.against)
    finally:
        C.close_json()
    show(recs)
    return recs


if __name__ == "__main__":
    # the child runs by path, its conformance/refsim from its checkout's PYTHONPATH
    main()
