"""Write docs/performance.md from a bench run's JSON lines: no figure in that page is typed by hand.

    python -m bench --json figures.jsonl [--against ../base]      # measure
    python -m bench.docs figures.jsonl --out docs/performance.md  # render

`render(records)` turns the records of one or more runs (each starts with its `machine`
record) into the page: the machine and commit of every run used, the targets, and one table
per part with what it measures. Each part is taken from the last run that measured it (so a
long part may be run on its own: `python -m bench --parts conformance --json f.jsonl`, then
the others into the same file). Parts no run measured are said to be missing.
"""
from __future__ import annotations

import argparse
import json
import sys

from bench import _common as C

TITLE = "# Performance: refsim against XLA:CPU"

INTRO = """refsim is meant to be a fast CI oracle that scales past what XLA:CPU can simulate. The
benchmarks in `bench/` measure that side by side, on the same programs. This page is generated
by `python -m bench.docs` from the JSON lines of the bench runs listed below; every figure comes
from those files, none is typed by hand."""

RERUN = """## Rerun

```bash
git worktree add ../base <older-commit>                   # the baseline of the conformance part
python -m bench --json figures.jsonl --against ../base    # every part (7 min on a quiet 2-core machine)
python -m bench.docs figures.jsonl --out docs/performance.md
python -m bench.docs docs/performance-figures.jsonl --out docs/performance.md   # this page, again
python -m bench --quick                                   # tiny sizes: checks the code paths only
python -m bench.scaling --devices 4096 65536 --mib 64     # one part, own options
git worktree add --detach ../base <commit>                # the reruns part's baseline, then:
python -m bench.reruns --against ../base --passes 3 --json docs/performance-figures.jsonl
python -m bench.oracle_large --against ../base --json docs/performance-figures.jsonl   # oracle on large arrays
python -m bench.data_sets [--families]                  # what one more data set of a compiled program costs
```

`bench/` is not installed with the package (a top-level `bench` module would clash with other
projects): run these commands from the repository root, or from anywhere with
`PYTHONPATH=/path/to/checkout python -m bench`.

Method: things compared are timed in equal, interleaved passes (a, b, a, b, ...), so a burst of
load from other processes hits both alike; each figure is the median of its passes, with the
range of the passes in brackets. Ratios are ratios of medians. Each scaling and overhead cell is
its own process, so its peak memory is its own. `tests/bench/test_bench_smoke.py` runs every part in a
tiny configuration so the code cannot rot; it asserts no timings."""

NOTES = {
    "throughput": """Distinct small programs drawn with a fixed seed from `conformance.strategies.programs` over
`meshes(max_devices=8)` (collectives with elementwise/structural ops, scan, while, cond, switch,
grad, vmap, nested shard_map, jit with shardings, pmap with groups). Each pass uses fresh function
objects and empty caches, so every program is traced (and, for XLA, lowered and compiled) once.
Both engines trace every program with JAX the same way; refsim then interprets the jaxpr, XLA
lowers, compiles and runs it, so the ratio is about (trace + compile) / (trace + interpret) and
grows with program size and with load on the machine (compiling suffers more from it). A program
whose results differ is checked against `xfails/cpu.txt` as the conformance runner checks it.""",
    "conformance": """The default `python -m conformance run` (same seed and examples, no shrinking) of this commit
and of the baseline commit, each in a fresh process, in interleaved passes: baseline, this commit
with an empty compilation cache ("cold"), this commit again on the cache the cold pass wrote
("rerun": a second run on the same machine). examples/s is the runner's own figure (drawing
included, interpreter start-up not). The phases are the cold pass's work split by
`conformance.report.timing`; with one worker per core they overlap, so they add up to more than the wall
time.""",
    "reruns": """The baseline of this table is `f218ed1`, the last commit whose reruns read back the drawn plan
(pickled) and each case's executable under a key computed before tracing: caches that a changed JAX,
jaxlib or plugin under the same version string, or a monkeypatch, could not change (issue 38). This
commit draws, traces and lowers every case on every run, keeps only JAX's module-keyed executables in a
folder named by the content of the compiler's files, and verifies the first cache hit of up to 8
families per run; the table gives what that costs a rerun and the identity checks' share of it. The
paragraphs after the description of the variants are issue 29's history, measured against its own
baseline `1528a474` (its tables are in git history: docs/performance.md at `fc7a688`).

Four variants of `python -m conformance run --examples 20 --seed 0 --shrink-seconds 0` (defaults
otherwise: one worker per core, the default `--data-per-program`), each a fresh process, in
interleaved passes: the baseline commit on an empty `--compile-cache` folder ("baseline cold"), this
commit on an empty one ("cold"), the baseline again on the folder its cold pass filled ("baseline
rerun") and this commit again on its own ("rerun"). CPU is the whole process tree's (the run, its
preflight child and its workers: `RUSAGE_CHILDREN`) per example; examples/s is the runner's own
figure; workers busy is the seconds the workers spent in cases over workers × the runner's wall time
(from the end of its setup to its summary: a command line that starts its workers during the platform
preflight, as this commit's does, has their start-up outside it, overlapped with the preflight; the
process wall time holds everything, and `python -m bench.timeline` splits a run's idle worker time by
cause); examples/min is per minute of the process's wall time. An example is one data set run on both sides
and compared, so a compiled program run on more data sets checks more examples (`bench.reruns`):
this commit's per-example figures gain from its default `--data-per-program` as well as from its
caches, so the CPU seconds of each pass are given beside them. The extra data sets are not free:
per data set after a structure's first, warm, in one process (`python -m bench.data_sets`: refsim,
the XLA call with placement and read-back, the comparison, over the ~6,250 such data sets of this
plan, medians of 3 passes, 2026-11-26 at load 1 to 2) they cost 1.94 ms at `f9e88ab` (refsim 0.64,
XLA side 1.03, compare 0.26) and 0.88 ms at `b72d096` (0.30, 0.48, 0.11): one wrapper per program
structure instead of one per data set, a checked read-back plan per (sharding, shape), per-jaxpr interpreter
plans, and a comparison that checks every device's bits at once. The data-per-minute target still
reads below 3× at equal wall time at load 1 to 3: 2.62× at 1.20× the baseline's wall time at
`30cf13b`, 2.88× at 1.09× at `17b4c5a`, 2.97× at 1.06× at `9469c60` (that time's table; workers and the
command line freeze what they imported and collect young objects every 10,000 allocations instead of
700, and a process keeps 64 program wrappers instead of 4,096: 1.0 GB instead of 1.5 GB in one
process). Why it stays short, measured 2026-11-26 16:55 to 17:00 on `bd29bd7` with the 64-wrapper
bound (3 interleaved cold runs each, the CPU seconds of the workers alone, medians): at `--data-per-program 1` (the data sets each suite
draws, 2,320 examples) this commit's workers spend 53.9 CPU-s against the baseline's 52.4 (wall
31.1 s against 31.5 s), and at the default 10 (7,316 examples) 58.7 CPU-s (33.8 s). The fixed cost of a
cold run (XLA compiles ~55 %, JAX tracing and lowering ~15 %, both outside this project) is the
baseline's, and each extra data set adds ~1 ms of CPU, so 3× the examples at the baseline's wall time
needs a cold run ~10 % cheaper than the baseline's before any data set is added. Part of the
difference is the plan itself: the seed-0 plan changed when drawing stopped using source literals
(`conformance.suites.base.source_constants_off`), and in one process the 99 XLA modules only this
commit's plan compiles take 10.5 s against 7.5 s for the baseline's 100 (the 583 modules both plans
compile took 18.2 s in one baseline run and 19.0 to 21.4 s in four runs of this code, where two
baseline runs differ by 10 %). One cold pass each with seed 1 read 3.08× at 1.01× wall, with seed 2
2.84× at 1.10×.

Where a cold run's CPU goes, and why the last target is left open (2026-11-26 19:10 to 19:50 at
`885632d`, this machine): in one process (`--processes 1`, 7,316 examples, 52.7 CPU-s) XLA compiles
take 31.1 CPU-s (59 %), the XLA side's JAX tracing and lowering 5.0, refsim's JAX traces 2.25 (713),
XLA execution 3.3; refsim's own evaluation, drawing (2.3), comparing (0.8), the other suites' checks
(2.4) and placement, read-back and the executable store (~2.8, of it 0.85 serializing executables)
are the project's, no one of them above 5 %. Interleaved cold runs of seed 0 the same hour (parent
and workers, `RUSAGE_SELF` + `RUSAGE_CHILDREN`): the baseline 52.8 and 54.2 CPU-s (27.6 s and 28.4 s
runner wall), this commit 58.7 and 60.7 (29.7 s and 30.8 s): 1.05× to 1.08× the wall for 3.15× the
examples. Closing that gap needs ~6 CPU-s. The levers measured and not taken: one JAX trace shared by
refsim and the XLA side would save at most refsim's 2.25 CPU-s (4 %), and refsim would then evaluate
the very jaxpr XLA compiles instead of tracing the program itself (on an abstract mesh): a JAX tracing
difference between the two could no longer show; a third worker costs ~4 CPU-s more than it fills
(user CPU 62.4 and 61.5 s, wall 33.7 and 33.2 s, against 57.8 and 57.5 s, 32.2 and 32.4 s with two); a
fork server that imports JAX once cannot be used (importing jax starts threads: 1 to 3 in this
process); XLA's compile pipeline is what the suite tests and stays XLA's default.""",
    "overhead": """A ring ppermute and a psum over one float32 element per device through `refsim.shard_map`, the
result read back with `np.asarray`: what a cached call costs apart from moving data (refsim builds
`Shard` objects only when they are read, and caches each (sharding, shape)'s indices). XLA: the
compiled executable on device-resident input, output fetched.""",
    "scaling": """`ppermute` (ring over x) → `all_to_all` (tiled, over y) → `psum_scatter` (tiled, over y) →
`all_gather` (tiled, over y) → `psum` (over x) on one float32 array laid out `P('x', 'y')` over an
X×Y mesh, the result (`P(None, 'y')`) read back with `np.asarray` and checked against a direct
NumPy computation. Peak RSS is above the process's RSS just before the first call, relative to
the array's bytes. XLA:CPU runs up to 256 devices here (`bench.scaling.XLA_DEVICES`): in earlier
runs its all_to_all rendezvous never completed at 1024 devices ("Expected 32 threads to join the
rendezvous, but only 7 of them arrived") and it refused more than 2048 devices in one process
("Multiprocess computations aren't implemented on the CPU backend"); `--xla-devices` retries them.""",
    "bandwidth": """Each collective as its own `refsim.shard_map` program: NumPy in, `np.asarray` of the result out,
divided by `np.copyto` of the bytes it must move (the larger of its global input and output),
timed in interleaved passes. 1-D meshes lay the array out `P('i')`; the 64×64 mesh `P('x', 'y')`.
Results invariant over the axis (psum, all_gather) are stored once and read back as a view.
all_to_all's transposing copy splits arrays of 8 MiB or more over threads (one per CPU this process
may use, at most 8; ``REFSIM_NUM_THREADS`` sets it) while `np.copyto` uses one thread: the row
"all_to_all, 1 thread" is the same call with ``REFSIM_NUM_THREADS=1``.""",
    "stablehlo": """For every program of `conformance.cases.corpus`: refsim's jaxpr interpretation (the entry point of its
kind, trace cached) beside `refsim.stablehlo.interpret` on the module JAX lowered and on XLA's
compiled per-device module (each walked once beforehand: the `load` column), timed in equal,
interleaved passes; each time is the median of the passes (range in brackets where the run
recorded it) and the ratio is median lowered / median jaxpr (`bench.stablehlo`). The target:
interpreting the lowered module costs no more than ~3× the jaxpr interpretation. The known
exceptions are `jax.random` programs: refsim evaluates a `threefry2x32` equation with one
vectorised kernel, while the lowered module spells it out as ~700 executed scalar-sized ops;
matching a function by name to skip it would defeat the purpose (a wrong lowering of threefry
must show), so that cost stays.""",
    "oracle_large": """What `pytest --conformance-oracle` costs on large arrays (`bench.oracle_large`): float32 arrays
laid out `P('x')` over 8 virtual CPU devices, a jit `reshape` ((n, 4096, 32) → (n, 2048, 2, 32)),
`transpose` (→ (n, 32, 4096)) and `elementwise` (`x * 2 + 1`) with out_shardings `P('x')`, and
`device_put` of the NumPy value onto the mesh (a reshard the oracle checks). Each is timed in
interleaved passes: the plain call, then the same call with an oracle session installed, each until
XLA's result is ready. "oracle's own" is the checked call's record in the oracle report (`seconds`:
host copies, refsim, comparison; the wait for XLA's asynchronously dispatched result counts as
XLA's); the phases are this commit's (`CheckResult.seconds`): reading inputs and outputs off the
devices (`host_inputs`, `host_outputs`), refsim's evaluation, choosing the policies, `compare`,
and the per-output summaries. The baseline is the commit before the large-array work (its
oracle copied every device buffer, assembled global values through a stacked copy, copied
refsim's results again to place them, and compared every element in float64).""",
}


def _md_table(header: list, rows: list) -> str:
    out = ["| " + " | ".join(str(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join("-" if v is None else str(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


def _machine(m: dict) -> str:
    rows = [("commit", f"`{m.get('commit', 'unknown')}`"), ("date", m.get("date", "-")),
            ("host", m.get("host", "-")), ("CPU", f"{m.get('cpu')}, {m.get('cores')} cores"),
            ("memory", f"{m.get('memory_gib')} GiB"),
            ("load average at start (1, 5, 15 min)", ", ".join(map(str, m.get("load_average") or [])) or "-"),
            ("software", f"Python {m.get('python')}, NumPy {m.get('numpy')}, JAX {m.get('jax')}")]
    return _md_table(["", ""], rows)


def _throughput(recs: list) -> str:
    by = {r["engine"]: r for r in recs if r.get("bench") == "throughput"}
    ref, xla, ratio = by["refsim"], by["xla"], by["ratio"]
    rows = [("refsim (trace + interpret)", C.fmt_stat(ref["timing"], ref["programs"]), C.fmt_stat(ref["timing"]), "–"),
            ("XLA:CPU via xla_backend (trace + lower + compile + run + fetch)",
             C.fmt_stat(xla["timing"], xla["programs"]), C.fmt_stat(xla["timing"]),
             f"{100 * (xla.get('compile_share') or 0):.0f}%"),
            ("**refsim / XLA**", f"**{ratio['ratio_refsim_over_xla']:.1f}×** (per pass: "
             + ", ".join(f"{x:.1f}" for x in ratio.get("ratio_per_pass", [])) + ")", "", "")]
    text = _md_table(["engine", "programs/s", "pass time", "compile share"], rows)
    text += (f"\n\n{ratio['programs']} programs ({ratio['drawn']} drawn), {ratio['passes']} passes per engine; "
             f"{ratio['agree']} agree bit for bit")
    known = ratio.get("known_differences")
    if known is None and ratio.get("disagree"):  # a run from before disagreements were classified
        text += f"; disagreeing (for the conformance suite to triage): {', '.join(ratio['disagree'])}"
    text += "."
    for cid, why in (known or {}).items():
        text += f"\n\n`{cid}` differs as `xfails/cpu.txt` expects ({why})."
    if known is not None and ratio.get("unexplained"):
        text += f"\n\n**Unexplained disagreements**: {', '.join(f'`{c}`' for c in ratio['unexplained'])}."
    return text


def _conformance(recs: list) -> str:
    side = [r for r in recs if r.get("bench") == "conformance_side_by_side"]
    if not side:
        r = next(r for r in recs if r.get("bench") == "conformance_rate")
        return (f"Only this commit was measured ({r['source']}): {r['examples']} examples, "
                f"{r['examples_per_s']:.1f} examples/s, {100 * r['compile_share']:.0f}% compiling.")
    from conformance.report.timing import LABELS

    sp = next(r for r in recs if r.get("bench") == "conformance_speedup")
    rows = []
    for r in side:
        rates = ", ".join(f"{x:.1f}" for x in r["examples_per_s_each"])
        walls = ", ".join(f"{x:.0f}" for x in r["wall_s_each"])
        rows.append((r["variant"], f"`{r['commit']}`", r["processes"], r["cases"], r["examples"],
                     f"{r['examples_per_s']:.1f} ({rates})", walls))
    text = _md_table(["variant", "commit", "workers", "cases", "examples", "examples/s, median (each pass)",
                      "wall s (each pass)"], rows)
    by = {r["variant"]: r for r in side}
    per = {v: [c / b for c, b in zip(by[v]["examples_per_s_each"], by["baseline"]["examples_per_s_each"])]
           for v in ("cold", "rerun") if v in by and "baseline" in by}
    text += (f"\n\n**This commit: {sp['cold_over_baseline']:.2f}× the baseline's examples/s on a cold cache, "
             f"{sp['rerun_over_baseline']:.2f}× on a rerun** (ratios of medians; suite `{sp['suite']}`, "
             f"`--examples {sp['examples']}`, `--seed {sp['seed']}`, {side[0]['passes']} interleaved passes). "
             "Per pass (each variant against the baseline run just before it): "
             + "; ".join(f"{v} {', '.join(f'{x:.2f}×' for x in xs)}" for v, xs in per.items())
             + ". A run takes minutes, so the load can change between the variants of one pass; "
             "where the per-pass ratios differ widely, the lowest is the conservative figure.")
    for r in side:
        ph = r.get("phases") or {}
        total = sum(ph.values())
        if total > 0:
            parts = ", ".join(f"{LABELS.get(k, k)} {100 * v / total:.0f}%" for k, v in ph.items() if v > 0)
            text += f"\n\nPhases of the {r['variant']} run ({total:.0f} s of work): {parts}."
    cold, base = by.get("cold"), by.get("baseline")
    if cold and base and cold.get("phases") and base.get("processes") == 1:
        # The baseline runs in one process, so its wall time is its work; the cold run's work is its phases' sum.
        work = 1e3 * sum(cold["phases"].values()) / cold["examples"]
        base_ms = 1e3 * sorted(base["wall_s_each"])[len(base["wall_s_each"]) // 2] / base["examples"]
        text += (f"\n\nWork per example: the cold run {work:.1f} ms (summed over its {cold['processes']} workers and the "
                 f"drawing), the baseline {base_ms:.1f} ms (one process: its wall time). A first run's work is mostly "
                 f"XLA compiling, which a cache cannot skip, so its speed-up over the baseline is about the number "
                 f"of workers ({cold['processes']}) times {base_ms / work:.2f}; a rerun loads the compiled executables instead.")
    return text


def _reruns(recs: list) -> str:
    rows = [(r["variant"], f"`{r['commit']}`", r["processes"], r["cases"], r["examples"],
             "%.1f (%s)" % (r["examples_per_s"], ", ".join("%.1f" % x["examples_per_s"] for x in r["each"])),
             f"{r['cpu_ms_per_example']:.1f}", ", ".join(f"{x['cpu_s']:.0f}" for x in r["each"]),
             f"{100 * r['busy_share']:.0f}%", f"{r['examples_per_minute']:.0f}",
             ", ".join(f"{x['process_s']:.0f}" for x in r["each"]),
             "-" if "identity_checks_s" not in r else
             f"{r['identity_checks_s']:.2f} ({100 * r.get('identity_share', 0.0):.1f}%)")
            for r in recs if r.get("bench") == "conformance_reruns"]
    text = _md_table(["variant", "commit", "workers", "cases", "examples", "examples/s, median (each pass)",
                      "CPU ms per example", "CPU s (each pass)", "workers busy", "examples per minute",
                      "process wall s (each pass)", "identity checks CPU s (share of the run's CPU)"], rows)
    side = [r for r in recs if r.get("bench") == "conformance_reruns"]
    if side:
        text += f"\n\n{side[0]['passes']} interleaved passes; medians."
    by = {r["variant"]: r for r in side}
    if "rerun" in by and "baseline rerun" in by and "identity_checks_s" in by["rerun"]:
        rr, br = by["rerun"], by["baseline rerun"]
        text += (f" The compile cache's identity checks (the code identity and the verifying compiles of at most "
                 f"`VERIFY_PER_RUN` families, `conformance.engine.compile_cache`) took {rr['identity_checks_s']:.2f} "
                 f"CPU-s of this commit's rerun, {100 * rr.get('identity_share', 0.0):.1f}% of its CPU. The rerun as a "
                 f"whole costs {rr['cpu_s'] / br['cpu_s']:.2f}x the baseline rerun's CPU ({rr['cpu_s']:.1f} against "
                 f"{br['cpu_s']:.1f} s): the baseline read back its drawn plan and each case's executable under a key "
                 "computed before tracing, which a changed JAX or a monkeypatch could not change; this commit draws, "
                 "traces and lowers every case on every run and lets only JAX's module-keyed cache skip the compile.")
    from bench.reruns import suite_rows

    rows = suite_rows(recs)
    if rows:
        text += "\n\nCold runs by suite (medians of the passes; seconds: the workers' wall clock in the suite's cases):\n\n"
        text += _md_table(["suite", "variant", "programs", "examples", "seconds", "ms per program",
                           "XLA compile ms per program"], rows)
    return text


def _scaling_like(recs: list, tiny: bool) -> str:
    by = {(r["mib"], r["devices"], r["engine"]): r for r in recs}
    rows, notes = [], []

    def cell(r, f):
        if not r:
            return "not run"
        if r.get("status") == "ok":
            return f(r)
        text = f"{r['engine']} at {r['devices']} devices: {r['status']}, {r.get('reason', '')}"
        if text not in notes:
            notes.append(text)
        return f"{r['status']} [{notes.index(text) + 1}]"

    def mem(r):
        if tiny:
            return C.fmt_bytes(r["rss_above_baseline"])
        return f"{C.fmt_bytes(r['rss_above_baseline'])} ({r['rss_above_baseline'] / r['data_bytes']:.2f}×)"

    for mib, n in dict.fromkeys((r["mib"], r["devices"]) for r in recs):
        rs, xs = by.get((mib, n, "refsim"), {}), by.get((mib, n, "xla"), {})
        mesh = "×".join(map(str, rs.get("mesh", xs.get("mesh", []))))
        row = ([] if tiny else [f"{mib:g} MiB"]) + [n, mesh,
               cell(rs, lambda r: C.fmt_stat(r["timing"])), cell(rs, lambda r: C.fmt_seconds(r["first_s"])),
               cell(rs, mem), cell(xs, lambda r: C.fmt_stat(r["timing"])),
               cell(xs, lambda r: C.fmt_seconds(r["first_s"])), cell(xs, mem),
               C.fmt_ratio(xs.get("ratio_xla_over_refsim")).replace("x", "×")]
        rows.append(row)
    header = ([] if tiny else ["size"]) + ["devices", "mesh", "refsim call (median)", "refsim first call",
                                            "refsim peak RSS", "XLA call (median)", "XLA first call",
                                            "XLA peak RSS", "XLA / refsim"]
    text = _md_table(header, rows)
    for i, t in enumerate(notes, 1):
        text += f"\n\n[{i}] {t}"
    return text


def _bandwidth(recs: list) -> str:
    lays = list(dict.fromkeys(r["layout"] for r in recs))
    ops = list(dict.fromkeys(r["op"] for r in recs))
    by = {(r["op"], r["layout"]): r for r in recs}
    copy = {lay: min(r["copyto_seconds"] for r in recs if r["layout"] == lay) for lay in lays}
    rows = [["`np.copyto`", *(C.fmt_seconds(copy[lay]) for lay in lays)]]
    for op in ops:
        rows.append([op, *(f"{by[op, lay]['ratio_to_copyto']:.1f}× ({C.fmt_seconds(by[op, lay]['seconds'])})"
                           for lay in lays)])
    mib = recs[0]["mib"]
    return (f"{mib:g} MiB float32; collective time / `np.copyto` time of the bytes moved.\n\n"
            + _md_table(["collective", *(f"{lay} devices" if lay.isdigit() else lay for lay in lays)], rows))


def _stablehlo(recs: list) -> str:
    s = next((r for r in recs if r.get("program") == "summary"), None)

    def t(r, name):  # median (range); runs recorded before the interleaved passes have the time alone
        st = r.get("timing")
        return C.fmt_stat(st.get(name)) if isinstance(st, dict) else C.fmt_seconds(r.get(f"{name}_s"))

    rows = [(f"`{r['program']}`", t(r, "jaxpr"), t(r, "lowered"),
             "-" if r.get("ratio") is None else f"{r['ratio']:.2f}×", t(r, "compiled"),
             C.fmt_seconds(r.get("lowered_load_s")), r.get("status", "-"))
            for r in recs if r.get("program") != "summary"]
    text = _md_table(["program", "jaxpr", "lowered", "lowered / jaxpr", "compiled", "load (walk module)", "status"],
                     rows)
    if any("jaxpr_s" in r and "timing" not in r for r in recs):
        text = ("These figures were recorded before `bench.stablehlo` timed in interleaved passes: each time "
                "is the best of N calls, not a median.\n\n" + text)
    if s and s.get("median_ratio") is not None:
        text = (f"{s['timed']} of {s['programs']} programs timed; lowered / jaxpr median {s['median_ratio']:.2f}×, "
                f"max {s['max_ratio']:.1f}×; over 3×: {', '.join(s['over_3x']) or 'none'}.\n\n" + text)
    return text


def _oracle_large(recs: list) -> str:
    phases = ("host_inputs", "host_outputs", "refsim", "policy", "compare", "summaries")
    rows = []
    for r in recs:
        ph = r.get("phases") or {}
        rows.append((r["op"], f"{r['mib']:g} MiB", f"{r['variant']} `{r['commit']}`", C.fmt_stat(r["plain"]),
                     C.fmt_stat(r["checked"]), C.fmt_stat(r["overhead"]),
                     "-" if r.get("ratio") is None else f"{r['ratio']:.1f}×",
                     ", ".join(f"{k} {C.fmt_seconds(ph[k])}" for k in phases if ph.get(k, 0) >= 5e-4) or "-"))
    text = _md_table(["op", "size", "commit", "plain call", "checked call", "oracle's own", "checked / plain",
                      "phases (medians)"], rows)
    if recs:
        text += f"\n\n{recs[0]['plain']['passes']} interleaved passes per cell; medians (range of the passes)."
    return text


SECTIONS = (("throughput", "Throughput: many distinct small programs", ("throughput",), _throughput),
            ("conformance", "Conformance run: examples/s against the baseline commit",
             ("conformance_side_by_side", "conformance_speedup", "conformance_rate"), _conformance),
            ("reruns", "Reruns, busy workers and data per compiled program", ("conformance_reruns",
                                                                              "conformance_reruns_targets"), _reruns),
            ("overhead", "Overhead of a call: one element per device", ("overhead",),
             lambda r: _scaling_like(r, tiny=True)),
            ("scaling", "Scaling: the five-collective program", ("scaling",), lambda r: _scaling_like(r, tiny=False)),
            ("bandwidth", "Bandwidth: each collective against `np.copyto`", ("bandwidth",), _bandwidth),
            ("stablehlo", "StableHLO interpretation beside jaxpr interpretation", ("stablehlo",), _stablehlo),
            ("oracle_large", "Oracle mode on large arrays: a plain call beside the checked call", ("oracle_large",),
             _oracle_large))


def _runs(records: list[dict]) -> list[list[dict]]:
    """The records split into runs, each starting at its `machine` record."""
    runs: list = []
    for r in records:
        if r.get("bench") == "machine" or not runs:
            runs.append([])
        runs[-1].append(r)
    return runs


def render(records: list[dict]) -> str:
    """The Markdown page for the records of one or more runs (each part from the last run that has it)."""
    runs = _runs(records)
    chosen: dict = {}  # section key -> index of the run its records come from
    for key, _title, kinds, _fn in SECTIONS:
        for i, run in enumerate(runs):
            if any(r.get("bench") in kinds for r in run):
                chosen[key] = i
    used = sorted(set(chosen.values())) or [len(runs) - 1]
    machines = [next((r for r in runs[i] if r.get("bench") == "machine"), {}) for i in used]
    out = [TITLE, "", INTRO, "", RERUN, "", "## The runs these figures come from", ""]
    for n, (i, m) in enumerate(zip(used, machines), 1):
        parts = [key for key, k in chosen.items() if k == i]
        out += [f"Run {n} ({', '.join(parts) or 'no parts'}):", "", _machine(m), ""]
    out.append("The machine is shared with other engineers' jobs, so absolute times are noisy (compare the "
               "load average with the cores); both sides of every comparison ran under the same load, "
               "interleaved, and the ratios are the figures to read.")
    if any(r.get("quick") for run in (runs[i] for i in used) for r in run if r.get("bench") == "target"):
        out += ["", "**A run used `--quick`: sizes too small to judge any target.**"]
    # The targets are judged again here from the chosen parts' records (bench.__main__.targets),
    # so a page that combines runs judges each target on the run its part came from.
    from bench.__main__ import targets as judge

    results = {key: [r for r in runs[i] if r.get("bench") in kinds]
               for key, _t, kinds, _f in SECTIONS for k2, i in chosen.items() if k2 == key}
    rows = judge(results)
    if rows:
        out += ["", "## Targets", "",
                _md_table(["target", "measured", "met"],
                          [(t.strip(), m, "yes" if ok else "**no**") for t, m, ok in rows])]
    for n, (key, title, kinds, fn) in enumerate(SECTIONS, 1):
        out += ["", f"## {n}. {title}", "", NOTES[key], ""]
        if key in chosen:
            recs = [r for r in runs[chosen[key]] if r.get("bench") in kinds]
            run_no = used.index(chosen[key]) + 1
            out.append((f"(Run {run_no}.)\n\n" if len(used) > 1 else "") + fn(recs))
        else:
            out.append(f"Not measured in these runs (`python -m bench --parts {key}`).")
    return "\n".join(out).rstrip() + "\n"


def load(paths) -> list[dict]:
    """Every record of the JSON-lines files, in order (a run starts at its `machine` record)."""
    recs: list = []
    for path in [paths] if isinstance(paths, str) else paths:
        with open(path) as fh:
            recs += [json.loads(line) for line in fh if line.strip().startswith("{")]
    if not any(r.get("bench") == "machine" for r in recs):
        raise ValueError(f"{paths} has no 'machine' record: write it with `python -m bench --json FILE`.")
    return recs


KEEP_MARKER = "<!-- bench.docs keeps everything below this line: sections written by hand from other bench commands -->"


def kept_tail(path: str) -> str:
    """The part of the page at `path` from `KEEP_MARKER` on (sections written by hand from the output
    of bench commands this renderer does not know), or the marker alone where the page has none."""
    try:
        with open(path) as fh:
            old = fh.read()
    except OSError:
        return "\n" + KEEP_MARKER + "\n"
    i = old.find(KEEP_MARKER)
    return "\n" + (old[i:] if i >= 0 else KEEP_MARKER + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.docs", description=__doc__.splitlines()[0])
    ap.add_argument("figures", nargs="+", help="JSON lines written by `python -m bench --json FILE` (one or more)")
    ap.add_argument("--out", help="write the page here (default: stdout)")
    args = ap.parse_args(argv)
    try:
        text = render(load(args.figures))
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out:
        text += kept_tail(args.out)
        with open(args.out, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
