"""`python -m conformance hunt`: draw random programs for N minutes and keep every distinct failure.

    python -m conformance hunt --minutes N [--suite sharded] [--report DIR] [--seed S]
        [--processes K] [--xfails FILE] [--devices N] [--database DIR] [--shrink-seconds T]
        [--case-timeout T]

Unlike `run` (a fixed plan, derandomized by its seed), a hunt draws batches of programs from the
suite's strategy with fresh random seeds (``--seed`` makes a hunt repeatable) until the time is
up, runs them in worker processes that survive XLA's fatal CHECKs, and writes every program's
result to ``DIR/results.jsonl`` (with its ops, sharding patterns, transform, axis types and
partitioner, for `conformance.coverage`). Each failure is classified by a signature
(stage, op, error class):

* stage: ``trace`` (JAX raised while tracing a well-typed program), ``refsim`` (a refsim rule
  raised), ``lowering`` / ``compile`` / ``runtime`` (XLA's side raised there), ``crash`` (the
  worker died: a fatal CHECK), ``hang`` (killed after ``--case-timeout``), or ``mismatch:STAGE``
  (values differ; STAGE is `conformance.explain`'s verdict: lowering, compiler, backend);
* op: the op `explain` names, XLA's source file of a CHECK or RET_CHECK, the primitive a JAX
  lowering error names (jax 0.12: "... for primitive reduce_sum"), or else the ops of the program;
* error class: the exception class and its message's first line (digits dropped), the CHECK
  that failed, or the element classes of a mismatch.

The first failure of each signature is shrunk (a mismatch in its worker; an exception or crash
by running the cut-down variants of `conformance.suites.sharded.candidates` in fresh processes)
and written at once to ``DIR/findings/`` with its reproducer; failing programs are also kept in
a hypothesis example database (``--database``, default ``DIR/examples``), whose programs the next
hunt with that database runs first. SIGINT / SIGTERM end the hunt cleanly: cases in flight
finish, the reports are written and ``DIR/hunt.json`` says ``"partial": true``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

from hypothesis.database import DirectoryBasedExampleDatabase

import refsim
from conformance.cli import _cores, _Parser, _positive, _seconds, _seed, _timeout
from conformance.engine import runner, workers
from conformance.report import open_report_dir, prepare_report_dir, timing
from conformance.report.results import CaseResult, Failure, summarize
from conformance.suites import base
from conformance.suites import sharded as suite_mod
from conformance.suites.base import ProgramTask
from conformance.suites.sharded import shrink_case
from conformance.verdict import xfails as xfails_mod
from xla_backend import platform as xplat

# None of these loads JAX (the worker processes and `--check` configure the platform first).

__all__ = ["Finding", "HuntResult", "check_in_subprocess", "hunt", "main", "signature"]

DB_KEY = b"conformance-hunt-failing-programs"
BATCH = 8
SHARDING_OPS = ("with_sharding_constraint", "reshard")


@dataclasses.dataclass
class Finding:
    """One distinct failure: its signature, how often it was seen, and where its reproducer is."""

    stage: str
    op: str
    error: str
    count: int
    case_id: str
    status: str
    path: str | None = None
    message: str = ""


@dataclasses.dataclass
class HuntResult:
    """What a hunt did: programs run, minutes, whether it was cut short, and the distinct failures."""

    programs: int
    minutes: float
    partial: bool
    findings: list
    report_dir: str | None
    generator_errors: list = dataclasses.field(default_factory=list)


# -- classifying a result -------------------------------------------------------------------------
def _key(text: str) -> str:
    """A message's first line without numbers and addresses, for grouping failures."""
    line = next((ln for ln in str(text).splitlines() if ln.strip()), "")
    line = re.sub(r"0x[0-9a-f]+", "", line)
    line = re.sub(r"\d+", "N", line)
    return line.strip()[:100]


def _program_ops(case) -> str:
    ops = [op for op, _ in getattr(case, "op_patterns", ()) if op not in SHARDING_OPS]
    return "+".join(dict.fromkeys(ops)) or "-"


def signature(result, case=None) -> tuple | None:
    """(stage, op, error class) of a failing `CaseResult` (None for a pass / xfail / unsupported)."""
    d = result.details
    ops = _program_ops(case) if case is not None else "-"
    failure = d.signature or {}
    if result.status == "fail" or result.status == "error" and failure.get("kind") == "mismatch":
        # (an "error" mismatch: a listed case that differs otherwise than its xfails entry says)
        st = d.stage or {}
        classes = ",".join(failure.get("classes") or failure.get("layout") or ["value"])
        return (f"mismatch:{st.get('diverged_in') or 'unlocalised'}", st.get("op") or ops, classes)
    if result.status == "timeout":
        return ("hang", ops, "timeout")
    if result.status != "error":
        return None
    if d.worker_exit is not None:
        tail = (d.fatal_line or "") + "\n" + (d.stderr_tail or "")
        check = (re.search(r"(Check failed:[^\n]*|RET_CHECK failure[^\n]*)", tail)
                 or re.search(r"([A-Za-z_]+\.(?:cc|h):\d+\][^\n]*)", tail))
        where = re.search(r"([a-z_]+\.(?:cc|h)):\d+", tail)
        return ("crash", where.group(1) if where else ops, _key(check.group(1) if check else d.worker_exit))
    side = failure.get("side", "unknown")
    exc = failure.get("exception") or d.exception_type or "Exception"
    tb = d.traceback or ""
    if side == "refsim":
        stage = "refsim" if re.search(r"refsim/interpreter/(rules|core\.py)", tb) else "trace"
    elif side == "xla" and "Cannot lower jaxpr" in (failure.get("message") or ""):
        stage = "lowering"
    elif side == "xla":
        # the innermost frame JAX shows says where it raised: its own frames are filtered out, so a
        # lowering error surfaces at the project's `.lower(` call even though a compile call is outside it
        frames = re.findall(r'File "[^"]*", line \d+, in \w+\n\s*(.*)', tb)
        innermost = frames[-1] if frames else ""
        stage = ("runtime" if "timed_run" in tb else "lowering" if ".lower(" in innermost
                 else "compile" if ".compile()" in tb or "compiled(" in tb else "lowering" if "lower" in tb else "xla")
    else:
        stage = side
    msg = failure.get("message") or result.message
    # where: XLA's source file, else the primitive JAX names (0.12's lowering errors do), else the program's ops
    where = re.search(r"([a-z_]+\.cc):\d+", msg) or re.search(r"for primitive (\w+)", msg)
    return (stage, where.group(1) if where else ops, f"{exc}: {_key(msg)}")


# -- running one case in a fresh process (shrinking exceptions and crashes) ------------------------
def check_in_subprocess(case, devices: int = 8, timeout: float = 300.0, *, with_xfails: bool = False) -> tuple | None:
    """The signature of `case` run alone in a fresh Python process (None when it passes, or, with
    `with_xfails`, fails as the CPU xfails file expects): a fatal CHECK in XLA kills only that process."""
    with tempfile.TemporaryDirectory(prefix="conformance-hunt-") as tmp:
        path = os.path.join(tmp, "case.pkl")
        with open(path, "wb") as fh:
            pickle.dump(case, fh)
        env = dict(os.environ, XLA_BACKEND_DEVICES=str(devices))
        try:
            p = subprocess.run([sys.executable, "-m", "conformance.hunt", "--check", path]
                               + (["--xfails"] if with_xfails else []), capture_output=True,
                               text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return ("hang", _program_ops(case), "timeout")
        for line in reversed(p.stdout.splitlines()):
            if line.startswith("SIGNATURE "):
                sig = json.loads(line[len("SIGNATURE "):])
                return tuple(sig) if sig else None

        how = f"killed by signal {-p.returncode}" if p.returncode < 0 else f"exit code {p.returncode}"
        res = CaseResult(case_id=case.case_id, suite="sharded", family=case.family, dtype=case.dtype, status="error",
                         details=Failure(worker_exit=how, stderr_tail="\n".join(p.stderr.splitlines()[-20:]),
                                         fatal_line=next((ln for ln in reversed(p.stderr.splitlines())
                                                          if re.match(r"F\d{4} .*\.(cc|h):\d+\]", ln)), "")))
        return signature(res, case)


def _check_main(path: str, with_xfails: bool = False) -> int:
    """`--check FILE [--xfails]`: run the pickled case once (no shrinking) and print its signature
    (with the platform's xfails applied when asked: a known bug's signature is then null)."""
    xplat.configure()

    with open(path, "rb") as fh:
        case = pickle.load(fh)
    task = ProgramTask(case.case_id, "sharded", case.family, case.dtype, [case], None)
    entry = xfails_mod.load(None, platform="cpu").lookup(case.case_id) if with_xfails else None
    with tempfile.TemporaryDirectory() as tmp:
        res = runner.run_task(task, None, entry, repro_dir=tmp, shrink_seconds=0)
    print("SIGNATURE " + json.dumps(signature(res, case)), flush=True)
    return 0


def _shrink_out_of_process(case, sig: tuple, devices: int, seconds: float):
    """`case` cut down (`conformance.suites.sharded.shrink_case`) while a fresh process running
    the variant still fails with the same stage and error class."""
    def same(cand) -> bool:
        got = check_in_subprocess(cand, devices, timeout=max(30.0, seconds))
        return got is not None and got[0] == sig[0] and got[2] == sig[2]

    return shrink_case(case, same, seconds)


# -- the hunt -------------------------------------------------------------------------------------
def _reproducer(case, path: str) -> None:
    """Write `case`'s reproducer: refsim's values embedded, or (refsim cannot run it) none, so the
    script shows JAX's own error."""
    try:
        expected = case.run(refsim)
        tols = case.tolerances()
    except Exception:  # noqa: BLE001 - a tracing error: the script reproduces it by running the program
        expected, tols = [], []
    text = case.repro(expected=expected, tolerances=tols)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


class _Stop:
    """SIGINT / SIGTERM: the first asks the hunt to stop drawing and finish; the second interrupts."""

    def __init__(self):
        self.asked = False
        self._old = {}

    def __enter__(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


def hunt(*, minutes: float, suite: str = "sharded", report_dir=None, seed: int | None = None, processes: int = 1,
         xfails=None, devices: int = 8, platform: str = "cpu", database=None, shrink_seconds: float = 60.0,
         case_timeout: float = 300.0, out=print) -> HuntResult:
    """Draw and run programs of `suite` for `minutes`; return the distinct failures (see the module)."""
    if suite != "sharded":
        raise ValueError(f"suite={suite!r}: hunting draws from a suite's strategy; 'sharded' is the one built "
                         "for it.")
    if not minutes > 0:
        raise ValueError(f"minutes={minutes!r}; pass a positive number of minutes.")
    xplat.configure(platform, devices)

    report_dir = report_dir or tempfile.mkdtemp(prefix="conformance-hunt-")
    prepare_report_dir(report_dir)
    findings_dir = os.path.join(report_dir, "findings")
    os.makedirs(findings_dir, exist_ok=True)
    db = DirectoryBasedExampleDatabase(database or os.path.join(report_dir, "examples"))
    xf = xfails if isinstance(xfails, xfails_mod.XfailList) else xfails_mod.load(xfails, platform=platform)
    master = random.Random(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))
    deadline = time.monotonic() + minutes * 60
    t0 = time.perf_counter()
    by_id: dict = {}
    stop = _Stop()
    counts = {"sent": 0, "done": 0}
    generator_errors: list = []

    def batch_tasks(cases, s):
        tasks = base.group_tasks("sharded", cases, seed=s, shrink_of=lambda c: ("sharded", c.family, c.dtype),
                                 variants=len(suite_mod.DATA), data=suite_mod.DATA)
        for t in tasks:
            by_id[t.case_id] = t
        counts["sent"] += len(tasks)
        return [(t, xf.lookup(t.case_id)) for t in tasks]

    def feed():
        replay = []
        for blob in db.fetch(DB_KEY):
            try:
                replay.append(pickle.loads(blob))
            except Exception:  # noqa: BLE001 - an entry of another version: drop it
                db.delete(DB_KEY, blob)
        if replay:
            out(f"replaying {len(replay)} failing program(s) from the example database first")
            yield batch_tasks(replay, 0)
        strategy = suite_mod.strategy("sharded", None, devices)
        while not stop.asked and time.monotonic() < deadline:
            if counts["sent"] - counts["done"] > 2 * processes:
                # the workers are busy: draw the next batch when they have taken most of this one
                time.sleep(0.05)
                yield []
                continue
            s = master.randrange(2 ** 32)
            try:
                cases = base.draw(strategy, BATCH, s)
            except Exception as e:  # noqa: BLE001 - a generator defect is a finding, not the hunt's end
                generator_errors.append(f"seed {s}: {type(e).__name__}: {e}")
                out(f"the strategy failed to draw a batch (seed {s}): {type(e).__name__}: {str(e).splitlines()[0]}")
                continue
            yield batch_tasks(cases, s)

    plan = dict(platform=platform, devices=devices, suite=suite, seed=seed, mode="hunt", minutes=minutes,
                processes=processes, xfails=xf.source, **runner._versions())
    reporters = open_report_dir(report_dir)
    for r in reporters:
        r.start(dict(plan, cases=0))
    results, found = [], {}
    opts = dict(repro_dir=os.path.join(report_dir, "repros"), devices=devices, shrink_seconds=shrink_seconds, seed=0)
    interrupted = False
    with stop:
        try:
            for res in workers.run_in_workers([], run_task=runner.run_task, write_repro=runner.write_repro,
                                              processes=processes, platform=platform, devices=devices,
                                              opts=opts, case_timeout=case_timeout, more=feed()):
                counts["done"] += 1
                task = by_id.get(res.case_id)
                case = task.variants[0] if task is not None else None
                if case is not None:
                    res.details.program = {
                        "ops": [list(p) for p in case.op_patterns], "transform": case.transform,
                        "axis_types": case.axis_types, "partitioner": case.partitioner,
                        "mesh": list(case.mesh.axis_sizes)}
                results.append(res)
                for r in reporters:
                    r.case_finished(res)
                sig = signature(res, case)
                if sig is None:
                    continue
                if sig in found:
                    found[sig].count += 1
                    continue
                found[sig] = _record(sig, res, case, db, findings_dir, devices, shrink_seconds, out)
        except KeyboardInterrupt:
            interrupted = True
    partial = stop.asked or interrupted
    wall = time.perf_counter() - t0
    summary = summarize(results, wall_seconds=wall, compile_seconds=sum(r.compile_seconds for r in results))
    runner._xfail_summary(summary, xf, results, False, complete=False)
    summary["plan"] = dict(plan, cases=len(results))
    summary["phases"] = timing.totals(results, 0.0)
    summary["hunt"] = {"partial": partial, "programs": len(results), "minutes": wall / 60,
                       "findings": [dataclasses.asdict(f) for f in found.values()],
                       "generator_errors": generator_errors}
    for r in reporters:
        r.finish(summary)
    result = HuntResult(len(results), wall / 60, partial, list(found.values()), report_dir, generator_errors)
    with open(os.path.join(report_dir, "hunt.json"), "w", encoding="utf-8") as fh:
        json.dump(summary["hunt"] | {"report_dir": report_dir, "plan": summary["plan"]}, fh, indent=1, default=str)
    return result


def _record(sig, res, case, db, findings_dir, devices, shrink_seconds, out) -> Finding:
    """A new distinct failure: shrink it (exceptions and crashes out of process), write its
    reproducer to `findings_dir` now, keep the program in the example database."""
    stage, op, error = sig
    n = len(os.listdir(findings_dir)) // 2 + 1
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{n:03d}-{stage}-{op}")[:80]
    path = os.path.join(findings_dir, slug + ".py")
    note = ""
    if case is not None:
        small = case
        if res.status == "fail" and res.repro_path:
            with open(res.repro_path, encoding="utf-8") as src, open(path, "w", encoding="utf-8") as dst:
                dst.write(src.read())
        else:
            if shrink_seconds > 0:
                small = _shrink_out_of_process(case, sig, devices, shrink_seconds)
                note = "" if small is case else f"shrunk to {small.case_id}"
            _reproducer(small, path)
        db.save(DB_KEY, pickle.dumps(small))
    else:
        path = None
    with open(os.path.join(findings_dir, slug + ".txt"), "w", encoding="utf-8") as fh:
        fh.write(f"stage: {stage}\nop: {op}\nerror: {error}\ncase: {res.case_id}\nstatus: {res.status}\n{note}\n\n"
                 f"{res.message}\n")
    out(f"new failure [{stage}] {op}: {error}\n  case {res.case_id}\n  reproducer: {path}")
    return Finding(stage, op, error, 1, res.case_id, res.status, path, res.message.splitlines()[0] if res.message else "")


def print_findings(result: HuntResult, out=print) -> None:
    """The closing table: one row per distinct failure."""
    state = "partial hunt (stopped by a signal)" if result.partial else "hunt"
    out(f"{state}: {result.programs} programs in {result.minutes:.1f} min, {len(result.findings)} distinct failure(s)")
    if result.findings:
        out(f"{'stage':<24} {'count':>5}  {'op':<28} error")
        for f in sorted(result.findings, key=lambda f: (f.stage, f.op)):
            out(f"{f.stage:<24} {f.count:>5}  {f.op[:28]:<28} {f.error[:90]}")
            if f.path:
                out(f"{'':<24} {'':>5}  reproducer: {f.path}")
    for err in result.generator_errors:
        out(f"strategy defect (a batch could not be drawn): {err.splitlines()[0]}")
    out(f"report: {result.report_dir}/results.jsonl, {result.report_dir}/findings/, {result.report_dir}/hunt.json")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m conformance hunt",
                 description="Draw random programs for N minutes; keep every distinct failure with its reproducer.")
    ap.add_argument("--minutes", type=float, required=True, help="how long to hunt")
    ap.add_argument("--suite", default="sharded", choices=["sharded"], help="the suite whose strategy draws programs")
    ap.add_argument("--report", metavar="DIR", help="results.jsonl, junit.xml, report.html, findings/, hunt.json")
    ap.add_argument("--seed", type=_seed, default=None, help="seed of the draws (default: random)")
    ap.add_argument("--processes", type=_positive, default=_cores(), help="worker processes (default: one per core)")
    ap.add_argument("--xfails", metavar="FILE", help="expected failures (default xfails/<platform>.txt)")
    ap.add_argument("--devices", type=_positive, default=8, help="virtual CPU devices (default 8)")
    ap.add_argument("--platform", default="cpu", help="JAX platform (default cpu)")
    ap.add_argument("--database", metavar="DIR", help="hypothesis example database of failing programs "
                                                     "(default DIR/examples)")
    ap.add_argument("--shrink-seconds", type=_seconds, default=60.0, help="time to shrink each new failure")
    ap.add_argument("--case-timeout", type=_timeout, default=300.0, help="seconds before a case counts as a hang")
    return ap


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--check"]:
        return _check_main(argv[1], "--xfails" in argv[2:])
    args = build_parser().parse_args(argv)
    if not args.minutes > 0:
        print("error: --minutes must be > 0", file=sys.stderr)
        return 2
    try:
        result = hunt(minutes=args.minutes, suite=args.suite, report_dir=args.report, seed=args.seed,
                      processes=args.processes, xfails=args.xfails, devices=args.devices, platform=args.platform,
                      database=args.database, shrink_seconds=args.shrink_seconds, case_timeout=args.case_timeout)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_findings(result)
    return 1 if result.findings or result.generator_errors else 0


if __name__ == "__main__":
    sys.exit(main())
