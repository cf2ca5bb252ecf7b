"""Conformance tasks in worker processes that may die: a crash is one case's result, not the run's end.

A fatal CHECK in XLA (or a segfault in a PJRT plugin) aborts the process it happens in. Each
worker runs one task at a time and the parent knows which task every worker holds, so when a
worker dies its task is recorded as status "error" with the reason (the signal or exit code and
the last lines the worker wrote to stderr while running it) and a fresh worker takes the next
task. Workers are started with "spawn" (no forked XLA state) and write their stderr to a log
file, which keeps XLA's warnings off the progress bar and lets the parent read a crash's last words.
A worker marks in that log when it takes a task and the task marks each of its steps (`step`: refsim,
XLA, compare, ...), so the record of a death names the step that was running and XLA's fatal line
written in it: an ``aborts(/regex/)`` xfails entry accepts only a SIGABRT in XLA's step with a
fatal line it matches (`conformance.verdict.xfails`).

A task that runs longer than `case_timeout` seconds (counted from when its worker is ready, so
a worker's start-up is not charged to it) is a hang: a deadlocked XLA rendezvous never returns
to Python, so the parent kills that worker, records the task as status "timeout" with its
layout and a reproducer, and a fresh worker takes the next task. `fault` names a
`conformance.faults` fault every worker runs its tasks under (the mutation run).

`more` streams a plan that is still being drawn: the workers are started first (they import
JAX while the parent draws; `start` starts them earlier still, while the caller does other
work), and between chunks the parent only polls the workers; with `more_ready` (a `Drawn`: a
thread draws the chunks) it takes results and sends tasks the moment they come, whatever the
draw is doing. A worker told to stop exits at once, without the interpreter's teardown. Each worker
holds `QUEUE_DEPTH` tasks (the one it runs and the next, already in its pipe), so a worker that
finishes starts its next task at once, even while the parent is drawing; a task queued behind one
that kills or hangs its worker was never started and goes back to the front of the queue.

What a worker runs is given, not imported: `run_task` (the runner's, `run_task(task, xla, entry,
**opts) -> CaseResult`, sent to each worker by reference) and `write_repro` (the parent writes a
timed-out task's reproducer with it), so this module sits below the runner that uses it.
"""
from __future__ import annotations

import os
import re
import sys
import collections
import contextlib
import multiprocessing
import tempfile
import time
import traceback
from multiprocessing import connection

import refsim
from conformance import faults
from conformance.engine import compile_cache
from conformance.report.failure import Failure, case_failure
from conformance.report.results import CaseResult
from conformance.verdict import xfails
from xla_backend import platform as xplat

__all__ = ["STDERR_TAIL_LINES", "Drawn", "Started", "note", "run_in_workers", "start", "step"]

STDERR_TAIL_LINES = 20
# Tasks a worker holds: the one it runs and the next, already in its pipe, so it never waits for
# the parent (which may be drawing the next family). A task sent behind one that kills or hangs
# its worker was never started: it goes back to the front of the queue.
QUEUE_DEPTH = 2
_READY = "ready"      # a worker's first message: it imported and configured the platform
_PENDING = object()   # receive(): nothing finished yet
# A JSON-lines file each event of a worker run is appended to (debugging where workers wait:
# `python -m bench.timeline FILE` sums it up); unset: none is written.
TIMELINE_ENV = "CONFORMANCE_TIMELINE"


def mark(event: str, **info) -> None:
    """Append `event` (wall-clock time, pid, `info`) to ``$CONFORMANCE_TIMELINE`` if it is set."""
    path = os.environ.get(TIMELINE_ENV)
    if not path:
        return
    import json

    line = json.dumps(dict(t=time.time(), pid=os.getpid(), event=event, **info)) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# A line a task writes to its worker's stderr log before work that may abort the process (an XLA CHECK
# kills the worker with no Python exception); the parent's record of that death quotes it.
NOTE_PREFIX = "conformance-note: "
# A line a worker writes when it takes a task (``task CASE_ID``) and the task writes before each of its
# steps (`step`): the record of a death names the step that was running, and an ``aborts`` xfails entry
# accepts only a death in XLA's (`conformance.verdict.xfails.XLA_STEP`).
STEP_PREFIX = "conformance-step: "
_IN_WORKER = [False]


def in_worker() -> bool:
    """True in a worker process of `run_in_workers` (where a case may abort the process)."""
    return _IN_WORKER[0]


def note(text: str) -> None:
    """Leave `text` in this worker's stderr log, for the record of its death should the next step abort
    the process (`Worker.death_result` quotes every note of the task); nothing outside a worker."""
    if not _IN_WORKER[0]:
        return
    line = NOTE_PREFIX + " ".join(str(text).split()) + "\n"
    with contextlib.suppress(OSError):
        os.write(2, line.encode("utf-8", "replace"))


def step(name: str) -> None:
    """Mark in this worker's stderr log that the task now runs step `name` ("refsim", "xla" while XLA
    compiles or runs the case, "compare", ...: `conformance.verdict.xfails` names them); should the
    process die, `_Worker.death_result` says which step was running and reads XLA's fatal line from
    that step only. Nothing outside a worker."""
    if not _IN_WORKER[0]:
        return
    with contextlib.suppress(OSError):
        os.write(2, f"{STEP_PREFIX}{name}\n".encode("utf-8", "replace"))


def run_in_workers(todo, *, run_task, write_repro, processes: int, platform: str, devices: int, xla=None,
                   opts: dict, case_timeout: float | None = None, fault: str | None = None, more=None,
                   more_ready=None, started: "Started | None" = None):
    """Yield a CaseResult per (task, xfails entry) of `todo` as it finishes in one of `processes`
    workers; a task whose worker dies yields an "error" result naming the signal or exit code,
    one still running after `case_timeout` seconds a "timeout" result (its worker is killed).

    more: an iterator of further lists of (task, entry), run after `todo` in order; the next
    list is taken whenever no worker has a result to hand back, so drawing them (the work of
    `next`) overlaps with running the tasks already taken. An exception from it stops the
    workers and propagates. more_ready: where `more`'s lists are drawn by another thread (a
    `Drawn`), that `Drawn`: `next(more)` is then only called once its next list is there, and
    meanwhile the loop waits on the workers and on it alike, so a result is taken (and the worker's
    next task sent) the moment it comes, however long a draw takes. started: workers started
    ahead by `start` (with the same platform, devices, xla, fault and run_task), taken over here:
    the run begins with workers that have imported JAX already.

    `xla` (None: xla_backend) is pickled to every worker, so it must be a picklable object;
    `run_task` too (a module-level function pickles by name), `write_repro(task, case, repro_dir)`
    runs here.
    """
    ctx = multiprocessing.get_context("spawn")
    pending = collections.deque(todo)  # popleft() takes tasks in plan order
    if started is not None:
        logs, workers = started.take()
    else:
        logs, workers = tempfile.mkdtemp(prefix="conformance-workers-"), []
    spawned = len(workers)   # the log file names' numbers
    mark("workers_start")
    try:
        while pending or more is not None or any(w.job is not None for w in workers):
            while (pending or more is not None) and len(workers) < processes:
                mark("spawn")
                workers.append(_Worker(ctx, os.path.join(logs, f"worker-{spawned}.stderr"), platform, devices, xla,
                                       fault, run_task))
                spawned += 1
            _top_up(workers, pending, opts)
            busy = [w for w in workers if w.job is not None]
            drawing = more is not None and more_ready is not None and not more_ready.ready()
            # while tasks are still to be drawn here, only look (timeout 0): drawing is the next thing to
            # do; while another thread draws them, wait for a result or for the next list, whichever first
            timeout = 0 if more is not None and not drawing else _next_deadline(busy, case_timeout)
            ready = set(connection.wait([w.conn for w in busy] + [w.proc.sentinel for w in busy]
                                        + ([more_ready] if drawing else []), timeout=timeout))
            for w in busy:
                if case_timeout is not None and w.overdue(case_timeout) and w.conn not in ready:
                    result = w.timeout_result(case_timeout, opts, write_repro)
                    pending.extendleft(reversed(w.queued()))   # sent behind the hung task, never started
                    w.kill()
                    workers.remove(w)
                    yield result
                    continue
                if w.conn not in ready and w.proc.sentinel not in ready:
                    continue
                result = w.receive()
                if result is _PENDING:
                    continue
                if result is None:  # the worker died with its task in flight
                    if not w.ready:
                        raise RuntimeError(w.startup_failure())
                    result = w.death_result()
                    pending.extendleft(reversed(w.queued()))   # sent behind the task that killed it
                    w.close()
                    workers.remove(w)
                else:  # the worker's next tasks go out before the reporters see this result
                    _top_up(workers, pending, opts)
                yield result
            if more is not None and (more_ready is None or more_ready.ready()):
                mark("draw")
                chunk = next(more, None)
                mark("drawn", tasks=0 if chunk is None else len(chunk))
                if chunk is None:
                    more = None
                else:
                    pending.extend(chunk)
    finally:
        close = getattr(more, "close", None)
        if close is not None:
            close()   # a generator stopped early: its own cleanup (a drawing thread told to stop) runs now
        for w in workers:  # all at once: each worker's exit (JAX's teardown) overlaps the others'
            w.ask_to_stop()
        for w in workers:
            w.stop()
        _remove_logs(logs)


def _remove_logs(logs: str) -> None:
    for name in os.listdir(logs):
        os.unlink(os.path.join(logs, name))
    os.rmdir(logs)


def start(processes: int, *, platform: str, devices: int, run_task, xla=None, fault: str | None = None,
          env: dict | None = None) -> "Started":
    """Start `processes` workers now, for a `run_in_workers(started=...)` to come: their start-up
    (a Python interpreter importing JAX and the suites, seconds on a busy machine) overlaps with
    what this process does meanwhile (the command line's platform preflight, the run's setup), so
    the run's workers take their first task the moment it is drawn. Arguments as `run_in_workers`'s;
    env: environment variables the workers get beside this process's (the compile cache's,
    `conformance.engine.compile_cache.worker_environment`, which this process sets only later). `Started.close`
    stops them if no run takes them over."""
    ctx = multiprocessing.get_context("spawn")
    logs = tempfile.mkdtemp(prefix="conformance-workers-")
    mark("spawn_early")
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})   # a spawned worker's environment is this process's at its start
    try:
        return Started(logs, [_Worker(ctx, os.path.join(logs, f"worker-{i}.stderr"), platform, devices, xla, fault,
                                      run_task) for i in range(processes)])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Started:
    """Workers started ahead of their run (`start`): `run_in_workers(started=...)` takes them over,
    `close` stops them where no run did (the run was refused before it began)."""

    def __init__(self, logs: str, workers: list):
        self._logs, self._workers = logs, workers

    def take(self) -> tuple[str, list]:
        """(log folder, workers), handed over once: the caller stops them and removes the folder."""
        if self._workers is None:
            raise RuntimeError("these started workers were taken over by a run already; start others for this one.")
        out = (self._logs, self._workers)
        self._workers = None
        return out

    def close(self) -> None:
        """Stop the workers if no run took them over (nothing when one did)."""
        if self._workers is None:
            return
        logs, workers = self.take()
        for w in workers:
            w.ask_to_stop()
        for w in workers:
            w.stop()
        _remove_logs(logs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Drawn:
    """The lists of an iterator (a plan's chunks), drawn ahead by a thread of this process.

    `run_in_workers(more_ready=...)` waits on it (`fileno`) beside its workers and takes the next
    list only when `ready`, so the parent hands a worker its next task the moment the worker sends
    a result, even in the middle of a long draw (a family of hypothesis draws): no worker waits
    while the parent draws. Iterating it gives the lists in order
    (blocking until the next is drawn); an exception of the drawing is raised there. `close` stops
    the thread after the list it is drawing (a daemon thread: it never holds the process open).
    """

    _END = object()

    def __init__(self, chunks):
        import queue
        import socket
        import threading

        self._queue = queue.SimpleQueue()
        self._rsock, self._wsock = socket.socketpair()   # one byte per list drawn: what `fileno` signals
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._draw, args=(chunks,), name="conformance-draw", daemon=True)
        self._thread.start()

    def _draw(self, chunks) -> None:
        try:
            for chunk in chunks:
                if self._stop.is_set():
                    return
                self._put((chunk, None))
        except BaseException as e:  # noqa: BLE001 - raised in the thread that takes the next list
            self._put((None, e))
            return
        self._put((self._END, None))

    def _put(self, item) -> None:
        self._queue.put(item)
        try:
            self._wsock.send(b"x")
        except OSError:  # closed: nobody waits any more
            pass

    def fileno(self) -> int:
        return self._rsock.fileno()

    def ready(self) -> bool:
        """Whether the next list (or the end, or an exception) is there: `next` will not wait."""
        return not self._queue.empty()

    def __iter__(self):
        return self

    def __next__(self):
        item, exc = self._queue.get()
        try:
            self._rsock.recv(1)
        except OSError:
            pass
        if exc is not None:
            self.close()
            raise exc
        if item is self._END:
            self.close()
            raise StopIteration
        return item

    def close(self) -> None:
        self._stop.set()
        self._rsock.close()
        self._wsock.close()


def _top_up(workers: list, pending, opts) -> None:
    """Send tasks in plan order until every worker holds `QUEUE_DEPTH` (or none are left): a
    worker starts its next task the moment it sends a result, even while the parent is drawing."""
    for depth in range(1, QUEUE_DEPTH + 1):
        for w in workers:
            if pending and len(w.jobs) < depth:
                w.send(pending.popleft(), opts)


def _next_deadline(busy: list, case_timeout: float | None) -> float | None:
    """Seconds until the first running task's time is up (None: wait without a limit)."""
    if case_timeout is None:
        return None
    left = [w.started + case_timeout - time.perf_counter() for w in busy if w.started is not None]
    return max(0.0, min(left)) if left else 1.0   # a worker still starting: look again soon


_FATAL = re.compile(r"F\d{4} .*\.(cc|h):\d+\]")   # absl / glog's fatal-log line: "F1205 12:00:00.1 77 a.cc:3] ..."


class _Worker:
    """One spawned worker process, its pipe, its stderr log and the task it is running."""

    def __init__(self, ctx, log_path: str, platform: str, devices: int, xla, fault: str | None, run_task):
        self.conn, child = ctx.Pipe()
        self.log_path = log_path
        self.proc = ctx.Process(target=_worker_main, args=(child, log_path, platform, devices, xla, fault, run_task),
                                daemon=True)
        self.proc.start()
        child.close()
        self.jobs: collections.deque = collections.deque()   # sent, in order; the first is running
        self.ready = False
        self.log_offset = 0
        self.t0 = 0.0
        self.t_ready = None

    @property
    def job(self):
        """The (task, entry) running now (None: none sent)."""
        return self.jobs[0] if self.jobs else None

    def queued(self) -> list:
        """The jobs sent behind the running one (not started)."""
        return list(self.jobs)[1:]

    @property
    def started(self) -> float | None:
        """When the task in flight started to run: sent (or its predecessor's result came), and
        the worker ready (None: not yet)."""
        if self.job is None or self.t_ready is None:
            return None
        return max(self.t0, self.t_ready)

    def overdue(self, case_timeout: float) -> bool:
        return self.started is not None and time.perf_counter() - self.started > case_timeout

    def _starts(self, *, log: bool = True) -> None:
        self.t0 = time.perf_counter()
        if log:
            self.log_offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0

    def send(self, job, opts) -> None:
        self.jobs.append(job)
        if len(self.jobs) == 1:
            self._starts()
        task, entry = job
        try:
            self.conn.send((task, entry, opts))
        except OSError:  # the worker is already gone (it may die while starting): its sentinel tells
            pass

    def receive(self):
        """The finished task's result; `_PENDING` when only the start-up message came; None
        when the worker died before sending a result."""
        try:
            while self.conn.poll():
                msg = self.conn.recv()
                if msg == _READY:
                    self.ready = True
                    self.t_ready = time.perf_counter()
                    continue
                self.jobs.popleft()
                if self.jobs:
                    # the next task, already sent, runs from now; its stderr is read from where its
                    # predecessor's began (it may have written, or crashed, before this result was read)
                    self._starts(log=False)
                return msg
            if self.proc.is_alive():
                return _PENDING
        except (EOFError, OSError):
            pass
        self.proc.join(timeout=5)  # the pipe closed or the sentinel fired: the worker is gone
        return None

    def startup_failure(self) -> str:
        tail = self._stderr_tail(0)
        return (f"a conformance worker process failed to start (exit code {self.proc.exitcode}); no case was "
                f"charged with it. Its stderr:\n{tail}\nA script that calls conformance.engine.runner.run with "
                "processes > 1 must guard its top level with `if __name__ == \"__main__\":` (workers are "
                "spawned and import the main module).")

    def death_result(self) -> CaseResult:
        task, entry = self.job
        code = self.proc.exitcode
        tail = self._stderr_tail(self.log_offset)
        step, notes, fatal = self._task_log(task.case_id)
        failure = xfails.abort_failure(fatal, tail, exitcode=code, step=step)
        how = failure["how"]
        during = f", in step {step!r}" if step else ", before its task marked a step"
        message = (f"the worker process running this case died ({how}{during}); the run went on with a fresh "
                   "worker.\n"
                   + "".join(f"before it died: {n}\n" for n in notes)
                   + (f"XLA's fatal line: {fatal}\n" if fatal else "")
                   + (f"last stderr lines:\n{tail}\n" if tail else "it wrote nothing to stderr.\n")
                   + "If the platform aborts on this case by design, list it in xfails/<platform>.txt as "
                     "'CASE_ID_PATTERN aborts(/fatal line regex/): REASON' (a worker runs it, and only a SIGABRT "
                     "in XLA's step with that fatal line is expected) or 'CASE_ID_PATTERN crash: REASON' (it is "
                     "then not run).")
        details = Failure(worker_exit=how, exitcode=code, stderr_tail=tail, fatal_line=fatal or None,
                          signature=failure)
        status = "error"
        if entry is not None:
            ok, why = entry.expects(failure)
            said = entry.expecting(failure)
            if ok:
                status, message = "xfail", f"expected abort {said.signature}: {said.reason}\n{message}"
            else:
                message += (f"\nlisted in the xfails file at {said.where} as {said.signature} ({said.pattern!r}: "
                            f"{said.reason}), but this failure is not that one: {why}")
        return CaseResult(case_id=task.case_id, suite=task.suite, family=task.family, dtype=task.dtype,
                          status=status, examples=0, seconds=time.perf_counter() - self.t0, message=message,
                          details=details)

    def _log_since(self, offset: int) -> str:
        """What the worker wrote to its stderr log from `offset` on ("" when the log is unreadable)."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _task_log(self, case_id: str) -> tuple[str | None, list, str]:
        """(the step running when the worker died, the notes of its task, the last fatal-log line of
        that step) from what the worker wrote since it took task `case_id` (the log is read from
        `log_offset`, which may be its predecessor's start: lines before the task's own marker are
        the predecessor's). No step: None, and no fatal line."""
        lines = self._log_since(self.log_offset).splitlines()
        begun = f"{STEP_PREFIX}task {case_id}"
        first = max((i for i, ln in enumerate(lines) if ln.rstrip() == begun), default=None)
        if first is None:
            return None, [], ""
        lines = lines[first + 1:]
        notes = [ln[len(NOTE_PREFIX):].strip() for ln in lines if ln.startswith(NOTE_PREFIX)]
        marks = [i for i, ln in enumerate(lines) if ln.startswith(STEP_PREFIX)]
        if not marks:
            return None, notes, ""
        step = lines[marks[-1]][len(STEP_PREFIX):].strip()
        # XLA's "F... file.cc:N] Check failed: ..." above its stack trace, written in this step only
        fatal = [ln for ln in lines[marks[-1] + 1:] if _FATAL.match(ln)]
        return step, notes, fatal[-1].strip() if fatal else ""

    def timeout_result(self, case_timeout: float, opts: dict, write_repro) -> CaseResult:
        """The "timeout" record of the task in flight: its layout, the worker's last stderr lines
        and a reproducer of its first example (all examples share the structure that hung)."""
        task, _entry = self.job
        tail = self._stderr_tail(self.log_offset)
        details = Failure(timeout_seconds=case_timeout, stderr_tail=tail)
        repro = None
        variants = getattr(task, "variants", None)
        if variants:
            try:
                details = case_failure(variants[0], timeout_seconds=case_timeout, stderr_tail=tail)
                repro = write_repro(task, variants[0], opts.get("repro_dir"))
            except Exception as e:  # noqa: BLE001 - the timeout is reported even without a reproducer
                details.repro_error = f"{type(e).__name__}: {e}"
        where = f"\n{details.description}" if details.description is not None else ""
        message = (f"still running after {case_timeout:g} s (--case-timeout): killed with its worker; the run went "
                   f"on with a fresh worker. A hang in XLA (e.g. a collective rendezvous that never completes) "
                   f"looks like this.{where}" + (f"\nlast stderr lines:\n{tail}" if tail else ""))
        return CaseResult(case_id=task.case_id, suite=task.suite, family=task.family, dtype=task.dtype,
                          status="timeout", examples=0, seconds=time.perf_counter() - self.t0, message=message,
                          repro_path=repro, details=details)

    def kill(self) -> None:
        """End a hung worker now (SIGKILL: a thread stuck in C++ ignores anything gentler)."""
        self.proc.kill()
        self.proc.join(timeout=5)
        self.close()

    def _stderr_tail(self, offset: int) -> str:
        """The worker's last `STDERR_TAIL_LINES` stderr lines since `offset` (step markers left out)."""
        lines = [ln for ln in self._log_since(offset).rstrip("\n").splitlines() if not ln.startswith(STEP_PREFIX)]
        return "\n".join(lines[-STDERR_TAIL_LINES:])

    def ask_to_stop(self) -> None:
        """Tell the worker to exit after its task in flight (`stop` waits for it)."""
        if self.proc.is_alive():
            try:
                self.conn.send(None)
            except (OSError, BrokenPipeError):
                pass

    def stop(self) -> None:
        """Wait for a worker told to stop (`ask_to_stop`) to exit; terminate it after 5 s."""
        if self.proc.is_alive():
            self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
        self.close()

    def close(self) -> None:
        self.conn.close()


def _worker_main(conn, log_path: str, platform: str, devices: int, xla, fault: str | None, run_task) -> None:
    """A worker's loop: stderr to `log_path` (fd 2, so XLA's C++ logging goes there too), then
    run (task, entry, opts) messages with `run_task` until None, under `fault` if one is named."""
    mark("worker_up")
    _IN_WORKER[0] = True
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    xplat.configure(platform, devices)
    xplat.share_accelerator()
    compile_cache.install_from_env()   # the parent's compile cache checks, if it enabled a cache
    tune_gc()
    refsim.set_blas_threads(1)   # workers run side by side: one BLAS thread each
    with contextlib.ExitStack() as stack:
        if fault is not None:
            stack.enter_context(faults.inject(fault, warn=False))   # a mutation run: most cases leave it idle
        _serve(conn, run_task, xla)
    # Told to stop: every result is sent and every cache entry written (synchronously, by the task
    # that compiled it). Skip the interpreter's teardown (JAX's backends, XLA's thread pools: seconds
    # the parent would wait for before its run can end) and exit now.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


GC_THRESHOLD = (10_000, 10, 10)


def tune_gc() -> None:
    """Set this process's garbage collector for a worker: the objects alive now (the imported
    modules: JAX, NumPy, hypothesis) are frozen, never scanned again, and a young collection waits
    for `GC_THRESHOLD`'s 10,000 allocations instead of 700. Tracing and lowering allocate millions
    of small objects, and with Python's defaults a worker rescanned everything it had imported ~14
    times in a default run: ~2 CPU-seconds of ~60 (`python -m conformance run --examples 20`,
    in one process: 3.2 s of collections with the defaults, 1.3 s with these). Only for processes
    this package owns (its workers, ``python -m conformance``): a run inside a user's process
    leaves its collector alone."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def _serve(conn, run_task, xla) -> None:
    conn.send(_READY)
    mark("ready")
    while True:
        mark("wait")
        msg = conn.recv()
        if msg is None:
            mark("exit")
            return
        task, entry, opts = msg
        mark("task", case=task.case_id)
        step(f"task {task.case_id}")   # this task's steps (and notes) follow; the lines before are its predecessor's
        try:
            result = run_task(task, xla, entry, **opts)
        except Exception as e:  # noqa: BLE001 - a bug in the runner is this case's error, not the worker's end
            result = CaseResult(case_id=task.case_id, suite=task.suite, family=task.family, dtype=task.dtype,
                                status="error", examples=0, message=f"runner raised {type(e).__name__}: {e}",
                                details=Failure(traceback=traceback.format_exc()))
        mark("done", case=task.case_id, seconds=getattr(result, "seconds", 0.0))
        conn.send(result)
