"""Conformance rate: examples per second of the default conformance run, and its compile share.

With the conformance runner present (`conformance.runner`), this is its default run
(`run(suite="all", examples=DEFAULT_EXAMPLES)`, no progress bar, no shrinking so a failure
costs no extra time), in this process on 8 virtual CPU devices; `--quick` runs the
collectives suite with one draw per family. Its summary gives examples/s and the seconds
xla_backend spent compiling; cases whose examples differ only in data reuse one compiled
executable through xla_backend's cache, and the figure reports compiles and cache hits.

Without the runner (or with ``--source loop``) it times a loop over strategy-drawn
collective cases (`collective_calls` over `meshes(max_devices=8)`, fixed seed), each run on
refsim and XLA:CPU and compared with `conformance.compare`, and says so in the record.

    python -m bench.conformance_rate [--quick] [--source auto|runner|loop] [--examples N]
"""
from __future__ import annotations

import argparse
import importlib.util
import time

from bench import _common as C

SEED = 20240611
QUICK = dict(examples=8)


def runner_available() -> bool:
    """Whether the conformance runner (`conformance.runner`) is installed in this checkout."""
    try:
        return importlib.util.find_spec("conformance.runner") is not None
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
        raise ModuleNotFoundError("source='runner' but conformance.runner is not installed in this checkout; "
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
    from conformance import runner

    suite = "collectives" if quick else "all"
    draws = examples or (1 if quick else runner.DEFAULT_EXAMPLES)
    before = xla_backend.stats()
    res = runner.run(suite=suite, examples=draws, seed=0, devices=8, progress=False, shrink_seconds=0)
    after = xla_backend.stats()
    sm = res.summary
    wall = sm["wall_seconds"]
    rec = dict(bench="conformance_rate", source=f"conformance.runner.run(suite={suite!r}, examples={draws})",
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
    from conformance import compare

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
    why = note or ("conformance.runner not available" if not runner_available() else "source='loop'")
    rec = dict(bench="conformance_rate", source=f"collective_calls loop ({why})",
               runner_available=runner_available(), examples=len(calls),
               distinct_cases=len({c.case_id for c in calls}), seconds=wall, examples_per_s=len(calls) / wall,
               xla_compiles=st["compiles"], xla_cache_hits=st["cache_hits"],
               compile_seconds=st["compile_seconds"], compile_share=st["compile_seconds"] / wall,
               xla_run_share=st["run_seconds"] / wall, refsim_share=refsim_s / wall, **status)
    C.emit(rec)
    return [rec]


def show(records: list[dict]) -> None:
    r = records[0]
    C.table(f"conformance examples/s ({r['source']})",
            ["examples", "distinct cases", "examples/s", "XLA compiles / cache hits", "compile share",
             "refsim share", "pass / fail / error / unsupported"],
            [(r["examples"], r["distinct_cases"], f"{r['examples_per_s']:.1f}",
              f"{r['xla_compiles']} / {r['xla_cache_hits']}", f"{100 * r['compile_share']:.0f}%",
              "-" if r["refsim_share"] is None else f"{100 * r['refsim_share']:.0f}%", f"{r['pass']} / {r['fail']} / {r['error']} / {r['unsupported']}")])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="runner: collectives suite, 1 draw per family; loop: 8")
    ap.add_argument("--examples", type=int, help="runner: draws per family; loop: examples")
    ap.add_argument("--source", choices=("auto", "runner", "loop"), default="auto")
    args = ap.parse_args(argv)
    recs = run(args.quick, args.examples, args.source)
    show(recs)
    return recs


if __name__ == "__main__":
    main()
