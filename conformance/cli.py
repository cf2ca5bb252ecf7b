"""`python -m conformance`: run the suites, or dispatch to another subcommand (`COMMANDS`).

    python -m conformance run [--platform P] [--devices N] [--examples N]
        [--suite collectives|layouts|programs|errors|mpmd|all] [--report DIR] [--seed S]
        [--processes K] [--resume] [--xfails FILE] [--strict-xfails] [--no-progress]
        [--shrink-seconds T] [--compile-cache DIR|off] [--data-per-program N] [--shard K/N] [--case-timeout T] [--distributed]
        [--force]
    python -m conformance hunt --minutes N [--suite sharded] [--report DIR] ...   (conformance.hunt)
    python -m conformance merge DIR... --out DIR   (conformance.engine.merge)
    python -m conformance bisect ...     (conformance.debug.cli)
    python -m conformance mutate ...     (conformance.engine.mutate)
    python -m conformance explain ...    (conformance.debug.explain.cli)
    python -m conformance check [--report FILE] SCRIPT.py [ARGS...]   (conformance.oracle.cli)
    python -m conformance export-bundle --out DIR --programs N [--seed S]   (conformance.export.write)
    python -m conformance run-bundle DIR [--report OUT]   (conformance.export.run)

`run` (and `merge`) exit 0 (AGREE) when every planned case ran and agreed (or is an expected
failure or unsupported on the platform), 1 (DISAGREE) on any disagreement or error, 2 on bad
arguments, a platform that cannot start or a report folder in use by another run, and 3
(INCOMPLETE) when some planned case did not run: the run was interrupted (SIGINT, SIGTERM,
SIGHUP: one line, the reports marked INCOMPLETE, the folder resumable with --resume) or a
distributed process was lost (`conformance.results`, docs/reports.md).
"""
from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
from typing import NamedTuple

# None of these loads JAX: `platform.configure` runs before it loads (each subcommand's own module
# is imported by name when the subcommand runs, `COMMANDS`).
from conformance import validation
from conformance.arguments import Parser as _Parser
from conformance.engine import distributed, preflight, runner
from conformance.engine.compile_cache import OFF, default_dir
from conformance.engine.plan import parse_shard
from conformance.engine.runner import (DEFAULT_CASE_TIMEOUT, DEFAULT_DATA_PER_PROGRAM, DEFAULT_EXAMPLES, MAX_EXAMPLES,
                                       SHRINK_SECONDS)
from conformance.report import prepare_report_dir, print_table
from conformance.report.lock import acquire
from conformance.report.results import EXIT_INCOMPLETE, EXIT_USAGE, exit_status
from conformance.suites import SUITES
from xla_backend import limits, platform


class Command(NamedTuple):
    """A subcommand: the function that runs it (`module:function`, called with the arguments after
    the subcommand's name), its help line, and whether the CPU platform gets its devices first."""

    target: str
    help: str
    configure_platform: bool = False


#: Every subcommand of `python -m conformance`, in --help order. The modules are imported when
#: their subcommand runs, after the platform is configured (JAX reads it once, when it loads).
COMMANDS = {
    "run": Command("conformance.cli:run_main",
                   "run the conformance suites (the default CPU run: 8 virtual devices)"),
    "hunt": Command("conformance.hunt:main", "draw random programs for N minutes, keep every distinct failure"),
    "merge": Command("conformance.engine.merge:main", "merge the report folders of a plan's shards into one"),
    "bisect": Command("conformance.debug.cli:main",
                      "find the first equation where XLA and refsim disagree (conformance.debug)", True),
    "mutate": Command("conformance.engine.mutate:main", "measure the suite's power against injected miscompiles"),
    "explain": Command("conformance.debug.explain.cli:main",
                       "which stage (lowering, compiler, backend) changed a reproducer's result", True),
    "check": Command("conformance.oracle.cli:main",
                     "run a script with its distributed JAX calls checked against refsim"),
    "export-bundle": Command("conformance.export.write:main",
                             "export drawn sharded programs (jax.export, with shardings) for another JAX to run"),
    "run-bundle": Command("conformance.export.run:main",
                          "run an export bundle under this JAX and compare it with refsim's expected outputs"),
}

_positive = validation.option("count", integer=True, low=1)
_devices = validation.device_count_option("--devices")
_seed = validation.option("--seed", integer=True, low=0, what="hypothesis and NumPy seeds are non-negative")
_seconds = validation.seconds_option("--shrink-seconds", zero=True, what="0: no shrinking")
_timeout = validation.seconds_option("--case-timeout")


def _shard(text: str) -> tuple:
    try:
        return parse_shard(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None




def _suite(text: str) -> str:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in SUITES + ("all",)]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(SUITES + ('all',))} (comma-separated)")
    return text


def _cores() -> int:
    """CPU cores this process may run on (the default number of worker processes)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _compile_cache(value: str | None) -> str | None:
    """The persistent compilation cache folder for `--compile-cache` (None for 'off')."""
    if value is None:
        return default_dir()
    return None if value.strip().lower() in OFF else value


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m conformance", description="Check refsim against XLA on the local platform.")
    sub = ap.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}", parser_class=_Parser)
    run = sub.add_parser("run", help=COMMANDS["run"].help)
    run.add_argument("--platform", default="cpu", help="JAX platform: cpu (default), cuda, rocm, tpu or a PJRT plugin")
    run.add_argument("--devices", type=_devices, default=None,
                     help="device count (virtual devices on CPU, default 8; other platforms and --distributed: "
                          "default every device)")
    run.add_argument("--examples", type=_positive, default=DEFAULT_EXAMPLES,
                     help=f"hypothesis draws per family (default {DEFAULT_EXAMPLES}, at most {MAX_EXAMPLES} without "
                          "--force); the run time scales with it")
    run.add_argument("--suite", type=_suite, default="all", help=f"one of {', '.join(SUITES)}, or all (default)")
    run.add_argument("--report", metavar="DIR", help="write results.jsonl, junit.xml, report.html and repros/ here")
    run.add_argument("--seed", type=_seed, default=0, help="seed of every draw, an int >= 0 (default 0)")
    run.add_argument("--processes", type=_positive, default=_cores(),
                     help=f"worker processes (default: one per CPU core, here {_cores()}); a case that crashes its worker (a fatal "
                     "XLA CHECK) is an error and a fresh worker runs the rest")
    run.add_argument("--resume", action="store_true", help="skip the cases already in DIR/results.jsonl")
    run.add_argument("--xfails", metavar="FILE", help="expected failures (default xfails/<platform>.txt)")
    run.add_argument("--strict-xfails", action="store_true",
                     help="stale or too-broad xfails entries fail the run (exit 1)")
    run.add_argument("--no-progress", action="store_true", help="no live progress bar")
    run.add_argument("--shrink-seconds", type=_seconds, default=SHRINK_SECONDS,
                     help=f"time to shrink each failure with hypothesis (default {SHRINK_SECONDS:g}; 0: no shrinking)")
    run.add_argument("--compile-cache", metavar="DIR|off", default=None,
                     help="JAX's persistent compilation cache, in a folder keyed on the content of JAX's, jaxlib's "
                          "and the plugins' files, so a rerun skips XLA's compiles (default: "
                          "$CONFORMANCE_COMPILE_CACHE or ~/.cache/refsim-conformance/xla; 'off': none)")
    run.add_argument("--data-per-program", type=_positive, default=DEFAULT_DATA_PER_PROGRAM, metavar="N",
                     help=f"data sets (special values, rounding data, random) each drawn program structure runs "
                          f"with on its one compiled executable (default {DEFAULT_DATA_PER_PROGRAM}; at least what "
                          "each suite draws)")
    run.add_argument("--shard", type=_shard, default=None, metavar="K/N",
                     help="run only shard K of N (plan positions K-1, K-1+N, ...); merge the N report folders "
                          "with `python -m conformance merge`")
    run.add_argument("--distributed", action="store_true",
                     help="one run over every process of a jax.distributed job (python -m xla_backend launch, "
                          "Slurm, Open MPI, TPU VM); process 0 writes the report")
    run.add_argument("--case-timeout", type=_timeout, default=None, metavar="T",
                     help=f"seconds a case may run before it is killed with its worker and recorded as timeout "
                          f"(default {DEFAULT_CASE_TIMEOUT:g}); with --distributed: seconds a process may take to "
                          "send a case's results before the run ends naming it (default 600)")
    run.add_argument("--force", action="store_true",
                     help="run even above this machine's ceilings: --processes (2 per CPU core, and what memory "
                          f"holds), --devices on CPU (what memory holds in every worker), --examples ({MAX_EXAMPLES})")
    for name, command in COMMANDS.items():
        if name != "run":  # each parses its own arguments
            sub.add_parser(name, help=command.help, add_help=False)
    return ap


def check_ceilings(args) -> None:
    """Refuse, before anything starts, a run that asks more of this machine than it holds: worker
    processes above 2 per CPU core or above what memory holds, virtual CPU devices above what
    memory holds in every worker (`xla_backend.limits`), draws per family above `MAX_EXAMPLES`.
    ValueError (`limits.AboveCeiling`) naming the value, the ceiling, why, and --force."""
    if args.force:
        return
    limits.check("--examples", args.examples, limits.Ceiling(
        MAX_EXAMPLES, f"the documented maximum of draws per family: the plan draws them all before the first case "
                      f"ends, each case runs all of its family's draws within one --case-timeout (default "
                      f"{DEFAULT_CASE_TIMEOUT:g} s), and the run time grows with them (the default 20 take about 5 "
                      "minutes on 2 CPU cores)"))
    if not args.distributed:  # a distributed run's processes and devices are its launcher's
        # on an accelerator --devices is a count to find (preflight), not one to create
        cpu = args.platform == "cpu"
        limits.check_run(processes=args.processes, devices=(args.devices or 8) if cpu else None, platform=args.platform)


def run_command(args, console=None) -> int:
    if args.distributed:
        return distributed.run_command(args, console, report_result)
    # The platform comes up once before any case (an unknown or broken platform is one line, exit 2);
    # an accelerator in a child process, so that this parent holds no accelerator its workers need. The
    # CPU has none to hold: it comes up here (milliseconds, where a child interpreter importing JAX
    # costs ~0.6 CPU-s on the 2 cores the workers are starting on).
    cpu = args.platform == "cpu"
    started = _start_workers(args) if cpu and args.processes else None   # they start up during the preflight
    try:
        try:
            hardware = preflight.check(args.platform, args.devices or (8 if cpu else None), in_process=cpu)
        except preflight.PreflightError as e:
            raise ValueError(f"--platform {args.platform}: " + " ".join(str(e).split())) from None
        devices = args.devices or (8 if cpu else hardware["device_count"])  # an accelerator: all its devices
        result = runner.run_options(run_options(args, devices=devices, console=console,
                                                plan_extra=preflight.plan_entries(hardware), started_workers=started))
    finally:
        if started is not None:
            started.close()   # the run took them over, or never began: stopped here
    return report_result(args, result, console)


def _start_workers(args):
    """The run's CPU worker processes, started now (`conformance.engine.workers.start`), so that
    their start-up (an interpreter importing JAX: seconds on a busy machine) overlaps with the
    platform preflight and the run's setup instead of delaying its first cases."""
    from conformance.engine import compile_cache, workers

    folder = _compile_cache(args.compile_cache)
    try:
        env = compile_cache.worker_environment(folder) if folder is not None else {}
    except ValueError:
        return None   # an unusable cache folder: the run's setup says so
    return workers.start(args.processes, platform=args.platform, devices=args.devices or 8,
                         run_task=runner.run_task, env=env)


def run_options(args, *, devices: int, console=None, plan_extra: dict | None = None, started_workers=None):
    """The `conformance.engine.runner.RunOptions` of parsed `run` arguments (`devices`: the count found)."""
    return runner.RunOptions(suite=args.suite, examples=args.examples, seed=args.seed, platform=args.platform,
                             devices=devices, report_dir=args.report, progress=not args.no_progress,
                             resume=args.resume, xfails=args.xfails, processes=args.processes,
                             compile_cache=_compile_cache(args.compile_cache),
                             shrink_seconds=args.shrink_seconds, console=console, strict_xfails=args.strict_xfails,
                             case_timeout=args.case_timeout or runner.DEFAULT_CASE_TIMEOUT,
                             shard=args.shard, plan_extra=plan_extra,
                             data_per_program=args.data_per_program, started_workers=started_workers)


def report_result(args, result, console=None) -> int:
    """Print the table, stale xfails, reproducers and where the report is; the exit status of the run."""
    print_table(result.summary, console, results=result.results)
    out = console.print if console is not None else print
    for text in result.summary.get("unused_xfails", ()):
        out(f"note: xfails entry {text} matched no case in this run (stale, or not drawn with this seed)")
    for text in result.summary.get("too_broad_xfails", ()):
        out(f"warning: xfails entry {text}")
    if result.summary.get("strict_xfail_problems"):
        out(f"--strict-xfails: {len(result.summary['strict_xfail_problems'])} stale or too-broad xfails entr"
            f"{'y' if len(result.summary['strict_xfail_problems']) == 1 else 'ies'} fail the run")
    from conformance.engine import compile_cache

    events = result.summary.get("compile_cache_events")
    if events is not None:
        out(compile_cache.use_line(events))
        cache_note = compile_cache.summary_line(events)
        if cache_note:
            out(f"note: {cache_note}")
    repros = [r for r in result.results if r.repro_path]
    for r in repros:
        out(f"reproducer for {r.case_id}: python {r.repro_path}")
    if args.report:
        out(f"report: {args.report}/report.html, {args.report}/junit.xml, {args.report}/results.jsonl")
    else:
        out("no report written: pass --report DIR for results.jsonl, junit.xml, report.html and reproducers")
    if not result.complete and args.report:
        out(f"the report does not cover the plan; continue it with: {_resume_command(args)}")
    return exit_status(result.summary)


def _resume_command(args) -> str:
    """The command line that continues this run's report folder."""
    argv = list(getattr(args, "argv", None) or ["--report", str(args.report)])  # the arguments after `run`
    return shlex.join(["python", "-m", "conformance", "run"] + argv + ([] if "--resume" in argv else ["--resume"]))


def _interrupted(args, stop) -> int:
    """One line for a run stopped by a signal (no traceback); its exit status (INCOMPLETE)."""
    result = stop.result
    if result is not None and result.complete:  # the signal came after the last case: the verdict stands
        return report_result(args, result)
    if result is None:
        what = "before any case was recorded"
    else:
        what = f"after {len(result.results)} of {result.summary.get('planned_cases', '?')} cases"
    if not args.report:
        where = "nothing was recorded (no --report folder)"
    elif result is None:
        where = f"continue with: {_resume_command(args)}"
    else:
        where = (f"{args.report} is marked INCOMPLETE ({result.summary.get('missing_cases', '?')} cases missing); "
                 f"continue with: {_resume_command(args)}")
    sys.stdout.flush()
    print(f"conformance run: interrupted by {stop.signal} {what}; {where}", file=sys.stderr)
    return EXIT_INCOMPLETE


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = COMMANDS.get(argv[0]) if argv else None
    if command is None:  # no subcommand, --help, or an unknown one: the parser says which there are
        ap = build_parser()
        ap.parse_args(argv)
        ap.print_help()
        return 2
    if command.configure_platform:
        # As `python -m conformance.debug`: reproducers name device ids up to their mesh size, so
        # the CPU platform gets XLA_BACKEND_DEVICES (default 8) devices before JAX starts.
        platform.configure()
    module, _, function = command.target.partition(":")
    return int(getattr(importlib.import_module(module), function)(argv[1:]) or 0)


def run_main(argv) -> int:
    """`python -m conformance run ARGS`: parse ARGS, run, report; the exit status."""
    ap = build_parser()
    args = ap.parse_args(["run", *argv])
    if args.resume and not args.report:
        ap.exit(2, f"{ap.prog} run: error: --resume needs --report DIR (the folder whose results.jsonl lists "
                   "finished cases)\n")
    args.argv = argv
    try:
        check_ceilings(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with runner.interruptible():  # SIGINT, SIGTERM, SIGHUP: one line, the reports INCOMPLETE
            lock = None
            if args.report and not args.distributed:
                # The folder is this run's from now on: a second run fails here at once, before
                # the platform check (a distributed run's process 0 takes it in the runner).
                prepare_report_dir(args.report)
                lock = acquire(args.report)
                if lock.took_over:
                    print(lock.note(), file=sys.stderr)
            try:
                return run_command(args)
            finally:
                if lock is not None:
                    lock.release()
    except runner.Interrupted as stop:
        return _interrupted(args, stop)
    except (ValueError, OSError) as e:  # bad arguments found after parsing (xfails file, report folder, ...)
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
