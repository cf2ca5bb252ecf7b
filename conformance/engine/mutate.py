"""`python -m conformance mutate`: the conformance suite's power against injected miscompiles.

For each fault of `conformance.faults` the suite runs with the fault active; the fault is
*killed* when some case that agrees without it (pass, or the xfail its entry expects) fails,
errors or times out with it. The table lists, per fault, killed or survived, the examples run
until the kill, and the killing case; the score is killed / total. Two engines:

- "runner" (the default): what `python -m conformance run` does. The cases of the default plan
  (`conformance.engine.runner.plan_tasks`, `--examples` draws per family, the same seed) run in
  crash-isolated worker processes that inject the fault (`conformance.engine.workers`), with the
  platform's xfails file, no shrinking and a per-case timeout; a fault that aborts the process
  (a fatal XLA CHECK) is one "error" case, not the end of the mutation run. Cases of the families
  that exercise the fault's primitives run first and the run stops at the first kill; a fault
  survives only after every case of the plan agreed.
- "direct": the public strategies (`collective_calls` per collective, `programs` per family)
  and the corpus, searched in this process with `hypothesis.find` for a disagreeing case,
  then shrunk.

Every kill is confirmed by re-running the killing case without the fault: a case that also
disagrees there is a baseline disagreement, not a kill.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import random
import sys
import time
from typing import Any, Callable

import numpy as np
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample, Unsatisfiable

from conformance import faults as faults_mod
from conformance import strategies
from conformance.engine import runner, workers
from conformance.verdict import compare
from conformance.verdict import xfails as xfails_mod
import refsim
import xla_backend
from xla_backend import platform as platform_mod

DEFAULT_EXAMPLES = 100          # per source (direct engine); the runner engine uses the run's default
SHRINK_CALLS = 60               # runs spent shrinking a killing case, at most (direct engine)
CASE_TIMEOUT = 120.0            # seconds per case under a fault (runner engine): a hang is a kill

# Which JAX primitives each strategy source exercises (fault.primitives use these names).
_COLLECTIVE_TOUCHES = {
    "psum": {"psum", "psum_invariant"}, "pmean": {"psum", "psum_invariant"},
    "pmax": {"pmax"}, "pmin": {"pmin"}, "all_gather": {"all_gather"},
    "psum_scatter": {"reduce_scatter"}, "all_to_all": {"all_to_all"}, "pswapaxes": {"all_to_all"},
    "ppermute": {"ppermute"}, "pshuffle": {"ppermute"}, "axis_index": {"axis_index"},
    "pbroadcast": {"pbroadcast"},
}
_FAMILY_TOUCHES = {
    "elementwise_psum": {"psum", "psum_invariant"}, "structural_all_to_all": {"all_to_all"},
    "scan_ppermute": {"ppermute"}, "while_pmax": {"pmax"}, "cond_axis_index": {"axis_index", "ppermute"},
    "switch_reductions": {"psum", "psum_invariant", "pmax", "pmin"}, "grad_psum": {"psum", "psum_invariant"},
    "grad_scan_ppermute": {"ppermute"}, "vmap_all_gather": {"all_gather"},
    "vmap_psum_scatter": {"reduce_scatter"},
    "reduce_scatter_all_gather": {"reduce_scatter", "all_gather", "psum", "psum_invariant"},
    "axis_index_ppermute": {"axis_index", "ppermute"}, "nested_shard_map": {"psum", "psum_invariant"},
    "reshard_device_order": {"reshard"}, "pmap_grouped": {"psum", "pmax"},
    "jit_shardings": {"reduce_sum"}, "jit_constraint": {"sharding_constraint"},
    "pargmax_pargmin": {"pmax", "pmin", "axis_index"},
}
# Faults outside the lowering tables say what they touch here.
_FAULT_TOUCHES = {"reshard_permutation_ignored": {"reshard"}, "output_shards_swapped": {"shard_map"}}


@dataclasses.dataclass
class Outcome:
    """One fault's row: status "killed" | "survived" | "n/a" (the platform cannot run the op)."""

    fault: str
    status: str
    examples: int | None = None
    source: str = ""
    case: str = ""
    detail: str = ""
    seconds: float = 0.0
    repro_path: str | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Source:
    """A stream of cases: a hypothesis strategy of `conformance.cases.Program`, or fixed cases."""

    name: str
    touches: frozenset | None                   # primitives exercised; None when unknown
    strategy: Any = None
    fixed: tuple = ()                           # (case_id, run_refsim, run_xla, tolerance) tuples


# -- deciding one case ------------------------------------------------------------------------
def _unsupported(err: BaseException) -> bool:
    """Errors that mean the platform cannot run the op at all (never a kill)."""
    text = f"{type(err).__name__}: {err}"
    return isinstance(err, NotImplementedError) or "UNIMPLEMENTED" in text or "not supported" in text


def verdict(run_refsim: Callable, run_xla: Callable, tolerances=None, case=None) -> tuple[str, str]:
    """("agree" | "mismatch" | "crash" | "invalid" | "unsupported", detail) for one case."""
    try:
        expected = run_refsim()
    except Exception as e:                       # refsim rejects it: not a valid case
        return "invalid", f"refsim: {type(e).__name__}: {e}"
    try:
        actual = run_xla()
    except Exception as e:
        if _unsupported(e):
            return "unsupported", f"{type(e).__name__}: {e}"
        return "crash", f"XLA raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    try:
        res = compare.compare(expected, actual, tolerances=tolerances, case=case)
        return ("agree", "") if res.ok else ("mismatch", res.report(max_mismatches=2))
    except Exception as e:                       # the comparator itself broke on this pair
        return "mismatch", f"the comparison raised {type(e).__name__}: {e}"


def fault_verdict(fault: str, run_refsim: Callable, run_xla: Callable, tolerances=None, case=None
                  ) -> tuple[str, str]:
    """`verdict` with `fault` active; a disagreement counts ("mismatch" / "crash") only if the
    case agrees without the fault, otherwise it is "baseline" (recorded in BASELINE)."""
    try:
        expected = run_refsim()                   # refsim never lowers, so once serves both runs
    except Exception as e:
        return "invalid", f"refsim: {type(e).__name__}: {e}"
    with faults_mod.inject(fault, warn=False):   # one fault over many cases: most leave it idle
        kind, detail = verdict(lambda: expected, run_xla, tolerances, case)
    if kind in ("mismatch", "crash"):
        base, base_detail = verdict(lambda: expected, run_xla, tolerances, case)
        if base != "agree":
            BASELINE.setdefault(getattr(case, "case_id", "?"), base_detail.splitlines()[0] if base_detail else base)
            return "baseline", base_detail
    return kind, detail


# case id -> first line of the disagreement, for cases that disagree with no fault at all
BASELINE: dict = {}


def _case_verdict(fault: str, case) -> tuple[str, str]:
    try:
        tolerances = case.tolerances()
    except Exception as e:                       # the case cannot be judged, so it cannot kill
        return "invalid", f"tolerances: {type(e).__name__}: {e}"
    return fault_verdict(fault, lambda: case.run(refsim), lambda: case.run(xla_backend), tolerances, case)


# -- sources ------------------------------------------------------------------------------------
def default_sources(devices: int = 8) -> list[Source]:
    """Every collective of `collective_calls`, every family of `programs`, and the corpus."""
    # the module, not the `programs` strategy the package re-exports under the same name
    programs_mod = importlib.import_module("conformance.strategies.programs")

    mesh_s = strategies.meshes(max_devices=devices)
    out = [Source(f"collective_calls[{name}]", frozenset(_COLLECTIVE_TOUCHES.get(name, ())) or None,
                  strategies.collective_calls(mesh_s, collectives=(name,)))
           for name in strategies.COLLECTIVES]
    for fam, (_, min_axes) in programs_mod.FAMILIES.items():
        # a family that needs >= 2 axes (nested) or a 1-D mesh (pmap) gets meshes it can use
        fam_meshes = (strategies.meshes(max_devices=devices, max_axes=1) if fam.startswith("pmap")
                      else strategies.meshes(max_devices=devices, min_axes=min_axes))
        out.append(Source(f"programs[{fam}]", frozenset(_FAMILY_TOUCHES[fam]) if fam in _FAMILY_TOUCHES else None,
                          programs_mod.programs(fam_meshes, families=(fam,))))
    out.append(Source("corpus", None, fixed=tuple(_corpus_cases(devices))))
    return out


def _corpus_cases(devices: int) -> list:
    from conformance.cases.corpus import PROGRAMS, _entry  # the corpus loads JAX: after the platform is configured

    cases = []
    for prog in PROGRAMS:
        if not prog.xla_runs or prog.tol or prog.ulp or math.prod(prog.mesh_shape) > devices:
            continue
        mesh = prog.refsim_mesh()

        def run_ref(prog=prog):
            return prog.run_refsim(0)

        def run_xla(prog=prog, mesh=mesh):
            return _entry(prog, xla_backend, mesh)(*prog.inputs(0))
        cases.append((f"corpus[{prog.name}]", run_ref, run_xla, None))
    return cases


def _ordered(sources: list[Source], touches: set) -> list[Source]:
    hit = [s for s in sources if s.touches is not None and s.touches & touches]
    unknown = [s for s in sources if s.touches is None]
    rest = [s for s in sources if s.touches is not None and not s.touches & touches]
    return hit + unknown + rest


# -- the direct engine ----------------------------------------------------------------------------
def _hunt_strategy(source: Source, fault: str, examples: int, seed: int, shrink_calls: int = SHRINK_CALLS):
    """(killing case or None, examples until the first kill, verdict detail)."""
    state = {"calls": 0, "first": None}
    seen: dict = {}                                # case key -> (disagrees, detail)

    def disagrees(case) -> bool:
        key = _case_key(case)
        if key in seen:                            # hypothesis replays the final example
            return seen[key][0]
        if state["first"] is not None and state["calls"] - state["first"] >= shrink_calls:
            return False                           # shrink budget spent: keep the smallest so far
        state["calls"] += 1
        kind, detail = _case_verdict(fault, case)
        bad = kind in ("mismatch", "crash")
        if bad and state["first"] is None:
            state["first"] = state["calls"]
        seen[key] = (bad, f"{kind}: {detail}")
        return bad

    cfg = settings(max_examples=examples, database=None, deadline=None, derandomize=False,
                   phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck))
    try:
        case = find(source.strategy, disagrees, settings=cfg, random=random.Random(seed))
    except (NoSuchExample, Unsatisfiable):
        return None, state["calls"], ""
    return case, state["first"], seen[_case_key(case)][1]


def _case_key(case) -> tuple:
    data = tuple((a.dtype.str, a.shape, a.tobytes()) for a in map(np.asarray, case.args))
    return (case.case_id, case.source, repr(case.in_specs), repr(case.out_specs),
            repr(case.in_shardings), repr(case.out_shardings), repr(case.axis_names), data)


def _hunt_fixed(source: Source, fault: str):
    for n, (case_id, run_ref, run_xla, tol) in enumerate(source.fixed, 1):
        kind, detail = fault_verdict(fault, run_ref, run_xla, tol)
        if kind in ("mismatch", "crash"):
            return case_id, n, f"{kind}: {detail}"
    return None, len(source.fixed), ""


def hunt_direct(fault: str, sources: list[Source], examples: int, seed: int,
                shrink_calls: int = SHRINK_CALLS) -> Outcome:
    """Search the sources (most relevant first) until one yields a disagreement the fault caused."""
    f = faults_mod.FAULTS[fault]
    touches = set(f.primitives) | _FAULT_TOUCHES.get(fault, set())
    t0 = time.perf_counter()
    for src in _ordered(sources, touches):
        if src.strategy is not None:
            case, n, detail = _hunt_strategy(src, fault, examples, seed, shrink_calls)
            ident = None if case is None else case.case_id
        else:
            ident, n, detail = _hunt_fixed(src, fault)
        if ident is not None:
            return Outcome(fault, "killed", n, src.name, ident, detail.strip(), time.perf_counter() - t0)
    return Outcome(fault, "survived", None, "", "", "", time.perf_counter() - t0)


# -- the runner engine --------------------------------------------------------------------------------
_BAD = ("fail", "error", "timeout")
# the lines of a case's message that say what went wrong (its description is in the report)
_DETAIL_LINES = ("output", "element", "policy:", "differences:", "listed in", "refsim raised", "xla raised",
                 "still running", "the worker process")


def _touches(task) -> frozenset | None:
    """The primitives a planned task's family exercises (None: unknown)."""
    if task.suite == "collectives":
        return frozenset(_COLLECTIVE_TOUCHES.get(task.family, ()))
    if task.suite == "programs" and task.family in _FAMILY_TOUCHES:
        return frozenset(_FAMILY_TOUCHES[task.family])
    return None


def order_tasks(tasks: list, fault: str) -> list:
    """The plan's tasks with those exercising `fault`'s primitives first (plan order otherwise):
    it only saves time, since a fault survives only after every task agreed."""
    f = faults_mod.FAULTS[fault]
    want = set(f.primitives) | _FAULT_TOUCHES.get(fault, set())
    hit = [t for t in tasks if (_touches(t) or set()) & want]
    unknown = [t for t in tasks if _touches(t) is None]
    rest = [t for t in tasks if t not in hit and t not in unknown]
    return hit + unknown + rest


def hunt_runner(fault: str, tasks: list, xfails, *, platform: str, devices: int, processes: int,
                case_timeout: float = CASE_TIMEOUT, seed: int = 0) -> Outcome:
    """Run the plan's `tasks` in workers that inject `fault` until one fails, errors or times out
    where it passes without the fault (checked in this process)."""
    t0 = time.perf_counter()
    todo = [(t, xfails.lookup(t.case_id)) for t in order_tasks(tasks, fault)]
    by_id = {t.case_id: (t, e) for t, e in todo}
    opts = dict(repro_dir=None, devices=devices, shrink_seconds=0, seed=seed)
    examples = cases = 0
    gen = workers.run_in_workers(todo, run_task=runner.run_task, write_repro=runner.write_repro,
                                 processes=processes, platform=platform, devices=devices, opts=opts,
                                 case_timeout=case_timeout, fault=fault)
    try:
        for res in gen:
            cases += 1
            examples += res.examples
            if res.status not in _BAD:
                continue
            task, entry = by_id[res.case_id]
            base = runner.run_task(task, None, entry, devices=devices, shrink_seconds=0, seed=seed)
            if base.status in _BAD:
                BASELINE.setdefault(res.case_id, (base.message or base.status).splitlines()[0])
                continue
            lines = (res.message or "").strip().splitlines()
            keep = [ln.strip() for ln in lines if ln.strip().startswith(_DETAIL_LINES)]
            detail = f"{res.status}: " + "\n".join((lines[:1] + keep)[:8])
            return Outcome(fault, "killed", max(examples, 1), f"{res.suite}/{res.family}", res.case_id, detail,
                           time.perf_counter() - t0, res.repro_path)
    finally:
        gen.close()
    return Outcome(fault, "survived", examples,
                   detail=f"{cases} cases ({examples} examples) ran without a failure the fault caused",
                   seconds=time.perf_counter() - t0)


def _runner_module():
    # import_module honours sys.modules (a test may hide the runner); `from conformance import
    # runner` would return the package attribute once anything imported it.
    try:
        runner = importlib.import_module("conformance.engine.runner")
    except ImportError:
        return None
    return runner if hasattr(runner, "plan_tasks") else None


# -- the whole run ------------------------------------------------------------------------------------
def run(faults=None, *, examples: int | None = None, seed: int = 0, engine: str = "auto",
        sources: list[Source] | None = None, platform: str | None = None, devices: int = 8,
        shrink_calls: int = SHRINK_CALLS, progress: Callable[[Outcome], None] | None = None,
        processes: int | None = None, xfails=None, case_timeout: float = CASE_TIMEOUT,
        suite: str = "all", compile_cache: str | None = None) -> list[Outcome]:
    """One `Outcome` per fault (all of `conformance.faults.names()` by default).

    examples: draws per family (runner engine; default the run's `DEFAULT_EXAMPLES`) or per
    source (direct engine; default `DEFAULT_EXAMPLES` here). processes: worker processes
    (runner engine; default one per CPU core). xfails: a path or `XfailList` (default the
    platform's file), as `conformance run` applies it. compile_cache: a folder for JAX's persistent
    compilation cache (`conformance.engine.compile_cache`, as `conformance run --compile-cache`), used by
    this process and the fault's workers; a fault that replaces a lowering rule runs with it on, so a
    warm cache must kill it as an empty one does. None leaves JAX's setting alone.
    """
    names = list(faults_mod.names()) if faults in (None, "all") else list(faults)
    for n in names:
        if n not in faults_mod.FAULTS:
            raise ValueError(f"unknown fault {n!r} in --faults; choose from all, {', '.join(faults_mod.names())}.")
    plat = platform or platform_mod.current_platform()
    runner = _runner_module() if engine in ("auto", "runner") else None
    if engine == "runner" and runner is None:
        raise ValueError("engine='runner' needs conformance.engine.runner.plan_tasks; it is not importable here. "
                         "Use engine='direct'.")
    if compile_cache is not None:
        from conformance.engine import compile_cache as cc

        cc.enable(compile_cache)   # before the workers start: they read its environment
    outcomes = []
    if runner is not None:
        n_ex = runner.DEFAULT_EXAMPLES if examples is None else examples
        tasks = runner.plan_tasks(suite, examples=n_ex, seed=seed, devices=devices)
        xf = xfails if isinstance(xfails, xfails_mod.XfailList) else xfails_mod.load(xfails, platform=plat)
        procs = processes or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    else:
        srcs = sources if sources is not None else default_sources(devices)
    for name in names:
        f = faults_mod.FAULTS[name]
        if not f.cpu and plat == "cpu":
            out = Outcome(name, "n/a", detail="XLA:CPU cannot run the targeted op (no CPU lowering or "
                                              "thunk), so no CPU case reaches the fault; run on a GPU")
        elif runner is not None:
            out = hunt_runner(name, tasks, xf, platform=plat, devices=devices, processes=procs,
                              case_timeout=case_timeout, seed=seed)
        else:
            out = hunt_direct(name, srcs, DEFAULT_EXAMPLES if examples is None else examples, seed, shrink_calls)
        outcomes.append(out)
        if progress is not None:
            progress(out)
    return outcomes


def score(outcomes: list[Outcome]) -> tuple[int, int]:
    """(killed, total over faults this platform can exercise)."""
    applicable = [o for o in outcomes if o.status != "n/a"]
    return sum(o.status == "killed" for o in applicable), len(applicable)


def format_table(outcomes: list[Outcome], *, width: int = 100) -> str:
    rows = [("fault", "result", "examples", "killed by", "killing case")]
    for o in outcomes:
        case = o.case or (o.detail[:width] if o.status != "killed" else "")
        rows.append((o.fault, o.status, "" if o.examples is None else str(o.examples), o.source, case))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    lines.insert(1, "-" * min(width, len(lines[0])))
    k, t = score(outcomes)
    lines.append("")
    lines.append(f"mutation score: {k}/{t} killed" + (f" ({100 * k / t:.0f}%)" if t else "") +
                 (f"; {sum(o.status == 'n/a' for o in outcomes)} not applicable on this platform"
                  if any(o.status == "n/a" for o in outcomes) else ""))
    for o in outcomes:
        if o.status == "killed" and o.detail:
            lines.append(f"\n[{o.fault}] {o.case}\n    " + "\n    ".join(o.detail.splitlines()[:6]))
    if BASELINE:
        lines.append(f"\n{len(BASELINE)} drawn case(s) disagree with refsim without any fault "
                     "(platform differences or bugs; they cannot count as kills):")
        lines += [f"    {cid}" for cid in sorted(BASELINE)[:20]]
    return "\n".join(lines)


def main(argv=None) -> int:
    """CLI: prints the table and a final JSON line; exit status 1 if any applicable fault survived."""
    from conformance import validation

    p = argparse.ArgumentParser(prog="python -m conformance mutate", description=__doc__.splitlines()[0])
    p.add_argument("--faults", default="all", help="all, or a comma-separated list of fault names")
    p.add_argument("--examples", type=validation.option("--examples", integer=True, low=1), default=None,
                   help="draws per family as `conformance run --examples` (runner engine; default the run's "
                        f"default), or examples per source (direct engine; default {DEFAULT_EXAMPLES})")
    p.add_argument("--seed", type=validation.option("--seed", integer=True, low=0), default=0)
    p.add_argument("--engine", choices=("auto", "runner", "direct"), default="auto",
                   help="runner (auto): the cases of `conformance run` in fault-injecting workers; direct: "
                        "hypothesis searches in this process")
    p.add_argument("--processes", type=validation.option("--processes", integer=True, low=1), default=None,
                   help="worker processes (runner engine; default: cores)")
    p.add_argument("--xfails", default=None, help="expected failures (default xfails/<platform>.txt)")
    p.add_argument("--case-timeout", type=validation.seconds_option("--case-timeout"), default=CASE_TIMEOUT,
                   help=f"seconds a case may run under a fault (runner engine; default {CASE_TIMEOUT:g})")
    p.add_argument("--platform", default=None, help="JAX platform (default: xla_backend's current)")
    p.add_argument("--devices", type=validation.device_count_option("--devices"), default=8)
    p.add_argument("--shrink-calls", type=validation.option("--shrink-calls", integer=True, low=0),
                   default=SHRINK_CALLS,
                   help=f"runs spent shrinking each killing case (direct engine; default {SHRINK_CALLS})")
    p.add_argument("--compile-cache", metavar="DIR|off", default=None,
                   help="JAX's persistent compilation cache, as `conformance run --compile-cache` (default: "
                        "$CONFORMANCE_COMPILE_CACHE or ~/.cache/refsim-conformance/xla; 'off': none)")
    p.add_argument("--list", action="store_true", help="list the faults and exit")
    a = p.parse_args(argv)
    from conformance.engine.compile_cache import OFF, default_dir

    cache_dir = default_dir() if a.compile_cache is None else (
        None if a.compile_cache.strip().lower() in OFF else a.compile_cache)

    # Always configure before JAX starts: without it XLA:CPU has one device and every
    # multi-device case fails on the XLA side (and so could never count as a kill).
    try:
        platform_mod.configure(a.platform, a.devices)
    except RuntimeError as e:
        p.error(f"--platform={a.platform} --devices={a.devices}: {e}")
    if a.list:
        for f in faults_mod.FAULTS.values():
            print(f"{f.name:42s} {f.summary}")
        return 0
    names = None if a.faults == "all" else [n.strip() for n in a.faults.split(",") if n.strip()]
    try:
        outcomes = run(names, examples=a.examples, seed=a.seed, engine=a.engine, platform=a.platform,
                       devices=a.devices, shrink_calls=a.shrink_calls, processes=a.processes, xfails=a.xfails,
                       case_timeout=a.case_timeout, compile_cache=cache_dir,
                       progress=lambda o: print(f"  {o.fault}: {o.status}"
                                                + (f" after {o.examples} examples ({o.source})" if o.examples else "")
                                                + f" [{o.seconds:.1f}s]", file=sys.stderr, flush=True))
    except ValueError as e:
        p.error(str(e))
    print(format_table(outcomes))
    k, t = score(outcomes)
    print(json.dumps({"mutation_score": [k, t], "examples": a.examples, "seed": a.seed,
                      "outcomes": [o.to_json() for o in outcomes]}))
    return 0 if k == t else 1


if __name__ == "__main__":
    import os

    from xla_backend import platform as _platform

    _platform.configure(os.environ.get("XLA_BACKEND_PLATFORM", "cpu"), int(os.environ.get("XLA_BACKEND_DEVICES", "8")))
    sys.exit(main(sys.argv[1:]))
