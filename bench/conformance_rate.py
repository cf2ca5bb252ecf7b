"""Conformance rate: examples per second of the default conformance run, and its compile share.

With the conformance runner present (`conformance.engine.runner`), this is its default run
(`run(suite="all", examples=DEFAULT_EXAMPLES)`, no progress bar, no shrinking so a failure
costs no extra time), in this process on 8 virtual CPU devices; `--quick` runs the
collectives suite with one draw per family. Its summary gives examples/s and the seconds
xla_backend spent compiling; cases whose examples differ only in data reuse one compiled
executable through xla_backend's cache, and the figure reports compiles and cache hits.

Without the runner (or with ``--source loop``) it times a loop over strategy-drawn
collective cases (`collective_calls` over `meshes(max_devices=8)`, fixed seed), each run on
refsim and XLA:CPU and compared with `conformance.verdict.compare`, and says so in the record.

Side by side (`side_by_side`, ``--against DIR``): the default ``python -m conformance run``
(same seed and examples, no shrinking, its own default worker count) of this checkout and of
another one (e.g. ``git worktree add ../base <commit>``), each in a fresh process with its
own PYTHONPATH, in interleaved passes: baseline, this checkout with an empty compilation
cache ("cold"), this checkout again on the cache the cold pass wrote ("rerun"). Figures are
the runner's own examples/s (medians over passes, with spread) and the share of each phase.

    python -m bench.conformance_rate [--quick] [--source auto|runner|loop] [--examples N]
    python -m bench.conformance_rate --against ../base [--examples 20] [--passes 2]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time

from bench import _common as C

SEED = 20240611
QUICK = dict(examples=8)


def runner_available() -> bool:
    """Whether the conformance runner (`conformance.engine.runner`) is installed in this checkout."""
    try:
        return importlib.util.find_spec("conformance.engine.runner") is not None
    except ModuleNotFoundError:
        return False


def draw_examples(count: int, seed: int = SEED) -> list:
    """`count` collective-call examples drawn with `seed` (repeated case ids differ in data)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from conformance.strategies import collective_calls, meshes

    drawn: list = []

    @hseed(seed)
    @settings(max_examples=count, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(collective_calls(meshes(max_devices=8)))
    def collect(call):
        drawn.append(call)

    collect()
    return drawn[:count]


def run(quick: bool = False, examples: int | None = None, source: str = "auto") -> list[dict]:
    """Measure the runner's default run (source "runner"), the fallback loop ("loop"), or the
    runner where it exists and the loop otherwise ("auto"); one record."""
    if source not in ("auto", "runner", "loop"):
        raise ValueError(f"source={source!r}; choose 'auto', 'runner' or 'loop'.")
    if source == "runner" and not runner_available():
        raise ModuleNotFoundError("source='runner' but conformance.engine.runner is not installed in this checkout; "
                                  "use source='loop' or 'auto'.")
    note = None
    if source != "loop" and runner_available():
        try:
            return _run_runner(quick, examples)
        except Exception as e:  # the runner is young: report why, then measure the loop instead
            if source == "runner":
                raise
            note = f"runner failed ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    return _run_loop(quick, examples, note)


def _run_runner(quick: bool, examples: int | None) -> list[dict]:
    from xla_backend import platform

    platform.configure("cpu", 8)
    import xla_backend
    from conformance.engine import runner

    suite = "collectives" if quick else "all"
    draws = examples or (1 if quick else runner.DEFAULT_EXAMPLES)
    before = xla_backend.stats()
    res = runner.run(suite=suite, examples=draws, seed=0, devices=8, progress=False, shrink_seconds=0)
    after = xla_backend.stats()
    sm = res.summary
    wall = sm["wall_seconds"]
    rec = dict(bench="conformance_rate", source=f"conformance.engine.runner.run(suite={suite!r}, examples={draws})",
               runner_available=True, examples=sm["examples"], distinct_cases=sm["cases"], seconds=wall,
               examples_per_s=sm["examples_per_second"],
               xla_compiles=after["compiles"] - before["compiles"],
               xla_cache_hits=after["cache_hits"] - before["cache_hits"],
               compile_seconds=sm["compile_seconds"], compile_share=sm["compile_share"],
               xla_run_share=(after["run_seconds"] - before["run_seconds"]) / wall if wall else 0.0,
               refsim_share=None, **{k: sm["by_status"].get(k, 0) for k in ("pass", "fail", "error", "unsupported")},
               xfail=sm["by_status"].get("xfail", 0))
    C.emit(rec)
    return [rec]


def _run_loop(quick: bool, examples: int | None, note: str | None) -> list[dict]:
    from xla_backend import platform

    platform.configure("cpu", 8)
    import refsim
    import xla_backend
    from conformance.verdict import compare

    count = examples or (QUICK["examples"] if quick else 200)
    calls = draw_examples(count)
    for warm in draw_examples(3, seed=SEED + 1):  # one-time JAX start-up is not per example
        warm.run(refsim), warm.run(xla_backend)
    xla_backend.clear_cache()
    xla_backend.reset_stats()
    status = {"pass": 0, "fail": 0, "error": 0, "unsupported": 0}
    refsim_s = 0.0
    t0 = time.perf_counter()
    for call in calls:
        try:
            t = time.perf_counter()
            want = call.run(refsim)
            refsim_s += time.perf_counter() - t
            got = call.run(xla_backend)
            ok = compare.compare(want, got, tolerances=call.tolerances(), case=call).ok
            status["pass" if ok else "fail"] += 1
        except NotImplementedError:  # the platform has no lowering (XLA:CPU and pbroadcast)
            status["unsupported"] += 1
        except Exception:  # a case either side rejects counts as an error
            status["error"] += 1
    wall = time.perf_counter() - t0
    st = xla_backend.stats()
    why = note or ("conformance.engine.runner not available" if not runner_available() else "source='loop'")
    rec = dict(bench="conformance_rate", source=f"collective_calls loop ({why})",
               runner_available=runner_available(), examples=len(calls),
               distinct_cases=len({c.case_id for c in calls}), seconds=wall, examples_per_s=len(calls) / wall,
               xla_compiles=st["compiles"], xla_cache_hits=st["cache_hits"],
               compile_seconds=st["compile_seconds"], compile_share=st["compile_seconds"] / wall,
               xla_run_share=st["run_seconds"] / wall, refsim_share=refsim_s / wall, **status)
    C.emit(rec)
    return [rec]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli_pass(root: str, *, examples: int, seed: int = 0, suite: str = "all", cache: str | None = None,
             timeout: float = 1800) -> dict:
    """One default `python -m conformance run` of the checkout at `root` in a fresh process:
    the summary its JSONL report ends with, and the process's own wall time."""
    env = dict(os.environ, CONFORMANCE_COMPILE_CACHE=cache or "off")
    options = ["--examples", str(examples), "--seed", str(seed), "--suite", suite, "--shrink-seconds", "0"]
    p, process_s, summary, _cases = C.conformance_run(root, options, env, timeout)
    return dict(examples=summary["examples"], cases=summary["cases"], wall_s=summary["wall_seconds"],
                examples_per_s=summary["examples_per_second"], process_s=process_s,
                compile_s=summary.get("compile_seconds"), phases=summary.get("phases"),
                by_status=summary["by_status"], processes=(summary.get("plan") or {}).get("processes"))


def side_by_side(against: str, *, examples: int = 20, seed: int = 0, passes: int = 2, suite: str = "all") -> list:
    """Interleaved passes of the baseline checkout `against`, this checkout cold and this checkout
    rerun on its own compilation cache; one record per variant plus one with the speed-ups."""
    against = os.path.abspath(against)
    if not os.path.isdir(os.path.join(against, "conformance")):
        raise ValueError(f"against={against!r} is not a checkout with a conformance/ package; create one with "
                         "`git worktree add DIR COMMIT`.")
    runs: dict = {"baseline": [], "cold": [], "rerun": []}
    for _ in range(passes):
        cache = tempfile.mkdtemp(prefix="bench-xla-cache-")
        try:
            runs["baseline"].append(cli_pass(against, examples=examples, seed=seed, suite=suite))
            runs["cold"].append(cli_pass(ROOT, examples=examples, seed=seed, suite=suite, cache=cache))
            runs["rerun"].append(cli_pass(ROOT, examples=examples, seed=seed, suite=suite, cache=cache))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    commits = {"baseline": C.git_commit(against), "cold": C.git_commit(ROOT), "rerun": C.git_commit(ROOT)}
    recs = []
    med = {}
    for name, rs in runs.items():
        rates = [r["examples_per_s"] for r in rs]
        st = C.stats([1 / x for x in rates])  # seconds per example: median and spread
        med[name] = 1 / st["median"]
        mid = sorted(rs, key=lambda r: r["examples_per_s"])[len(rs) // 2]
        recs.append(dict(bench="conformance_side_by_side", variant=name, commit=commits[name], suite=suite,
                         seed=seed, examples=mid["examples"], cases=mid["cases"], passes=passes,
                         examples_per_s=med[name], examples_per_s_each=rates, spread=st["spread"],
                         wall_s_each=[r["wall_s"] for r in rs], process_s_each=[r["process_s"] for r in rs],
                         processes=mid["processes"], phases=mid["phases"], by_status=mid["by_status"]))
    recs.append(dict(bench="conformance_speedup", examples=examples, seed=seed, suite=suite,
                     cold_over_baseline=med["cold"] / med["baseline"],
                     rerun_over_baseline=med["rerun"] / med["baseline"]))
    for r in recs:
        C.emit(r)
    return recs


def show_side_by_side(records: list[dict]) -> None:
    from conformance.report.timing import LABELS

    rows = []
    for r in records:
        if r.get("bench") != "conformance_side_by_side":
            continue
        ph = r.get("phases") or {}
        total = sum(ph.values()) or 1.0
        shares = " · ".join(f"{LABELS.get(k, k)} {100 * v / total:.0f}%" for k, v in ph.items() if v > 0)
        rows.append((r["variant"], r["commit"], r["processes"], r["examples"],
                     f"{r['examples_per_s']:.1f} ±{50 * r['spread']:.0f}%",
                     ", ".join(f"{x:.1f}" for x in r["examples_per_s_each"]), shares or "(not recorded)"))
    sp = next(r for r in records if r.get("bench") == "conformance_speedup")
    C.table(f"conformance run side by side (suite {sp['suite']}, examples {sp['examples']}, seed {sp['seed']}): "
            f"cold {sp['cold_over_baseline']:.2f}x, rerun {sp['rerun_over_baseline']:.2f}x the baseline",
            ["variant", "commit", "workers", "examples", "examples/s (median)", "each pass", "phases"], rows)


def show(records: list[dict]) -> None:
    if any(r.get("bench") == "conformance_speedup" for r in records):
        return show_side_by_side(records)
    r = records[0]
    C.table(f"conformance examples/s ({r['source']})",
            ["examples", "distinct cases", "examples/s", "XLA compiles / cache hits", "compile share",
             "refsim share", "pass / fail / error / unsupported"],
            [(r["examples"], r["distinct_cases"], f"{r['examples_per_s']:.1f}",
              f"{r['xla_compiles']} / {r['xla_cache_hits']}", f"{100 * r['compile_share']:.0f}%",
              "-" if r["refsim_share"] is None else f"{100 * r['refsim_share']:.0f}%", f"{r['pass']} / {r['fail']} / {r['error']} / {r['unsupported']}")])


def main(argv=None):
    from conformance import validation

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="runner: collectives suite, 1 draw per family; loop: 8")
    ap.add_argument("--examples", type=validation.option("--examples", integer=True, low=1),
                    help="runner: draws per family; loop: examples")
    ap.add_argument("--source", choices=("auto", "runner", "loop"), default="auto")
    ap.add_argument("--against", metavar="DIR", help="side by side with the checkout in DIR (a git worktree)")
    ap.add_argument("--passes", type=validation.option("--passes", integer=True, low=1),
                    default=2, help="side by side: interleaved passes (default 2)")
    ap.add_argument("--suite", default="all", help="side by side: suite (default all)")
    args = ap.parse_args(argv)
    if args.against:
        recs = side_by_side(args.against, examples=args.examples or 20, passes=args.passes, suite=args.suite)
    else:
        recs = run(args.quick, args.examples, args.source)
    show(recs)
    return recs


if __name__ == "__main__":
    main()
