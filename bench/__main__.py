"""`python -m bench [--quick] [--parts throughput,conformance,scaling,bandwidth,stablehlo] [--json FILE]`

Runs the chosen parts in one process (scaling starts one child process per measurement),
prints a table per part and a final table of the issue's targets, and writes one JSON
line per figure to stdout (and appended to FILE with --json). See docs/performance.md.
"""
from __future__ import annotations

import argparse
import sys

from bench import _common as C

PARTS = ("throughput", "conformance", "scaling", "bandwidth", "stablehlo")


def _module(part: str):
    import importlib

    return importlib.import_module({"conformance": "bench.conformance_rate"}.get(part, f"bench.{part}"))


def targets(results: dict) -> list[tuple]:
    """(target, measured, met) for every target the issue states whose part ran."""
    rows = []
    if "throughput" in results:
        r = next(x for x in results["throughput"] if x.get("engine") == "ratio")
        v = r["ratio_refsim_over_xla"]
        rows.append(("refsim >= 10x XLA programs/s (small-program corpus)", f"{v:.1f}x", v >= 10))
    if "scaling" in results:
        recs = [r for r in results["scaling"] if r["engine"] == "refsim"]
        big = [r for r in recs if r["devices"] == 4096 and r["mib"] == 64 and r.get("status") == "ok"]
        for r in big:
            data = 64 * 2**20
            rows.append(("five collectives, 4096 devices, 64 MiB: <= 1 s", C.fmt_seconds(r["seconds"]),
                         r["seconds"] <= 1.0))
            rows.append(("  peak RSS above baseline <= 3x data", f"{r['rss_above_baseline'] / data:.2f}x",
                         r["rss_above_baseline"] <= 3 * data))
        for r in [r for r in recs if r["devices"] == 16384]:
            rows.append((f"16384 devices runs ({r['mib']} MiB)", r.get("status"),
                         r.get("status") == "ok" and r.get("correct", False)))
    if "bandwidth" in results:
        recs = results["bandwidth"]
        worst = max(recs, key=lambda r: r["ratio_to_copyto"])
        rows.append((f"each collective <= 3x np.copyto ({worst['mib']} MiB, all device counts)",
                     f"worst {worst['op']} @ {worst['devices']}: {worst['ratio_to_copyto']:.1f}x",
                     worst["ratio_to_copyto"] <= 3))
    if "stablehlo" in results:
        s = results["stablehlo"][-1]
        if s.get("median_ratio") is not None:
            rows.append(("StableHLO (lowered) interpretation <= ~3x jaxpr interpretation (corpus median)",
                         f"median {s['median_ratio']:.2f}x, max {s['max_ratio']:.1f}x", s["median_ratio"] <= 3))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the code paths, not the figures")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated subset of {','.join(PARTS)} (default: all)")
    ap.add_argument("--json", metavar="FILE", help="also append every JSON line to FILE")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        ap.error(f"--parts={args.parts!r}: unknown part(s) {bad}; choose from {','.join(PARTS)}.")

    C.open_json(args.json)
    try:
        C.emit(C.machine())
        results = {}
        for part in parts:
            mod = _module(part)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
