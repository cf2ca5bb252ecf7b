"""Reruns and cold runs of `python -m conformance run` against a baseline checkout (issue 29).

Four variants, each a fresh `python -m conformance run --examples N --seed 0 --shrink-seconds 0`
process with its own empty cache folder per pass, timed in interleaved passes (baseline cold,
this checkout cold, baseline rerun, this checkout rerun, and again): "cold" starts on an empty
``--compile-cache`` folder, "rerun" runs again on the folder its cold pass filled. Per pass:

* CPU seconds of the whole process tree (the run, its preflight child, its workers:
  ``RUSAGE_CHILDREN``) per example checked;
* examples/s, the runner's own figure (drawing included, interpreter start-up not), and the
  process's wall time;
* the workers' busy share: seconds the workers spent in cases (each case record's ``seconds``)
  over ``processes`` x the runner's wall time;
* data examples checked per minute of the process's wall time (an example is one data set run
  on both sides and compared).

    python -m bench.reruns --against ../base [--examples 20|default] [--passes 3] [--json FILE]

`--examples default` passes no `--examples` option: each checkout runs its own default plan (the
"default run" of issue 40), and the figure that compares plans of different sizes is the CPU
seconds per distinct program (`cases`: one drawn program structure, whatever its data sets).
    python -m bench.reruns --quick          # this checkout only, tiny: checks the code path
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile

from bench import _common as C

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("baseline cold", "cold", "baseline rerun", "rerun")


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def cli_pass(root: str, cache: str, *, examples: int | None, seed: int = 0, suite: str = "all", extra=(),
             timeout: float = 3600) -> dict:
    """One `python -m conformance run` of the checkout at `root` on compile-cache folder `cache`
    (`examples` None: the checkout's own default number of examples)."""
    env = dict(os.environ)
    env.pop("CONFORMANCE_COMPILE_CACHE", None)
    sized = [] if examples is None else ["--examples", str(examples)]
    options = [*sized, "--seed", str(seed), "--suite", suite, "--shrink-seconds", "0", "--compile-cache", cache, *extra]
    cpu0 = _children_cpu()
    p, process_s, summary, cases = C.conformance_run(root, options, env, timeout)
    cpu_s = _children_cpu() - cpu0
    busy = sum(float(rec.get("seconds") or 0.0) for rec in cases)
    procs = (summary.get("plan") or {}).get("processes") or 1
    cache_events = summary.get("compile_cache_events") or {}
    # the compile cache's identity checks (issue 38): the code identity and the verifying compiles
    identity_s = None if "compile_cache_events" not in summary else \
        float(cache_events.get("identity_seconds") or 0.0) + float(cache_events.get("verify_seconds") or 0.0)
    wall = summary["wall_seconds"]
    return dict(examples=summary["examples"], cases=summary["cases"], wall_s=wall, process_s=process_s, cpu_s=cpu_s,
                examples_per_s=summary["examples_per_second"], processes=procs,
                busy_share=busy / (procs * wall) if wall else 0.0,
                cpu_ms_per_example=1000 * cpu_s / max(1, summary["examples"]),
                cpu_s_per_program=cpu_s / max(1, summary["cases"]),
                examples_per_minute=60 * summary["examples"] / process_s, phases=summary.get("phases"),
                by_status=summary.get("by_status"), exit=p.returncode, identity_checks_s=identity_s,
                verified_families=int(cache_events.get("verified") or 0), by_suite=by_suite(cases))


def by_suite(cases: list[dict]) -> dict:
    """{suite: programs, examples, seconds, compile_s}: per suite, the case records' count, their
    data sets, the workers' seconds in them (wall clock inside the worker) and the XLA compile
    seconds among those. Where two plans differ in their suites, this says which programs the
    CPU per distinct program is spent on."""
    out: dict = {}
    for rec in cases:
        row = out.setdefault(rec.get("suite") or "?", dict(programs=0, examples=0, seconds=0.0, compile_s=0.0))
        row["programs"] += 1
        row["examples"] += int(rec.get("examples") or 0)
        row["seconds"] += float(rec.get("seconds") or 0.0)
        row["compile_s"] += float((rec.get("phases") or {}).get("xla_compile") or 0.0)
    return out


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def side_by_side(against: str | None, *, examples: int | None = 20, passes: int = 3, suite: str = "all") -> list[dict]:
    """Interleaved passes of the four variants (only this checkout's two when `against` is None)."""
    if against is not None:
        against = os.path.abspath(against)
        if not os.path.isdir(os.path.join(against, "conformance")):
            raise ValueError(f"against={against!r} is not a checkout with a conformance/ package; create one with "
                             "`git worktree add --detach DIR COMMIT`.")
    roots = {"baseline": against, "this": ROOT}
    runs: dict = {v: [] for v in VARIANTS if against is not None or not v.startswith("baseline")}
    for i in range(passes):
        caches = {k: tempfile.mkdtemp(prefix=f"bench-reruns-{k}-") for k in roots if roots[k]}
        try:
            for v in runs:   # baseline cold, cold, baseline rerun, rerun: each side's rerun on its own cold's cache
                side = "baseline" if v.startswith("baseline") else "this"
                runs[v].append(cli_pass(roots[side], caches[side], examples=examples, suite=suite))
                load = [round(x, 2) for x in os.getloadavg()]
                C.emit(dict(bench="conformance_reruns_pass", variant=v, pass_no=i + 1, load_average=load,
                            commit=C.git_commit(roots[side]),
                            **{k: x for k, x in runs[v][-1].items() if k != "phases"}))
        finally:
            for c in caches.values():
                shutil.rmtree(c, ignore_errors=True)
    commits = {v: C.git_commit(against if v.startswith("baseline") else ROOT) for v in runs}
    recs = summarize(runs, commits, examples=examples, passes=passes, suite=suite)
    for r in recs:
        C.emit(r)
    return recs


def summarize(runs: dict, commits: dict, *, examples: int, passes: int, suite: str) -> list[dict]:
    """One record per variant (medians over its passes) and, with a baseline, one of the targets."""
    recs = []
    for v, rs in runs.items():
        med = {k: _median([r[k] for r in rs]) for k in ("examples_per_s", "cpu_ms_per_example", "busy_share",
                                                          "examples_per_minute", "process_s", "wall_s", "cpu_s",
                                                          "cpu_s_per_program") if all(k in r for r in rs)}
        if all(r.get("identity_checks_s") is not None for r in rs):   # a commit without them records none
            med["identity_checks_s"] = _median([r["identity_checks_s"] for r in rs])
            med["identity_share"] = _median([r["identity_checks_s"] / r["cpu_s"] if r["cpu_s"] else 0.0 for r in rs])
        suites = {name: {k: _median([(r.get("by_suite") or {}).get(name, {}).get(k, 0) for r in rs])
                         for k in ("programs", "examples", "seconds", "compile_s")}
                  for name in sorted({n for r in rs for n in (r.get("by_suite") or {})})}
        recs.append(dict(bench="conformance_reruns", variant=v, commit=commits[v], suite=suite, examples_option=examples,
                         passes=passes, examples=rs[0]["examples"], cases=rs[0]["cases"],
                         processes=rs[0]["processes"], by_suite=suites,
                         each=[{k: r[k] for k in r if k not in ("phases", "by_suite")} for r in rs],
                         phases=sorted(rs, key=lambda r: r["examples_per_s"])[len(rs) // 2].get("phases"), **med))
    if "baseline cold" in runs and "rerun" in runs:
        by = {r["variant"]: r for r in recs}
        per_pass = lambda k, a, b: [x[k] / y[k] for x, y in zip(by[a]["each"], by[b]["each"])]  # noqa: E731
        recs.append(dict(
            bench="conformance_reruns_targets", examples_option=examples, passes=passes,
            rerun_cpu_ms_per_example=by["rerun"]["cpu_ms_per_example"],
            baseline_rerun_cpu_ms_per_example=by["baseline rerun"]["cpu_ms_per_example"],
            rerun_speedup=by["rerun"]["examples_per_s"] / by["baseline rerun"]["examples_per_s"],
            rerun_speedup_each=per_pass("examples_per_s", "rerun", "baseline rerun"),
            cold_busy_share=by["cold"]["busy_share"], baseline_cold_busy_share=by["baseline cold"]["busy_share"],
            cold_data_per_minute_ratio=by["cold"]["examples_per_minute"] / by["baseline cold"]["examples_per_minute"],
            cold_data_per_minute_ratio_each=per_pass("examples_per_minute", "cold", "baseline cold"),
            cold_wall_ratio=by["cold"]["process_s"] / by["baseline cold"]["process_s"],
            **({} if "cpu_s_per_program" not in by["cold"] else dict(
                cold_cpu_s_per_program=by["cold"]["cpu_s_per_program"],
                baseline_cold_cpu_s_per_program=by["baseline cold"]["cpu_s_per_program"],
                cold_cpu_per_program_ratio_each=per_pass("cpu_s_per_program", "cold", "baseline cold")))))
    return recs


def from_passes(path: str, commits: dict | None = None) -> list[dict]:
    """The records of `summarize` from the per-pass records of the last run in the JSON-lines file
    `path` (a side by side stopped early: only passes in which every variant ran count)."""
    with open(path) as fh:
        recs = [json.loads(line) for line in fh if line.strip().startswith("{")]
    last = max(i for i, r in enumerate(recs) if r.get("bench") == "machine")
    passes = [r for r in recs[last:] if r.get("bench") == "conformance_reruns_pass"]
    variants = [v for v in VARIANTS if any(p["variant"] == v for p in passes)]
    complete = [n for n in sorted({p["pass_no"] for p in passes})
                if all(any(p["pass_no"] == n and p["variant"] == v for p in passes) for v in variants)]
    runs = {v: [p for n in complete for p in passes if p["pass_no"] == n and p["variant"] == v] for v in variants}
    commits = {v: (commits or {}).get("baseline" if v.startswith("baseline") else "this")
               or runs[v][0].get("commit", "?") for v in variants}
    return summarize(runs, commits, examples=0, passes=len(complete), suite="all")


def run(quick: bool = False) -> list[dict]:
    """`python -m bench --parts reruns` without a baseline: this checkout's cold run and rerun."""
    return side_by_side(None, examples=1 if quick else 20, passes=1, suite="collectives" if quick else "all")


def targets(recs: list[dict]) -> list[tuple]:
    """(target, measured, met) from a side by side's records: the rerun's CPU per example, and issue
    38's bound on the compile cache's identity checks. (Issue 29's targets were ratios against the
    commit before its work; its figures are in git history, docs/performance.md at fc7a688.)"""
    t = next((r for r in recs if r.get("bench") == "conformance_reruns_targets"), None)
    rerun = next((r for r in recs if r.get("bench") == "conformance_reruns" and r.get("variant") == "rerun"), None)
    if t is None or rerun is None:
        return []
    rows = []
    if t.get("cold_cpu_s_per_program") is not None:
        rows.append(("cold run CPU per distinct program <= the baseline's (issue 40)",
                     f"{1000 * t['cold_cpu_s_per_program']:.0f} ms (baseline "
                     f"{1000 * t['baseline_cold_cpu_s_per_program']:.0f} ms; each pass "
                     + ", ".join(f"{x:.2f}x" for x in t["cold_cpu_per_program_ratio_each"]) + ")",
                     t["cold_cpu_s_per_program"] <= t["baseline_cold_cpu_s_per_program"]))
    rows += [("rerun CPU per example <= 7 ms (whole process tree)",
             f"{t['rerun_cpu_ms_per_example']:.1f} ms (baseline {t['baseline_rerun_cpu_ms_per_example']:.1f} ms)",
             t["rerun_cpu_ms_per_example"] <= 7)]
    if "identity_share" in rerun:
        rows.append(("the compile cache's identity checks <= 10% of a rerun's CPU (issue 38)",
                     f"{100 * rerun['identity_share']:.1f}% ({rerun['identity_checks_s']:.2f} CPU-s)",
                     rerun["identity_share"] <= 0.10))
    return rows


def suite_rows(recs: list[dict]) -> list[tuple]:
    """(suite, variant, programs, examples, seconds, ms per program, compile ms per program) of the
    cold variants, suite by suite: which suites a difference in CPU per program comes from."""
    cold = [r for r in recs if r.get("bench") == "conformance_reruns" and r["variant"] in ("baseline cold", "cold")
            and r.get("by_suite")]
    rows = []
    for name in sorted({n for r in cold for n in r["by_suite"]}):
        for r in cold:
            row = r["by_suite"].get(name)
            if row is None or not row["programs"]:
                rows.append((name, r["variant"], 0, 0, "-", "-", "-"))
                continue
            n = row["programs"]
            rows.append((name, r["variant"], int(n), int(row["examples"]), f"{row['seconds']:.1f}",
                         f"{1000 * row['seconds'] / n:.0f}", f"{1000 * row['compile_s'] / n:.0f}"))
    return rows


def show(recs: list[dict]) -> None:
    rows = [(r["variant"], r["commit"], r["processes"], r["examples"], f"{r['examples_per_s']:.1f}",
             f"{r['cpu_ms_per_example']:.1f}", r["cases"], f"{1000 * r.get('cpu_s_per_program', 0):.0f}",
             ", ".join(f"{x['cpu_s']:.1f}" for x in r["each"]),
             f"{100 * r['busy_share']:.0f}%", f"{r['examples_per_minute']:.0f}",
             ", ".join(f"{x['process_s']:.0f}" for x in r["each"]),
             "-" if "identity_checks_s" not in r else f"{r['identity_checks_s']:.2f} ({100 * r['identity_share']:.1f}%)")
            for r in recs if r.get("bench") == "conformance_reruns"]
    C.table("conformance reruns (medians of interleaved passes)",
            ["variant", "commit", "workers", "examples", "examples/s", "CPU ms/example", "programs",
             "CPU ms/program", "CPU s (each pass)",
             "workers busy", "examples/min", "process s (each pass)", "identity checks s (share of CPU)"], rows)
    rows = suite_rows(recs)
    if rows:
        C.table("cold runs by suite (medians of the passes; seconds: the workers' wall clock in the suite's cases)",
                ["suite", "variant", "programs", "examples", "seconds", "ms per program", "XLA compile ms per program"],
                rows)
    rows = targets(recs)
    if rows:
        C.table("targets", ["target", "measured", "met"], [(a, b, "yes" if c else "NO") for a, b, c in rows])


def _examples_option(text: str):
    """`--examples`: a positive integer, or 'default' (None: no --examples option passed on)."""
    from conformance import validation

    return None if text == "default" else validation.option("--examples", integer=True, low=1)(text)


def main(argv=None) -> int:
    from conformance import validation

    ap = argparse.ArgumentParser(prog="python -m bench.reruns", description=__doc__.splitlines()[0])
    ap.add_argument("--against", metavar="DIR", help="the baseline checkout (git worktree add --detach DIR main)")
    ap.add_argument("--examples", default="20", type=_examples_option,
                    help="examples per family, or 'default': each checkout's own default plan")
    ap.add_argument("--passes", type=validation.option("--passes", integer=True, low=1), default=3)
    ap.add_argument("--suite", default="all")
    ap.add_argument("--quick", action="store_true", help="this checkout only, collectives, 1 draw per family")
    ap.add_argument("--json", metavar="FILE", help="also append every JSON line to FILE")
    ap.add_argument("--from-passes", metavar="FILE", help="summarise the per-pass records of FILE's last run "
                                                          "(a side by side stopped early) and append to --json")
    ap.add_argument("--baseline-commit", help="--from-passes: the baseline's commit, where the records lack it")
    ap.add_argument("--commit", help="--from-passes: this checkout's commit, where the records lack it")
    args = ap.parse_args(argv)
    if args.from_passes:
        recs = from_passes(args.from_passes, {"baseline": args.baseline_commit, "this": args.commit})
        C.open_json(args.json)
        try:
            for r in recs:
                C.emit(r)
            show(recs)
        finally:
            C.close_json()
        return 0
    C.open_json(args.json)
    try:
        C.emit(C.machine())
        if args.quick:
            recs = run(quick=True)
        else:
            recs = side_by_side(args.against, examples=args.examples, passes=args.passes, suite=args.suite)
        show(recs)
    finally:
        C.close_json()
    return 0


if __name__ == "__main__":
    sys.exit(main())
