"""How the sharded suite's inexact outputs are judged, counted element by element, for given seeds.

    python scripts/allowed_census.py [--seeds 0,1,2] [--examples 20] [--json FILE]

For each seed, the sharded suite's programs of the default run (`conformance.suites.sharded.
task_chunks`, the same draws as `python -m conformance run --seed S`), each on every data set:
refsim runs the program, `ShardedProgram.tolerances()` builds its policies exactly as the suite
does, and every element of an inexact output (the value model's "abs" / "rel" outputs) is counted
once as held to its allowed set (decided, and tighter than the value model), held to the value
model (decided, the allowed set wider there), undecidable (a comparison, rounding or branch it
depends on was closer than its bounds: judged by the value model, never by nobody), or outside any
allowed set (no bound rule, the walk above its work limit, a failure of the walk: the value model
alone; a second table names why, by elements). No XLA run: the census is refsim's and the walk's. One table row per seed and a total; the
issue's goal (issue 39) is under 1% undecidable.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

FIELDS = ("data_sets", "inexact_outputs", "allowed_outputs", "elements", "allowed", "value_model", "undecidable",
          "no_allowed_set", "errors")


def _reasons(case) -> list:
    """Per output of `case`, why it has no allowed set (None where the walk bounds it), as
    `conformance.strategies._sharded_allowed.refine` decides: the entry or class the walk does not
    take, a walk above its work limit, or the primitives without a bound rule it depends on."""
    import jax

    from conformance.strategies import _sharded_allowed as sa
    from refsim import bounds
    from refsim.bounds.coverage import work_estimate

    n = len(case.policies)
    if case.entry != "jit":
        return [f"not walked ({case.entry})"] * n
    try:
        closed = sa._chain_closed(case) if case.program_class == "jit_chain_orders" else sa._closed(case)
        if work_estimate(closed) > sa.MAX_WORK:
            return ["walk above its work limit"] * n
        flat = [np.asarray(a) for a in jax.tree_util.tree_leaves(case.args)]
        res = bounds.evaluate(closed, flat, relaxations=frozenset())
    except Exception as e:  # noqa: BLE001 - what the refinement swallows, named
        return [f"walk failed ({type(e).__name__})"] * n
    return [None if isinstance(o, bounds.BVal) else "no bound rule: " + ", ".join(sorted(getattr(o, "reasons", ()) or {"?"}))
            for o in res.outputs]


def _count(case, c: dict) -> None:
    """Add one data set of one program to the counts `c`."""
    import refsim
    from conformance.verdict.allowed import AllowedSet

    c["data_sets"] += 1
    try:
        case.run(refsim)
        pols = case.tolerances()
    except Exception:  # noqa: BLE001 - a program refsim or the policies cannot take: counted, skipped
        c["errors"] += 1
        return
    outs = case.__dict__["_refsim_out"]
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    why = None
    for idx, ((kind, _), p, out) in enumerate(zip(case.policies, pols, outs)):
        if kind == "exact":
            continue
        c["inexact_outputs"] += 1
        if not isinstance(p, AllowedSet):
            n = sum(int(np.size(sh.data)) for sh in out.shards)     # per device block, as below
            c["elements"] += n
            c["no_allowed_set"] += n
            if why is None:
                why = _reasons(case)
            reason = why[idx] if idx < len(why) and why[idx] else "allowed set not built (bounds decided nothing)"
            c["why"][reason] = c["why"].get(reason, 0) + n
            continue
        c["allowed_outputs"] += 1
        for d, b in p.abs_sum.items():
            b = np.asarray(b, np.float64)
            und = int(np.isnan(b).sum())
            gov = int(p.governed(d).sum())
            c["elements"] += b.size
            c["undecidable"] += und
            c["allowed"] += gov
            c["value_model"] += b.size - und - gov


def census(seed: int, examples: int, devices: int = 8) -> dict:
    """The counts of FIELDS for one seed (module docstring): every data set of every program."""
    from conformance.suites import sharded

    c = dict.fromkeys(FIELDS, 0)
    c["why"] = {}
    for chunk in sharded.task_chunks(examples=examples, seed=seed, devices=devices):
        for task in chunk:
            for case in getattr(task, "variants", ()):
                _count(case, c)
    return c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0", help="comma-separated seeds of the default run")
    ap.add_argument("--examples", type=int, default=20, help="the run's --examples (default 20, as the default run)")
    ap.add_argument("--json", default=None, help="write one JSON line per seed here")
    args = ap.parse_args(argv)
    import jax

    rows, total = [], dict.fromkeys(FIELDS, 0)
    why_total: dict = {}
    out = open(args.json, "a") if args.json else None
    for s in (int(x) for x in args.seeds.split(",")):
        c = census(s, args.examples)
        rows.append((s, c))
        for k in FIELDS:
            total[k] += c[k]
        for k, v in c["why"].items():
            why_total[k] = why_total.get(k, 0) + v
        if out:
            out.write(json.dumps({"seed": s, "jax": jax.__version__, **c}) + "\n")
            out.flush()
        print(f"seed {s}: {c}", file=sys.stderr)
    print(f"jax {jax.__version__}; devices (element counts are per device block, so replicas count once each)\n")
    print("| seed | programs x data sets | inexact outputs | with an allowed set | elements | allowed set | value model "
          "| undecidable | no allowed set |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s, c in rows + [("all", total)]:
        e = max(c["elements"], 1)
        print(f"| {s} | {c['data_sets']} | {c['inexact_outputs']} | {c['allowed_outputs']} | {c['elements']} "
              f"| {c['allowed']} ({100 * c['allowed'] / e:.1f}%) | {c['value_model']} ({100 * c['value_model'] / e:.1f}%) "
              f"| {c['undecidable']} ({100 * c['undecidable'] / e:.2f}%) | {c['no_allowed_set']} "
              f"({100 * c['no_allowed_set'] / e:.1f}%) |")
    print("\nElements without an allowed set, by why (all seeds):\n\n| why | elements |\n|---|---:|")
    for k, v in sorted(why_total.items(), key=lambda kv: -kv[1]):
        print(f"| {k} | {v} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
