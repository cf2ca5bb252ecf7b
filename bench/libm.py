"""refsim's transcendentals against NumPy's: `python -m bench.libm [--sizes 1e6,1e7] [--passes N]
[--exact-passes N] [--ops exp,log,...] [--json FILE] [--markdown]`.

For exp, log, tanh, sin and erf on float32 arrays, times `refsim.libm.evaluate` (the fast path
with its exact fallback, what every rule calls), NumPy's own float32 ufunc and the float64
function the fast path evaluates (on an already widened array: the floor of any method that
decides float32 results from a float64 approximation) in interleaved passes on the same array, by the process's CPU time, and
reports each as CPU-ms per million elements: the median and the range of the passes, the ratio
of the medians, the share of elements the fast path left to the exact path, and the exact path
alone (`refsim.libm.evaluate_exact`, the implementation before the fast path; fewer passes, the
smallest size). NumPy has no erf: its column is SciPy's `scipy.special.erf` on the float32
array. The machine's load average is printed before and after. One table, then one JSON line
per (op, size) and a summary line (`"bench": "libm_summary"`); `--markdown` then prints the
table of docs/performance.md's libm section.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import scipy.special

from bench import _common as C
from refsim import libm
from refsim.libm import fast

OPS = ("exp", "log", "tanh", "sin", "erf")
_NUMPY = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "sin": np.sin, "erf": scipy.special.erf}
# the float64 function the fast path evaluates (sin: tan of x / 2): the floor of any evaluation
# that decides float32 results from a float64 approximation
_FLOAT64 = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "sin": np.tan, "erf": scipy.special.erf}


def inputs(op: str, n: int, seed: int = 0) -> np.ndarray:
    """n float32 inputs where a model's activations put them (drawn with exact operations)."""
    rng = np.random.default_rng(seed)
    if op == "log":  # probabilities and scales: log-uniform over [2**-20, 2**10]
        x = np.ldexp(rng.uniform(1.0, 2.0, n), rng.integers(-20, 10, n))
    elif op == "sin":  # angles, as rotary embeddings make them
        x = rng.uniform(-100.0, 100.0, n)
    elif op == "exp":  # logits less their maximum, and a few positive ones
        x = rng.normal(-4.0, 4.0, n)
    else:
        x = rng.normal(0.0, 2.0, n)
    return x.astype(np.float32)


def undecided_share(op: str, x: np.ndarray) -> float:
    """The share of x's elements the fast path leaves to the exact path (1: no fast path)."""
    if not fast.applies(op, [x]):
        return 1.0
    return float(fast.undecided(op, x, libm.round_once).mean())


def measure(op: str, n: int, passes: int, exact_passes: int) -> dict:
    x = inputs(op, n)
    ref, f64 = _NUMPY[op], _FLOAT64[op]
    x64 = x.astype(np.float64) * (0.5 if op == "sin" else 1.0)
    times = C.interleaved({"numpy": lambda: ref(x), "refsim": lambda: libm.evaluate(op, x),
                           "float64": lambda: f64(x64)}, passes, clock=time.process_time)
    rec = {"bench": "libm", "op": op, "n": n, "dtype": "float32", "passes": passes,
           "numpy_is": "scipy.special.erf" if op == "erf" else f"numpy.{op}",
           "fast_path": fast.applies(op, [x]), "undecided_share": undecided_share(op, x)}
    for k, ts in times.items():
        st = C.stats([t * 1e9 / n for t in ts])  # CPU-ms per million elements
        rec[f"{k}_ms_per_m"] = st["median"]
        rec[f"{k}_ms_per_m_range"] = [st["min"], st["max"]]
    rec["ratio"] = rec["refsim_ms_per_m"] / rec["numpy_ms_per_m"]
    rec["float64_is"] = ("scipy.special." if op == "erf" else "numpy.") + f64.__name__
    rec["float64_ratio"] = rec["float64_ms_per_m"] / rec["numpy_ms_per_m"]
    if exact_passes:
        ts = C.interleaved({"exact": lambda: libm.evaluate_exact(op, x)}, exact_passes, clock=time.process_time)
        st = C.stats([t * 1e9 / n for t in ts["exact"]])
        rec["exact_ms_per_m"], rec["exact_ms_per_m_range"] = st["median"], [st["min"], st["max"]]
    return rec


def _cell(rec: dict, key: str) -> str:
    if f"{key}_ms_per_m" not in rec:
        return "-"
    lo, hi = rec[f"{key}_ms_per_m_range"]
    return f"{rec[key + '_ms_per_m']:.2f} ({lo:.2f}–{hi:.2f})"


def markdown(records: list[dict], mach: dict, load_after: list) -> str:
    """The table as docs/performance.md shows it (`--markdown`)."""
    lines = [f"{mach['date']}, commit `{mach['commit']}`, {mach['cpu']}, {mach['cores']} cores, NumPy "
             f"{mach['numpy']}, Python {mach['python']}; load average {mach['load_average']} before, "
             f"{load_after} after; {records[0]['passes']} interleaved passes per row.", "",
             "| op | elements | baseline | baseline CPU-ms/M | refsim CPU-ms/M | refsim / baseline | "
             "float64 function alone CPU-ms/M (/ baseline) | to the exact path | exact path alone (before) CPU-ms/M |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['op']} | {r['n']:.0e} | `{r['numpy_is']}` | {_cell(r, 'numpy')} | {_cell(r, 'refsim')} | "
                     f"{r['ratio']:.2f}× | `{r['float64_is']}` {_cell(r, 'float64')} ({r['float64_ratio']:.2f}×) | "
                     f"{r['undecided_share']:.1e} | {_cell(r, 'exact')} |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m bench.libm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e6,1e7", help="comma-separated element counts (default 1e6,1e7)")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated ops (default {','.join(OPS)})")
    ap.add_argument("--passes", type=int, default=9, help="interleaved passes per (op, size) (default 9)")
    ap.add_argument("--exact-passes", type=int, default=3,
                    help="passes of the exact path alone, at the smallest size (default 3; 0: skip)")
    ap.add_argument("--json", help="also append the JSON lines to this file")
    ap.add_argument("--markdown", action="store_true", help="also print the table as docs/performance.md has it")
    args = ap.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    ops = args.ops.split(",")
    bad = [o for o in ops if o not in _NUMPY]
    if bad:
        raise SystemExit(f"--ops: unknown op(s) {bad}; choose from {list(_NUMPY)}.")
    C.open_json(args.json)
    mach = C.machine()
    C.emit(mach)
    records = []
    for n in sizes:
        for op in ops:
            rec = measure(op, n, args.passes, args.exact_passes if n == min(sizes) else 0)
            C.emit(rec)
            records.append(rec)
    load_after = [round(v, 2) for v in os.getloadavg()]
    rows = [(r["op"], f"{r['n']:.0e}", r["numpy_is"], _cell(r, "numpy"), _cell(r, "refsim"), f"{r['ratio']:.2f}×",
             f"{_cell(r, 'float64')} ({r['float64_ratio']:.2f}×)", f"{r['undecided_share']:.1e}", _cell(r, "exact"))
            for r in records]
    C.table(f"refsim.libm vs NumPy, float32, CPU-ms per million elements (median (range) of "
            f"{args.passes} interleaved passes; load average {mach['load_average']} before, {load_after} after; "
            f"{mach['cores']} cores, {mach['cpu']})",
            ["op", "n", "baseline", "baseline ms/M", "refsim ms/M", "refsim / baseline",
             "float64 function alone ms/M (/ baseline)", "to exact path",
             "exact path alone ms/M"], rows)
    C.emit({"bench": "libm_summary", "commit": mach["commit"], "load_average_before": mach["load_average"],
            "load_average_after": load_after, "max_ratio": max(r["ratio"] for r in records),
            "ratios": {f"{r['op']}@{r['n']:.0e}": round(r["ratio"], 2) for r in records}})
    C.close_json()
    if args.markdown:
        print(markdown(records, mach, load_after))
    return records


if __name__ == "__main__":
    main()
