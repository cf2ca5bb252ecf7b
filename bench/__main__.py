"""`python -m bench [--quick] [--parts throughput,conformance,overhead,scaling,bandwidth,stablehlo,oracle_large] [--json FILE]
[--against DIR] [--docs PAGE]`

Runs the chosen parts in one process (scaling, overhead and the conformance side by side start
child processes), prints a table per part and a final table of the issue's targets, and writes
one JSON line per figure to stdout (and appended to FILE with --json). `--against DIR` measures
the conformance run (and the oracle_large part) side by side with the checkout in DIR; `--docs PAGE` renders the run into
PAGE (docs/performance.md) with `bench.docs`. See docs/performance.md.
"""
from __future__ import annotations

import argparse
import os
import sys

from bench import _common as C

PARTS = ("throughput", "conformance", "reruns", "overhead", "scaling", "bandwidth", "stablehlo", "oracle_large")


def _module(part: str):
    import importlib

    return importlib.import_module({"conformance": "bench.conformance_rate"}.get(part, f"bench.{part}"))


def targets(results: dict) -> list[tuple]:
    """(target, measured, met) for every target the issues state whose part ran."""
    rows = []
    if "throughput" in results:
        r = next(x for x in results["throughput"] if x.get("engine") == "ratio")
        v = r["ratio_refsim_over_xla"]
        rows.append(("refsim >= 10x XLA programs/s (small-program corpus, medians)", f"{v:.1f}x", v >= 10))
    if "conformance" in results:
        side = {x["variant"]: x for x in results["conformance"] if x.get("bench") == "conformance_side_by_side"}
        if {"baseline", "cold", "rerun"} <= set(side):
            # Each run takes minutes, so load can change between the variants of one pass: the
            # target counts as met only if every pass reaches it, not just the ratio of medians.
            base = side["baseline"]["examples_per_s_each"]
            for v in ("cold", "rerun"):
                per = [c / b for c, b in zip(side[v]["examples_per_s_each"], base)]
                med = side[v]["examples_per_s"] / side["baseline"]["examples_per_s"]
                rows.append((f"conformance run >= 2x the baseline's examples/s ("
                             + ("cold compilation cache" if v == "cold" else "rerun on the same machine") + ")",
                             f"{med:.2f}x (per pass: {', '.join(f'{x:.2f}x' for x in per)})", min(per) >= 2))
    if "reruns" in results:
        from bench.reruns import targets as reruns_targets

        rows += reruns_targets(results["reruns"])
    if "overhead" in results:
        for r in results["overhead"]:
            if r["engine"] == "refsim" and r["devices"] == 16384:
                ok = r.get("status") == "ok"
                rows.append(("cached call on tiny data, 16384 devices: <= 1 ms",
                             C.fmt_seconds(r["seconds"]) if ok else r.get("status"), ok and r["seconds"] <= 1e-3))
    if "scaling" in results:
        recs = [r for r in results["scaling"] if r["engine"] == "refsim" and r.get("status") == "ok"]
        for r in recs:
            data = r["data_bytes"]
            if r["devices"] == 4096 and r["mib"] == 64:
                rows.append(("five collectives, 4096 devices, 64 MiB: <= 1 s", C.fmt_seconds(r["seconds"]),
                             r["seconds"] <= 1.0))
            if r["devices"] == 65536 and r["mib"] == 64:
                rows.append(("65536 devices, 64 MiB, read back: repeated call <= 1 s", C.fmt_seconds(r["seconds"]),
                             r["seconds"] <= 1.0))
                rows.append(("65536 devices, 64 MiB: first call <= 2 s", C.fmt_seconds(r["first_s"]), r["first_s"] <= 2.0))
                rows.append(("65536 devices, 64 MiB: peak RSS above baseline <= 3x data", f"{r['rss_above_baseline'] / data:.2f}x",
                             r["rss_above_baseline"] <= 3 * data))
        for r in [r for r in results["scaling"] if r["engine"] == "refsim" and r["devices"] >= 16384]:
            rows.append((f"{r['devices']} devices runs and is correct ({r['mib']:g} MiB)", r.get("status"),
                         r.get("status") == "ok" and r.get("correct", False)))
    if "bandwidth" in results:
        from bench.bandwidth import ONE_THREAD

        recs = results["bandwidth"]
        views = [("", [r for r in recs if r["op"] != ONE_THREAD])]
        if any(r["op"] == ONE_THREAD for r in recs):  # the same, all_to_all's copy on one thread
            views.append((", all_to_all on 1 thread", [r for r in recs if r["op"] != "all_to_all"]))
        for label, sel in views:
            worst = max(sel, key=lambda r: r["ratio_to_copyto"])
            rows.append((f"each collective <= 3x np.copyto through refsim.shard_map ({worst['mib']:g} MiB{label})",
                         f"worst {worst['op']} @ {worst['layout']}: {worst['ratio_to_copyto']:.1f}x",
                         worst["ratio_to_copyto"] <= 3))
    if "stablehlo" in results:
        s = results["stablehlo"][-1]
        if s.get("median_ratio") is not None:
            rows.append(("StableHLO (lowered) interpretation <= ~3x jaxpr interpretation (corpus median)",
                         f"median {s['median_ratio']:.2f}x, max {s['max_ratio']:.1f}x", s["median_ratio"] <= 3))
    return rows


def main(argv=None) -> int:
    from conformance import validation

    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the code paths, not the figures")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated subset of {','.join(PARTS)} (default: all)")
    ap.add_argument("--json", metavar="FILE", help="also append every JSON line to FILE")
    ap.add_argument("--against", metavar="DIR",
                    help="conformance part: side by side with the checkout in DIR (default $BENCH_BASELINE)")
    ap.add_argument("--examples", type=validation.option("--examples", integer=True, low=1),
                    default=20, help="conformance side by side: --examples (default 20)")
    ap.add_argument("--passes", type=validation.option("--passes", integer=True, low=1),
                    default=2, help="conformance side by side: interleaved passes (default 2)")
    ap.add_argument("--docs", metavar="PAGE", help="render this run into PAGE (e.g. docs/performance.md)")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        ap.error(f"--parts={args.parts!r}: unknown part(s) {bad}; choose from {','.join(PARTS)}.")
    against = args.against or os.environ.get("BENCH_BASELINE")

    records: list = []
    C.open_json(args.json)
    C.add_sink(records)
    try:
        C.emit(C.machine())
        results = {}
        for part in parts:
            mod = _module(part)
            if part in ("conformance", "reruns") and against and not args.quick:
                results[part] = mod.side_by_side(against, examples=args.examples, passes=args.passes)
            elif part == "oracle_large":
                results[part] = mod.run(quick=args.quick, against=None if args.quick else against)
            else:
                results[part] = mod.run(quick=args.quick)
            mod.show(results[part])
        rows = targets(results)
        if rows:
            C.table("targets" + (" (--quick: sizes too small to judge)" if args.quick else ""),
                    ["target", "measured", "met"], [(t, m, "yes" if ok else "NO") for t, m, ok in rows])
            for t, m, ok in rows:
                C.emit(dict(bench="target", target=t.strip(), measured=m, met=bool(ok), quick=args.quick))
    finally:
        C.close_json()
    if args.docs:
        from bench import docs

        with open(args.docs, "w") as fh:
            fh.write(docs.render(records))
        print(f"wrote {args.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
