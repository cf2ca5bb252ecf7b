"""Run the conformance suites: refsim against XLA, case by case, into reporters.

`run()` draws every suite's tasks (deterministic in `seed`), runs each case's examples on
refsim and on the XLA side (`xla`, default `xla_backend`), compares them by the policy of
`conformance.verdict.compare`, applies the platform's xfails file, and hands one `CaseResult` per
case to every reporter as it finishes. A disagreeing case is shrunk with hypothesis within
its family and dtype (smallest mesh, smallest shape) and written as a standalone
reproducer (`conformance.cases.Program.repro`).

A run's options are one frozen `RunOptions` (`run(**kw)` builds it; the command line builds it
from its arguments), and `_Run` runs it in named steps: setup, draw, dispatch, collect, finish.

In worker processes (the CLI's default) drawing overlaps with running: the workers start
first (the command line starts them while its platform preflight runs: `started_workers`), a
thread of the parent draws family by family while its main thread hands each family's tasks out
as soon as it is drawn, in plan order, and takes each result the moment it comes; each worker
holds its next task already (`conformance.engine.workers`), so none waits while the parent
draws. With `compile_cache` a rerun loads each program's executable from JAX's persistent cache
instead of compiling it, in a folder keyed on the code that compiles it and with every hit of a new
family verified (`conformance.engine.compile_cache`); every case is drawn, traced and lowered on
every run, so nothing stored can answer for a program or a compiler that changed. `data_per_program` runs each drawn structure with
more data sets on its one executable (`conformance.engine.plan.with_data`). The reporters start
once the whole plan is drawn (they are told its case count first); results that came before are
replayed to them in the order they came.
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys
import tempfile
import time
import traceback

from conformance.engine import plan as plan_mod
from conformance.engine import workers
from conformance.report import timing
from conformance.report.failure import Failure, case_failure
from conformance.report.files import writing
from conformance.verdict import xfails as xfails_mod
from conformance.report.results import CaseResult, summarize
from conformance.suites import SUITES, base, selected
from conformance.suites import module as suite_module
from xla_backend import cache as compiled_cache

__all__ = ["DEFAULT_CASE_TIMEOUT", "DEFAULT_DATA_PER_PROGRAM", "DEFAULT_EXAMPLES", "Interrupted", "MAX_EXAMPLES", "RunOptions", "RunResult",
           "interruptible", "plan_chunks", "plan_tasks", "run", "run_options", "run_task", "write_repro"]

# Draws per collective / program family / layout type / error kind; each collective or
# program draw runs with `base.DATA_VARIANTS` data sets. Sized for ~5 min on 2 CPU cores.
DEFAULT_EXAMPLES = 20
# The most draws per family `python -m conformance run` accepts without --force (50 times the
# default: hours of run time; the plan draws them all before the first case ends).
MAX_EXAMPLES = 1000
SHRINK_SECONDS = 60.0
# Data sets each drawn program structure of `python -m conformance run` runs with on its one compiled
# executable (`RunOptions.data_per_program`; `run()`'s None: what each suite draws, 3 or 2). One more
# data set costs ~2 ms of CPU (refsim, an XLA run, compare) where a compile costs ~45 ms: 10 checks
# ~3.5x the data examples of the suites' own 3 for ~15% more CPU in a cold run (docs/performance.md).
DEFAULT_DATA_PER_PROGRAM = 10
# A case (all its examples) normally takes seconds; one still running after this is a hang.
DEFAULT_CASE_TIMEOUT = 300.0


@dataclasses.dataclass
class RunResult:
    """Every case's result, and the summary (`conformance.report.results.summarize` plus xfail notes)."""

    results: list
    summary: dict

    @property
    def ok(self) -> bool:
        return bool(self.summary["ok"])

    @property
    def complete(self) -> bool:
        """Whether every planned case has a result (`conformance.results.cover`)."""
        return bool(self.summary.get("complete", True))

    @property
    def verdict(self) -> str:
        """"AGREE", "DISAGREE" or "INCOMPLETE" (`conformance.results.verdict`)."""
        from conformance.report.results import verdict

        return verdict(self.summary)


def _compile_seconds() -> float:
    from xla_backend import cache

    return cache.stats()["compile_seconds"]


def unsupported_reason(exc: BaseException) -> str | None:
    """The reason when `exc` says the platform has no lowering or runtime for an op, else None."""
    text = f"{type(exc).__name__}: {exc}"
    for pat in (r"MLIR translation rule for primitive '[^']+' not found for platform \w+",
                r"UNIMPLEMENTED[^\n]*", r"[^\n]*not (?:supported|implemented) on (?:this platform|CPU)[^\n]*"):
        m = re.search(pat, text)
        if m:
            return m.group(0)
    return None


def _slug(case_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", case_id).strip("_")[:120]


# -- one task -------------------------------------------------------------------------------------
def run_task(task, xla=None, entry: xfails_mod.Entry | None = None, *, repro_dir: str | None = None,
             devices: int = 8, shrink_seconds: float = SHRINK_SECONDS, seed: int = 0) -> CaseResult:
    """Run one task (all its examples) and return its CaseResult with the xfails `entry` applied."""
    if xla is None:
        import xla_backend as xla
    if entry is not None and entry.crash:
        # a fatal CHECK in XLA would abort this process and every case after it
        return CaseResult(case_id=task.case_id, suite=task.suite, family=task.family, dtype=task.dtype,
                          status="xfail", examples=0, message=f"not run: crash: {entry.reason}")
    if entry is not None and entry.aborts and not workers.in_worker():
        # only a worker's death is an expected abort; here it would end the run
        said = next(e for e in getattr(entry, "entries", (entry,)) if e.aborts)
        return CaseResult(case_id=task.case_id, suite=task.suite, family=task.family, dtype=task.dtype,
                          status="xfail", examples=0,
                          message=f"not run in this process: {said.signature}: {said.reason} (worker processes run it)")
    t0, c0 = time.perf_counter(), _compile_seconds()
    x0 = timing.xla_counters()
    phases: dict = {}
    if isinstance(task, base.ProgramTask):
        with compiled_cache.scope(task.family):
            out, failing = _run_program(task, xla, entry, phases)
    else:
        failing = None
        workers.step("check")   # refsim and XLA together: a death here is no XLA abort an entry can expect
        try:
            with timing.timed(phases, "checks"), compiled_cache.scope(task.family):
                out = task.check(xla)
        except Exception as e:  # noqa: BLE001 - a crashing check is the case's result
            reason = unsupported_reason(e)
            out = base.Outcome("unsupported" if reason else "error", reason or f"{type(e).__name__}: {e}",
                               details=Failure(traceback=traceback.format_exc(), exception_type=type(e).__name__,
                                               # which side raised inside a check is unknown: never expected
                                               signature=xfails_mod.exception_failure("unknown", e)))
    x1 = timing.xla_counters()
    status, message = _apply_xfail(out, entry)
    repro = None
    if status == "fail" and failing is not None:
        workers.step("shrink")
        with timing.timed(phases, "shrink"):
            repro, note = _shrink_and_write(task, failing, xla, repro_dir, devices, shrink_seconds, seed)
        message = f"{message}\n{note}" if note else message
        out.details.shrunk = note
        # which compiler stage introduced the difference (conformance.debug.explain); an engine that cannot
        # rerun a case here (the distributed run's: it needs every process) says so
        if repro is not None and getattr(xla, "can_explain", True):
            from conformance.debug.explain.summary import stage_of_reproducer

            out.details.stage = stage_of_reproducer(repro)
    return CaseResult(case_id=task.case_id, suite=task.suite, family=task.family, dtype=task.dtype, status=status,
                      examples=out.examples, seconds=time.perf_counter() - t0,
                      compile_seconds=_compile_seconds() - c0, message=message, repro_path=repro,
                      details=out.details, phases=_split_xla(phases, x0, x1))


def _split_xla(phases: dict, x0: tuple, x1: tuple) -> dict:
    """`phases` with the XLA compile and run seconds (xla_backend's counters) taken out of the
    XLA calls of program cases ("xla") or out of the other checks ("checks")."""
    comp, run_s = max(0.0, x1[0] - x0[0]), max(0.0, x1[1] - x0[1])
    out = {k: v for k, v in phases.items() if k != "xla"}
    out["xla_compile"], out["xla_run"] = comp, run_s
    if "xla" in phases:
        out["xla_trace_lower"] = max(0.0, phases["xla"] - comp - run_s)
    elif "checks" in phases:
        out["checks"] = max(0.0, phases["checks"] - comp - run_s)
    return {k: round(v, 6) for k, v in out.items()}


def _apply_xfail(out: base.Outcome, entry) -> tuple[str, str]:
    """The status after the xfails entry: xfail / xpass / unsupported when the outcome is what the
    entry's signature describes; "error" when a listed case fails in any other way."""
    if entry is None:
        if out.status == "unsupported":
            return "error", (f"{out.message}\nThe platform cannot run this case; if that is expected, list it in "
                             "xfails/<platform>.txt as 'CASE_ID_PATTERN unsupported: REASON'.")
        return out.status, out.message
    if out.status == "pass" and entry.sometimes:
        return "pass", f"agreed (listed as {entry.signature}: {entry.reason}; some data or parameters differ)"
    if out.status == "pass":
        return "xpass", f"agreed although {entry.pattern!r} is listed in the xfails file: {entry.signature}: {entry.reason}"
    failure = out.details.signature
    if failure is None and out.status == "unsupported":
        failure = {"kind": "unsupported", "side": "xla"}   # a check that found no way to run it
    ok, why = entry.expects(failure)
    entry = entry.expecting(failure)   # of several entries, the one this failure is
    if ok and entry.unsupported:
        # The entry's reason usually quotes the platform's own words: say them once.
        said = "" if out.message in entry.reason else f"\n{out.message}"
        return "unsupported", f"unsupported: {entry.reason}{said}"
    if ok:
        n = out.details.expected_failures or 1
        return "xfail", (f"expected failure {entry.signature} in {n} of {out.examples} example(s): {entry.reason}\n"
                         f"{out.message}")
    return "error", (f"{out.message}\nlisted in the xfails file as {entry.signature} ({entry.pattern!r}: {entry.reason}), "
                     f"but this failure is not that one: {why}")


def _run_program(task, xla, entry=None, phases: dict | None = None):
    """(Outcome, failing (case, expected, comparison) or None) over a ProgramTask's examples;
    seconds spent in refsim, the XLA side and compare are added to `phases`.

    A failure the xfails `entry` expects does not end the task: the remaining examples still
    run, so that a refsim crash or another failure in a later example is not masked by it.
    """
    import refsim
    from conformance.verdict import platform_models
    from conformance.verdict.compare import compare

    phases = {} if phases is None else phases
    examples = 0
    expected = []
    for case in task.variants:
        # each step marked in a worker's stderr log: only a death in "xla" can be an expected abort
        workers.step("refsim")
        try:
            with timing.timed(phases, "refsim"):
                want = case.run(refsim)
        except Exception as e:  # noqa: BLE001
            jax_error = _raised_on_the_xla_side_too(case, xla, e, phases)
            if jax_error is None:
                return _crash("refsim", case, e, examples), None
            # JAX itself rejected the program (refsim traces it with JAX as well): the system under
            # test's failure, which an xfails entry can list, not refsim's
            out = _crash("xla", case, jax_error, examples, both=True)
            if entry is not None and entry.expects(out.details.signature)[0]:
                examples += 1
                expected.append(out)
                continue
            return out, None
        workers.step(xfails_mod.XLA_STEP)
        try:
            with timing.timed(phases, "xla"):
                # an engine may run whole cases itself (the distributed run replays assembled results)
                got = xla.run_case(case) if hasattr(xla, "run_case") else case.run(xla)
        except Exception as e:  # noqa: BLE001
            reason = unsupported_reason(e)
            if reason:
                details = case_failure(case, expected=want,
                                       signature=xfails_mod.exception_failure("xla", e, unsupported=True))
                return base.Outcome("unsupported", reason, examples, details), None
            out = _crash("xla", case, e, examples)
            if entry is not None and entry.expects(out.details.signature)[0]:
                examples += 1
                expected.append(out)
                continue
            return out, None
        examples += 1
        workers.step("compare")
        with timing.timed(phases, "compare"):
            res = compare(want, got, case=case)
        if not res.ok:
            models = {}
            for name in (entry.models if entry is not None else ()):
                models[name] = platform_models.check(name, case, got)
            # the failure record is built here, where the case is compared
            details = case_failure(case, res, expected=want, signature=xfails_mod.comparison_failure(res, models))
            out = base.Outcome("fail", res.report(), examples, details)
            if entry is not None and entry.expects(details.signature)[0]:
                expected.append(out)
                continue
            return out, (case, want, res)
    if expected:
        first = expected[0]
        first.details.expected_failures = len(expected)
        return base.Outcome(first.status, first.message, examples, first.details), None
    return base.Outcome("pass", "", examples), None


def _crash(side: str, case, exc: BaseException, examples: int, *, both: bool = False) -> base.Outcome:
    details = case_failure(case, traceback=traceback.format_exc(), exception_type=type(exc).__name__,
                           signature=xfails_mod.exception_failure(side, exc))
    said = (f"JAX raised {type(exc).__name__} on both sides (refsim traces the program with JAX too) on a valid case"
            if both else f"{side} raised {type(exc).__name__} on a valid case")
    return base.Outcome("error", f"{said}: {exc}\n{case.describe()}", max(examples, 1), details)


def _raised_on_the_xla_side_too(case, xla, refsim_error: BaseException, phases: dict):
    """The XLA side's exception when running `case` there raises the one refsim raised (same
    class, same message): JAX's tracer, which both engines run the program through, rejected it.
    None when the XLA side runs it, or raises anything else (then refsim's failure is its own)."""
    # should the XLA side abort the worker, the record of its death says refsim had raised first
    workers.note(f"refsim raised {type(refsim_error).__name__} on this case: {refsim_error}; "
                 "the XLA side was then run to tell a JAX tracing error from refsim's own")
    workers.step("xla-after-refsim")
    try:
        with timing.timed(phases, "xla"):
            xla.run_case(case) if hasattr(xla, "run_case") else case.run(xla)
    except Exception as e:  # noqa: BLE001
        if type(e) is type(refsim_error) and str(e) == str(refsim_error):
            return e
    return None


def _size(case) -> tuple:
    import numpy as np

    return (case.mesh.size, sum(int(np.asarray(a).size) for a in case.args))


def shrink(task, failing_case, xla, *, devices: int = 8, seconds: float = SHRINK_SECONDS, seed: int = 0):
    """The smallest failing case hypothesis finds in `task`'s family and dtype within `seconds`
    (smallest mesh first, then smallest shape); `failing_case` when nothing smaller fails."""
    import random

    from hypothesis import HealthCheck, Phase, find, settings

    import refsim
    from conformance.verdict.compare import compare

    if task.shrink is None:
        return failing_case
    suite, family, dtype = task.shrink
    best = [failing_case]
    stop = time.monotonic() + seconds

    def fails(case) -> bool:
        if time.monotonic() > stop:
            return False
        try:
            bad = not compare(case.run(refsim), case.run(xla), case=case).ok
        except Exception:  # noqa: BLE001 - a crash is another bug, not this failure
            return False
        if bad and _size(case) <= _size(best[0]):
            best[0] = case
        return bad

    own = getattr(suite_module(suite), "shrink_case", None)
    if own is not None:
        # a suite that shrinks a failing case itself (sharded: cut the op graph down)
        return own(failing_case, fails, seconds)
    cfg = settings(max_examples=200, database=None, deadline=None, suppress_health_check=list(HealthCheck),
                   phases=[Phase.generate, Phase.shrink])
    try:
        find(suite_module(suite).strategy(family, dtype, devices), fails, settings=cfg, random=random.Random(seed))
    except Exception:  # noqa: BLE001 - NoSuchExample, or a time-out mid-shrink: keep the best seen
        pass
    return best[0]


def _shrink_and_write(task, failing, xla, repro_dir, devices, seconds, seed) -> tuple[str | None, str]:
    import refsim

    case, want, _ = failing
    small = shrink(task, case, xla, devices=devices, seconds=seconds, seed=seed) if seconds > 0 else case
    try:
        expected = want if small is case else small.run(refsim)
        path = write_repro(task, small, repro_dir, expected=expected)
    except Exception as e:  # noqa: BLE001 - the failure is reported even if no reproducer can be built
        return None, f"no reproducer: {type(e).__name__}: {e}"
    note = "" if small is case else f"shrunk to {small.case_id} ({_shape_text(small)})"
    return path, note


def write_repro(task, case, repro_dir: str | None, expected=None) -> str:
    """Write `case`'s standalone reproducer (refsim's `expected` result embedded; computed when
    None) as ``repro_dir/<task's case id>.py`` and return its path."""
    text = case.repro(expected=expected)
    repro_dir = repro_dir or os.path.join(tempfile.gettempdir(), "conformance-repros")
    os.makedirs(repro_dir, exist_ok=True)
    path = os.path.join(repro_dir, _slug(task.case_id) + ".py")
    with writing(path), open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


def _shape_text(case) -> str:
    import numpy as np

    return ", ".join(f"arg {i}: {np.asarray(a).dtype}{list(np.shape(a))}" for i, a in enumerate(case.args))


# -- the whole run --------------------------------------------------------------------------------
def plan_tasks(suite="all", *, examples: int = DEFAULT_EXAMPLES, seed: int = 0, devices: int = 8) -> list:
    """Every task of the selected suites, deterministic in (examples, seed, devices)."""
    return base.flatten(plan_chunks(suite, examples=examples, seed=seed, devices=devices))


def plan_chunks(suite="all", *, examples: int = DEFAULT_EXAMPLES, seed: int = 0, devices: int = 8):
    """The tasks of `plan_tasks` as an iterator of lists, one per family, each drawn when it is
    asked for (the suites' `task_chunks`). Bad arguments raise here, before any drawing."""
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < 1:
        raise ValueError(f"examples={examples!r}; pass a positive int (draws per family).")
    names = selected(suite)
    return (chunk for name in names
            for chunk in suite_module(name).task_chunks(examples=examples, seed=seed, devices=devices))


def not_drawn(suite="all", *, devices: int = 8) -> list[str]:
    """The families of the selected suites that no mesh of `devices` devices can express, each
    with its reason: the plan record and the summary list them, so a small machine's run says
    what it could not cover."""
    return [line for name in selected(suite)
            for line in getattr(suite_module(name), "not_drawn", lambda devices: [])(devices)]


def _versions() -> dict:
    import hypothesis
    import jax
    import numpy as np

    return {"jax": jax.__version__, "jaxlib": getattr(__import__("jaxlib"), "__version__", "?"),
            "numpy": np.__version__, "python": sys.version.split()[0], "hypothesis": hypothesis.__version__}


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Everything one run takes, built once (by `run`'s keyword arguments or the command line's
    `python -m conformance run`) and read by every step of the run.

    suite: "collectives", "layouts", "programs", "errors", "mpmd", "sharded", "all" or a comma list.
    examples: draws per family. seed: the seed of every draw. platform, devices: where the XLA
    side runs (JAX platform name, device count). report_dir: the report folder (None: no files).
    progress, console: the live progress bar, and the rich console it draws on.
    xla: the XLA-side engine (None: `xla_backend`). resume: skip the cases already in
    ``report_dir/results.jsonl``. xfails: a file path, an `XfailList`, or None for
    ``xfails/<platform>.txt``; strict_xfails: stale or too-broad entries fail the run.
    processes: None runs the cases in this process, K in K worker processes. shrink_seconds:
    time to shrink each failure (0: none). compile_cache: a folder for the compiled-program
    cache (`conformance.engine.compile_cache`; None leaves JAX's setting alone).
    data_per_program: data sets per compiled program structure (None: each suite's default,
    `conformance.suites.base.DATA_VARIANTS`). shard: (K, N) or "K/N". plan_extra: entries added
    to the plan record. executor: ``executor(todo, opts)`` yielding CaseResults instead of
    this process or workers. case_timeout: seconds a case may run in a worker (None: no limit).
    started_workers: workers started ahead (`conformance.engine.workers.start`, with this run's
    platform and devices), which the run takes over instead of starting its own (the command line
    starts them while its platform preflight runs); needs `processes`.
    """

    suite: str = "all"
    examples: int = DEFAULT_EXAMPLES
    seed: int = 0
    platform: str = "cpu"
    devices: int = 8
    report_dir: object = None
    progress: bool = True
    xla: object = None
    resume: bool = False
    xfails: object = None
    processes: int | None = None
    shrink_seconds: float = SHRINK_SECONDS
    console: object = None
    compile_cache: str | None = None
    strict_xfails: bool = False
    shard: object = None
    plan_extra: dict | None = None
    executor: object = None
    case_timeout: float | None = None
    data_per_program: int | None = None
    started_workers: object = None

    def validate(self) -> None:
        """ValueError naming the argument, its value and the fix, for any option out of range or
        any pair of options that cannot go together; nothing has started yet."""
        from conformance import validation

        if self.resume and self.report_dir is None:
            raise ValueError("resume=True needs report_dir, the folder whose results.jsonl lists the finished cases.")
        validation.check("examples", self.examples, integer=True, low=1, what="draws per family")
        validation.check("seed", self.seed, integer=True, low=0)
        validation.check("devices", self.devices, integer=True, low=1)
        validation.check("processes", self.processes, integer=True, low=1, none=True, what="worker processes",
                         none_means="to run the cases in this process")
        validation.check_seconds("shrink_seconds", self.shrink_seconds, zero=True, what="0: no shrinking")
        validation.check_seconds("case_timeout", self.case_timeout, none=True, what="seconds",
                                 none_means="for no limit")
        validation.check("data_per_program", self.data_per_program, integer=True, low=1, none=True,
                         what="data sets per compiled program", none_means="for each suite's default")
        if self.processes is not None and self.xla is not None:
            _check_picklable(self.xla)
        if self.started_workers is not None and (self.processes is None or self.executor is not None):
            raise ValueError("started_workers needs processes=K and no executor: only a run in worker processes "
                             "takes workers over.")
        if self.case_timeout is not None and self.processes is None:
            raise ValueError("case_timeout needs processes=K: a hung case can only be stopped by killing the worker "
                             "process it runs in (a deadlocked XLA rendezvous never returns to Python).")

    @property
    def shard_kn(self) -> tuple[int, int] | None:
        """The shard as (K, N), or None for the whole plan."""
        if self.shard is None:
            return None
        return self.shard if isinstance(self.shard, tuple) else plan_mod.parse_shard(self.shard)

    @property
    def streams(self) -> bool:
        """Whether the workers start before the plan is drawn and take each family as it comes
        (the default worker run); a resumed run, an executor and an in-process run draw first."""
        return self.processes is not None and self.executor is None and not self.resume


def run(*, suite="all", examples: int = DEFAULT_EXAMPLES, seed: int = 0, platform: str = "cpu", devices: int = 8,
        report_dir=None, progress: bool = True, xla=None, resume: bool = False, xfails=None, processes=None,
        shrink_seconds: float = SHRINK_SECONDS, console=None, compile_cache=None,
        strict_xfails: bool = False, shard=None, plan_extra: dict | None = None, executor=None,
        case_timeout: float | None = None, data_per_program: int | None = None,
        started_workers=None) -> RunResult:
    """Run the selected suites on `platform` with `devices` devices; return every CaseResult and the summary.

    The arguments are the fields of `RunOptions` (`run_options(RunOptions(...))` is the same run).
    suite: "collectives", "layouts", "programs", "errors", "mpmd", "all" (or a comma list).
    examples: draws per family (collectives and program draws run with 3 data sets each).
    xla: the XLA-side engine (an object with shard_map / pmap / jit / device_put like
    `xla_backend`), e.g. a test double; default xla_backend. xfails: a file path, an
    `XfailList`, or None for ``xfails/<platform>.txt``. resume: skip the cases already in
    ``report_dir/results.jsonl`` (which must hold this plan's plan line, judged with the same
    xfails entries, and only this plan's cases: `conformance.plan.check_resume`). processes: None runs the cases in this process (where
    `xla=` doubles and installed faults live); K runs them in K worker processes, where a case
    that kills its worker (a fatal CHECK in XLA) is an "error" result and a fresh worker takes
    the next case (`conformance.engine.workers`; `python -m conformance run` uses one per CPU core by
    default); they start before the cases are drawn and run them as they are drawn, except with
    `resume` or `executor`, which draw the whole plan first. compile_cache: a folder for JAX's
    persistent compilation cache, keyed on the code that compiles (`conformance.engine.compile_cache`),
    so a rerun skips XLA's compiles; None leaves JAX's setting alone. data_per_program: data
    sets each drawn program structure runs with on one executable (None: each suite's own).
    strict_xfails: stale xfails entries (listed cases that all agreed, or, in a run of every
    suite, entries no case matched) and too-broad ones make the run fail (`summary["ok"]`).
    shard: (K, N) or "K/N" runs only that shard of the plan (`conformance.engine.plan.select_shard`);
    a resumed folder must hold the same plan and shard. plan_extra: entries added to the plan the
    reporters record (hardware, the distributed job). executor: ``executor(todo, opts)`` yielding
    CaseResults, instead of this process or workers (`conformance.engine.distributed.Job.execute`).
    case_timeout: seconds a case may run (in a worker; needs `processes`) before it is killed
    with its worker and recorded as "timeout" (`python -m conformance run --case-timeout`,
    default `DEFAULT_CASE_TIMEOUT`); None: no limit. started_workers: workers started ahead
    (`conformance.engine.workers.start`) that the run takes over (needs `processes`).

    The report folder is this run's alone while it runs (`conformance.report.lock`: another run
    on it raises `FolderLocked`). The summary covers the plan or says it does not
    (`conformance.results.cover`): when some planned case has no result (the run was interrupted,
    a distributed process was lost, the executor stopped early) its verdict is "INCOMPLETE" and it
    names the missing cases. SIGINT, SIGTERM and SIGHUP (where they have their default handlers)
    stop the run between two reporter writes: the reports are finished as INCOMPLETE, the folder
    is resumable, and `Interrupted` (a KeyboardInterrupt) is raised with the `RunResult` so far.
    """
    return run_options(RunOptions(
        suite=suite, examples=examples, seed=seed, platform=platform, devices=devices, report_dir=report_dir,
        progress=progress, xla=xla, resume=resume, xfails=xfails, processes=processes,
        shrink_seconds=shrink_seconds, console=console, compile_cache=compile_cache, strict_xfails=strict_xfails,
        shard=shard, plan_extra=plan_extra, executor=executor, case_timeout=case_timeout,
        data_per_program=data_per_program, started_workers=started_workers))


def run_options(options: RunOptions) -> RunResult:
    """`run` with its arguments as one `RunOptions`: check them, take the report folder, run."""
    options.validate()
    if options.report_dir is not None:
        from conformance.report import prepare_report_dir

        prepare_report_dir(options.report_dir)  # an unusable folder fails before anything runs
    lock = None
    if options.report_dir is not None:
        from conformance.report.lock import acquire

        lock = acquire(options.report_dir)  # FolderLocked when another run writes there
        if lock.took_over and lock._depth == 1:
            print(lock.note(), file=sys.stderr)
    try:
        with interruptible() as signals:
            return _Run(options, signals).execute()
    finally:
        if lock is not None:
            lock.release()

class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT, SIGTERM or SIGHUP. `signal` names it; `result` is the RunResult of
    what was recorded (its summary INCOMPLETE), None when the plan was still being drawn."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal = signal_name
        self.result: RunResult | None = None


class _Signals:
    """SIGINT, SIGTERM and SIGHUP raise `Interrupted` while a run is on, except inside `deferred()`
    (a reporter writing a record), where the signal is kept and raised when the block ends: a
    report is never left half-written. Only handlers that are the defaults are replaced (a
    handler of the caller's own, or SIGHUP ignored by nohup, stays), and only in the main thread."""

    NAMES = ("SIGINT", "SIGTERM", "SIGHUP")

    def __init__(self):
        self._old: dict = {}
        self._depth = 0
        self._pending: str | None = None

    def __enter__(self):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for name in self.NAMES:
                sig = getattr(signal, name, None)
                if sig is None:
                    continue
                current = signal.getsignal(sig)
                if current in (signal.SIG_DFL, signal.default_int_handler):
                    self._old[sig] = current
                    signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        import signal

        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def _handle(self, signum, frame):
        import signal

        name = signal.Signals(signum).name
        if self._depth:
            self._pending = self._pending or name
            return
        raise Interrupted(name)

    def deferred(self, *, hold: bool = False) -> "_Deferred":
        """A block a signal does not break into: one that comes meanwhile is raised when the block
        ends normally (kept for `take_pending` when it ends by an exception, or with `hold`)."""
        return _Deferred(self, hold)

    def take_pending(self) -> "Interrupted | None":
        name, self._pending = self._pending, None
        return Interrupted(name) if name else None


class _Deferred:
    def __init__(self, signals: _Signals, hold: bool):
        self.signals, self.hold = signals, hold

    def __enter__(self):
        self.signals._depth += 1
        return self

    def __exit__(self, exc_type, exc, tb):
        s = self.signals
        s._depth -= 1
        if not s._depth and s._pending and exc_type is None and not self.hold:
            raise s.take_pending()
        return False


_ACTIVE: list = []  # the _Signals in force (interruptible() blocks nest: the outermost one handles)


def interruptible():
    """A block in which SIGINT, SIGTERM and SIGHUP raise `Interrupted` (see `_Signals`); nested
    blocks (the command line's around the runner's) share the outermost one's handlers."""
    import contextlib

    @contextlib.contextmanager
    def block():
        if _ACTIVE:
            yield _ACTIVE[-1]
            return
        with _Signals() as signals:
            _ACTIVE.append(signals)
            try:
                yield signals
            finally:
                _ACTIVE.pop()

    return block()


def _stopped_by(exc: BaseException) -> str:
    """Why a run ended early, for the summary: ``interrupted by SIGINT`` or the exception's first line."""
    if isinstance(exc, Interrupted):
        return f"interrupted by {exc.signal}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by SIGINT"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"stopped by {type(exc).__name__}" + (f": {first[:300]}" if first else "")


class _Run:
    """One run of `RunOptions`, in named steps: `setup` (platform, caches, xfails, what a resumed
    folder holds), `draw` (the plan's chunks, of the shard), `dispatch` (the tasks to this process,
    the workers or the executor), `collect` (each result to the reporters as it comes) and
    `finish` (the summary). `begin` starts the reporters once the plan is drawn: they need its
    case count; results that came before are replayed to them in the order they came."""

    def __init__(self, options: RunOptions, signals):
        self.o = options
        self.signals = signals
        self.xf = None
        self.finished: dict = {}
        self.task_opts: dict = {}
        self.compile_cache = options.compile_cache
        self.tasks: list = []
        self.plan: dict = {}
        self.plan_cases = 0       # the whole plan's case count (before sharding), counted as it is drawn
        self.drawing = 0.0
        self.reporters: list = []
        self.results: list = []
        self.early: list | None = []  # results that finished while the plan was still being drawn
        self.t0 = 0.0

    def execute(self) -> RunResult:
        workers.mark("setup")
        self.setup()
        self.t0 = time.perf_counter()  # the wall time includes drawing the cases
        workers.mark("run_start")
        return self.collect(self.dispatch(self.draw()))

    # -- steps -----------------------------------------------------------------------------------
    def setup(self) -> None:
        from xla_backend import platform as xplat

        o = self.o
        xplat.configure(o.platform, o.devices)
        if o.compile_cache is not None:
            from conformance.engine import compile_cache as cc

            self.compile_cache = cc.enable(o.compile_cache)
        self.xf = o.xfails if isinstance(o.xfails, xfails_mod.XfailList) else xfails_mod.load(o.xfails,
                                                                                           platform=o.platform)
        repro_dir = None
        if o.report_dir is not None:
            from conformance.report import JSONL_NAME, load_finished

            if o.resume:
                self.finished = load_finished(os.path.join(os.fspath(o.report_dir), JSONL_NAME))
            repro_dir = os.path.join(os.fspath(o.report_dir), "repros")
        self.task_opts = dict(repro_dir=repro_dir, devices=o.devices, shrink_seconds=o.shrink_seconds, seed=o.seed)

    def draw(self):
        """The plan's chunks of tasks (of the shard), drawn as they are asked for."""
        o = self.o
        shard_kn = o.shard_kn   # a bad shard raises here, before any drawing

        def counted(all_chunks):
            for chunk in all_chunks:
                self.plan_cases += len(chunk)
                yield chunk

        drawn = plan_chunks(o.suite, examples=o.examples, seed=o.seed, devices=o.devices)
        if o.data_per_program is not None:
            drawn = (plan_mod.with_data(chunk, o.data_per_program, o.seed) for chunk in drawn)
        return plan_mod.select_shard_chunks(counted(drawn), shard_kn)

    def dispatch(self, chunks):
        """The results as the tasks finish: streamed to workers while they are drawn, or drawn
        first (the finished cases of a resumed folder are reported, not run again)."""
        o = self.o
        if o.streams:
            drawn = workers.Drawn(chunks)   # a thread draws; this one hands out tasks meanwhile

            def feed():
                try:
                    for chunk in drawn:
                        self.tasks.extend(chunk)
                        yield [(task, self.xf.lookup(task.case_id)) for task in chunk]
                finally:
                    drawn.close()
                self.begin()

            return _execute([], o.xla, self.task_opts, o.processes, o.platform, o.devices, o.case_timeout,
                            more=feed(), more_ready=drawn, started=o.started_workers)
        self.tasks.extend(base.flatten(chunks))
        self.begin()
        todo = []
        for task in self.tasks:
            done = self.finished.get(task.case_id)
            if done is not None:
                with self.signals.deferred():
                    self.results.append(done)
                    for r in self.reporters:
                        r.case_finished(done)
            else:
                todo.append((task, self.xf.lookup(task.case_id)))
        if o.executor:
            return o.executor(todo, self.task_opts)
        return _execute(todo, o.xla, self.task_opts, o.processes, o.platform, o.devices, o.case_timeout,
                        started=o.started_workers)

    def begin(self) -> None:
        """The plan is drawn: start the reporters with it, then replay the results that came early."""
        o = self.o
        self.drawing = time.perf_counter() - self.t0
        workers.mark("begin")
        if o.report_dir is not None:
            from conformance.report import open_report_dir

            self.reporters.extend(open_report_dir(o.report_dir, resume=o.resume))  # creates and checks the folder
        if o.progress:
            from conformance.report import ProgressReporter

            self.reporters.append(ProgressReporter(total=len(self.tasks), console=o.console))
        self.plan.update(self._plan_record())
        if o.resume:
            plan_mod.check_resume(o.report_dir, self.plan, self.finished)  # before any reporter rewrites the folder
        with self.signals.deferred():
            for r in self.reporters:
                r.start(self.plan)
            for res in self.early:
                for r in self.reporters:
                    r.case_finished(res)
            self.early = None

    def _plan_record(self) -> dict:
        o = self.o
        plan = dict(platform=o.platform, devices=o.devices, suite=",".join(selected(o.suite)), seed=o.seed,
                    examples=o.examples, processes=o.processes, compile_cache=self.compile_cache,
                    xfails=self.xf.source, xfails_digest=plan_mod.xfails_digest(self.xf), cases=len(self.tasks),
                    resumed=bool(o.resume), not_drawn=not_drawn(o.suite, devices=o.devices), **_versions())
        # the rest of the plan identity (`conformance.engine.plan.IDENTITY_KEYS`)
        plan.update(data_per_program=o.data_per_program, strict_xfails=bool(o.strict_xfails),
                    **plan_mod.config_entries())
        plan.update(o.plan_extra or {})
        if o.shard_kn is not None:
            plan["shard"] = "%d/%d" % o.shard_kn
            plan["plan_cases"] = self.plan_cases
        plan["case_ids"] = [t.case_id for t in self.tasks]
        return plan

    def collect(self, source) -> RunResult:
        """Hand each result to every reporter as it comes; the summary at the end, also when the
        run is stopped (an exception while drawing leaves nothing half-done: no reporter started)."""
        signals = self.signals
        stopped: BaseException | None = None
        summary: dict = {}
        try:
            for res in source:
                with signals.deferred():  # a signal waits until every reporter has this result
                    self.results.append(res)
                    if self.early is not None:
                        self.early.append(res)
                        continue
                    for r in self.reporters:
                        r.case_finished(res)
        except BaseException as e:
            stopped = e
            raise
        finally:
            try:
                if self.early is None:
                    with signals.deferred(hold=True):
                        summary = self.finish(stopped)
            finally:
                # also when finishing raised (a full disk): left to the garbage collector, the generator's
                # workers would be stopped at exit, in whatever order it finalises them and their pipes
                close = getattr(source, "close", None)
                if close is not None:
                    with signals.deferred(hold=True):
                        close()  # a generator stopped at a yield (interrupted meanwhile): its workers end now
            if isinstance(stopped, Interrupted):
                stopped.result = RunResult(self.results, summary) if summary else None
        late = signals.take_pending()  # a signal while the summary was written: the run is over, say so
        if late is not None:
            late.result = RunResult(self.results, summary)
            raise late
        return RunResult(self.results, summary)

    def finish(self, stopped: BaseException | None) -> dict:
        """The summary of the results so far, handed to every reporter's `finish`."""
        from conformance.report.results import cover

        o, results = self.o, self.results
        wall = time.perf_counter() - self.t0
        workers.mark("run_end", wall=wall)
        summary = summarize(results, wall_seconds=wall, compile_seconds=sum(r.compile_seconds for r in results))
        # An entry no case matched is stale only if every suite ran: a suite-filtered run
        # never draws the other suites' cases, so their entries say nothing there.
        _xfail_summary(summary, self.xf, results, o.strict_xfails, complete=set(selected(o.suite)) == set(SUITES))
        summary["plan"] = {k: v for k, v in self.plan.items() if k != "case_ids"}  # the plan line has them
        summary["phases"] = timing.totals(results, self.drawing)
        # the share of the work (summed over the workers, as the phase line counts it), not of the wall time
        work = sum(summary["phases"].values())
        summary["compile_share"] = summary["phases"]["xla_compile"] / work if work > 0 else 0.0
        cover(summary, self.plan["case_ids"], results, why=None if stopped is None else _stopped_by(stopped))
        if self.compile_cache is not None:
            from conformance.engine import compile_cache as cc

            summary["compile_cache_events"] = cc.end_run()
        for r in self.reporters:
            r.finish(summary)
        return summary


def _xfail_summary(summary: dict, xf, results: list, strict: bool, *, complete: bool) -> None:
    """Add the xfails audit (`conformance.verdict.xfails.audit`) to `summary`; with `strict`, stale and
    too-broad entries fail the run (unused entries only count in a run of every suite)."""
    audit = xfails_mod.audit(xf, results)
    summary["stale_xfails"] = [r.case_id for r in results if r.status == "xpass"]
    summary["unused_xfails"] = [f"{e.pattern} ({xf.where(e)})" for e in xf.unused()] if complete else []
    summary["too_broad_xfails"] = audit["too_broad"]
    summary["xfail_entries"] = audit["entries"]
    problems = summary["stale_xfails"] + audit["too_broad"] + summary["unused_xfails"]
    summary["strict_xfails"] = bool(strict)
    if strict and problems:
        summary["ok"] = False
        summary["strict_xfail_problems"] = problems


def _check_picklable(xla) -> None:
    import pickle

    try:
        pickle.dumps(xla)
    except Exception as e:  # noqa: BLE001 - modules, closures, locks: anything pickle refuses
        raise ValueError(f"xla={xla!r} cannot be sent to worker processes ({type(e).__name__}: {e}); pass an "
                         "instance of a module-level class, or processes=None to run it in this process.") from None


def _execute(todo, xla, opts, processes, platform, devices, case_timeout=None, more=None, more_ready=None,
             started=None):
    """Yield CaseResults as tasks finish: in this process (processes=None), or in `processes`
    workers that survive a crashing or hanging case (`conformance.engine.workers`), which also take
    the lists of tasks `more` yields while it is drawn."""
    if processes is None:
        for task, entry in todo:
            yield run_task(task, xla, entry, **opts)
        return
    yield from workers.run_in_workers(todo, run_task=run_task, write_repro=write_repro, processes=processes,
                                      platform=platform, devices=devices, xla=xla, opts=opts,
                                      case_timeout=case_timeout, more=more, more_ready=more_ready,
                                      started=started)
