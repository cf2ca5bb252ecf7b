"""The runner's worker processes: a case that kills its worker is one "error", the run goes on."""
from __future__ import annotations

import os
import signal
import sys

import numpy as np
import pytest

import xla_backend
from conformance.engine import runner


def _claim(path: str) -> bool:
    """True for exactly one caller across processes: whoever creates `path` first."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class CrashingXla:
    """xla_backend, except that the first call anywhere aborts its process (as a fatal XLA CHECK
    does) and the second exits with status 3; the marker files make each happen exactly once."""

    def __init__(self, folder: str):
        self.abort_marker = os.path.join(folder, "aborted")
        self.exit_marker = os.path.join(folder, "exited")

    def _maybe_die(self, name: str) -> None:
        if _claim(self.abort_marker):
            sys.stderr.write(f"F0000 planted.cc:1] Check failed: planted abort in {name}\n")
            sys.stderr.flush()
            os.abort()
        if _claim(self.exit_marker):
            sys.stderr.write(f"planted exit in {name}\n")
            sys.stderr.flush()
            os._exit(3)

    def shard_map(self, f, **kw):
        self._maybe_die("shard_map")
        return xla_backend.shard_map(f, **kw)

    def pmap(self, f, *a, **kw):
        self._maybe_die("pmap")
        return xla_backend.pmap(f, *a, **kw)

    def jit(self, f, *a, **kw):
        self._maybe_die("jit")
        return xla_backend.jit(f, *a, **kw)

    def device_put(self, x, s):
        self._maybe_die("device_put")
        return xla_backend.device_put(x, s)


def test_a_dead_worker_is_one_error_and_a_fresh_worker_runs_the_rest(tmp_path):
    baseline = runner.run(suite="errors", examples=1, progress=False)
    got = runner.run(suite="errors", examples=1, progress=False, processes=2, xla=CrashingXla(str(tmp_path)),
                     shrink_seconds=0)
    assert sorted(r.case_id for r in got.results) == sorted(r.case_id for r in baseline.results)
    errors = {r.case_id: r for r in got.results if r.status == "error"}
    assert len(errors) == 2 and not got.ok
    by_exit = {r.details["worker_exit"]: r for r in errors.values()}
    assert set(by_exit) == {"killed by SIGABRT", "exit code 3"}
    aborted = by_exit["killed by SIGABRT"]
    assert aborted.details["exitcode"] == -signal.SIGABRT and aborted.examples == 0
    assert aborted.message.startswith("the worker process running this case died (killed by SIGABRT, in step "
                                      "'check'); the run went on with a fresh worker.")
    # the stderr tail is what the worker wrote while running this case, and says how to list a crash
    assert aborted.details["stderr_tail"] == "F0000 planted.cc:1] Check failed: planted abort in shard_map"
    assert "'CASE_ID_PATTERN crash: REASON'" in aborted.message
    assert by_exit["exit code 3"].details["stderr_tail"] == "planted exit in shard_map"
    # every other case ran in a (fresh) worker and agrees with the in-process run
    want = {r.case_id: r.status for r in baseline.results}
    assert all(r.status == want[r.case_id] for r in got.results if r.case_id not in errors)


def test_processes_argument_and_unpicklable_doubles_are_rejected():
    with pytest.raises(ValueError, match=r"processes=0; pass a positive int \(worker processes\), or None"):
        runner.run(suite="errors", processes=0, progress=False)
    with pytest.raises(ValueError, match=r"xla=<module 'xla_backend'.* cannot be sent to worker processes .*"
                                         r"or processes=None to run it in this process"):
        runner.run(suite="errors", processes=2, xla=xla_backend, progress=False)


class HangingXla:
    """xla_backend, except that the first shard_map call anywhere never returns (as a collective
    whose rendezvous never completes does); the marker file makes it happen exactly once."""

    def __init__(self, folder: str):
        self.marker = os.path.join(folder, "hung")

    def shard_map(self, f, **kw):
        if _claim(self.marker):
            import time

            while True:          # a deadlock: nothing returns to the runner
                time.sleep(60)
        return xla_backend.shard_map(f, **kw)

    def __getattr__(self, name):
        return getattr(xla_backend, name)


def _small_tasks():
    from conformance.cases import CollectiveCall
    from conformance.suites import base
    from refsim import Mesh, PartitionSpec as P

    calls = [CollectiveCall(family=name, source=f"def f(a):\n    return jax.lax.{name}(a, 'x')\n", entry="shard_map",
                            mesh=Mesh((2,), ("x",)), args=(np.arange(4, dtype=np.int32),), in_specs=(P("x"),),
                            out_specs=P(), labels=(("axes", "'x'"),), outputs=("exact",), name=name,
                            params={"axis_name": "x"}) for name in ("psum", "pmax", "pmin")]
    return [t for c in calls for t in base.group_tasks("collectives", [c], seed=0, variants=1)]


def test_a_hanging_case_is_a_timeout_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "plan_chunks", lambda *a, **k: [_small_tasks()])
    got = runner.run(suite="collectives", progress=False, processes=1, xla=HangingXla(str(tmp_path)),
                     case_timeout=15, shrink_seconds=0, report_dir=tmp_path / "rep")
    assert [r.status for r in got.results] == ["timeout", "pass", "pass"], [r.message for r in got.results]
    t = got.results[0]
    assert t.case_id == "psum[axes='x',dtype=int32,mesh=2:default]"
    assert "still running after 15 s (--case-timeout): killed with its worker" in t.message
    assert "mesh:" in t.message and "jax.lax.psum(a, 'x')" in t.message          # the case's layout
    assert t.repro_path and os.path.exists(t.repro_path)
    assert "conformance reproducer" in open(t.repro_path).read()
    assert not got.ok and got.summary["by_status"]["timeout"] == 1


def test_case_timeout_needs_workers():
    with pytest.raises(ValueError, match="case_timeout needs processes=K"):
        runner.run(suite="errors", examples=1, progress=False, case_timeout=5)
    with pytest.raises(ValueError, match=r"case_timeout=-1; pass a finite number > 0 .*\(seconds\), or None for no limit"):
        runner.run(suite="errors", examples=1, progress=False, processes=1, case_timeout=-1)


# -- the default worker run draws the plan while the workers start and run it ----------------------
def _spy_sends(monkeypatch) -> list:
    """The case ids the parent hands to workers, in the order it hands them out."""
    from conformance.engine import workers

    sent, send = [], workers._Worker.send

    def spy(self, job, opts):
        sent.append(job[0].case_id)
        send(self, job, opts)

    monkeypatch.setattr(workers._Worker, "send", spy)
    return sent


def _records(folder) -> list:
    import json

    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


def test_a_streamed_run_runs_the_plan_in_plan_order_with_the_draw_first_statuses(tmp_path, monkeypatch):
    plan = [t.case_id for t in runner.plan_tasks("collectives", examples=1)]
    first = runner.run(suite="collectives", examples=1, progress=False, shrink_seconds=0)  # draws first, in-process
    sent = _spy_sends(monkeypatch)
    streamed = runner.run(suite="collectives", examples=1, progress=False, shrink_seconds=0, processes=2,
                          report_dir=tmp_path / "rep")
    assert sent == plan == [r.case_id for r in first.results]
    assert {r.case_id: r.status for r in streamed.results} == {r.case_id: r.status for r in first.results}
    assert len(streamed.results) == len(plan) and streamed.summary["plan"]["cases"] == len(plan)
    assert streamed.summary["phases"]["drawing"] > 0
    recs = _records(tmp_path / "rep")
    assert recs[0]["type"] == "plan" and recs[0]["cases"] == len(plan) and recs[-1]["type"] == "summary"
    assert [r["case_id"] for r in recs[1:-1]] == [r.case_id for r in streamed.results]  # as they came


def test_a_streamed_shard_keeps_the_plan_positions_of_select_shard(monkeypatch):
    from conformance.engine.plan import select_shard

    chunks = [_small_tasks()[:2], [], _small_tasks()[2:]]   # positions 0, 1 | - | 2
    monkeypatch.setattr(runner, "plan_chunks", lambda *a, **k: iter(chunks))
    sent = _spy_sends(monkeypatch)
    got = runner.run(suite="collectives", progress=False, processes=1, shrink_seconds=0, shard="2/2")
    want = [t.case_id for t in select_shard(_small_tasks(), "2/2")]
    assert sent == [r.case_id for r in got.results] == want == ["pmax[axes='x',dtype=int32,mesh=2:default]"]
    assert got.summary["plan"]["shard"] == "2/2" and got.summary["plan"]["cases"] == 1


def _results_seen(monkeypatch) -> list:
    """The case ids of the results the run's executor yields, in the order it yields them."""
    seen: list = []
    execute = runner._execute

    def spy(*a, **k):
        for res in execute(*a, **k):
            seen.append(res.case_id)
            yield res

    monkeypatch.setattr(runner, "_execute", spy)
    return seen


def test_results_that_come_before_the_plan_is_drawn_are_reported_after_its_start_in_order(tmp_path, monkeypatch):
    import time

    seen = _results_seen(monkeypatch)

    def chunks():
        first, *rest = _small_tasks()
        yield [first]
        while not seen:          # the first result is back before the rest of the plan is drawn
            time.sleep(0.01)
            yield []
        yield rest

    monkeypatch.setattr(runner, "plan_chunks", lambda *a, **k: chunks())
    got = runner.run(suite="collectives", progress=False, processes=1, shrink_seconds=0, report_dir=tmp_path / "rep")
    ids = [t.case_id for t in _small_tasks()]
    assert [r.case_id for r in got.results] == seen == ids and got.ok
    recs = _records(tmp_path / "rep")
    # the reporters saw the whole plan first (its case count), then every case once, in order
    assert [r["type"] for r in recs] == ["plan", "case", "case", "case", "summary"]
    assert recs[0]["cases"] == 3 and [r["case_id"] for r in recs[1:4]] == ids
    assert recs[-1]["cases"] == 3 and recs[-1]["by_status"]["pass"] == 3


def test_an_error_while_drawing_stops_the_workers_and_propagates(tmp_path, monkeypatch):
    from conformance.engine import workers

    started: list = []
    init = workers._Worker.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        started.append(self)

    def chunks():
        yield _small_tasks()
        raise RuntimeError("planted drawing error")

    monkeypatch.setattr(workers._Worker, "__init__", spy)
    monkeypatch.setattr(runner, "plan_chunks", lambda *a, **k: chunks())
    with pytest.raises(RuntimeError, match="planted drawing error"):
        runner.run(suite="collectives", progress=False, processes=2, shrink_seconds=0, report_dir=tmp_path / "rep")
    assert len(started) == 2 and not any(w.proc.is_alive() for w in started)
    assert not (tmp_path / "rep" / "results.jsonl").exists()   # no reporter had started: nothing half-written


class FailsInWorkers:
    """Pickles in the parent, fails to unpickle in a worker: the worker dies while starting."""

    def __init__(self):
        self.parent = os.getpid()

    def __setstate__(self, state):
        if os.getpid() != state["parent"]:
            raise RuntimeError("planted start-up failure")
        self.__dict__.update(state)


def test_a_worker_that_fails_to_start_while_the_plan_is_drawn_fails_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "plan_chunks", lambda *a, **k: iter([_small_tasks()[:1], _small_tasks()[1:]]))
    with pytest.raises(RuntimeError, match="a conformance worker process failed to start"):
        runner.run(suite="collectives", progress=False, processes=1, xla=FailsInWorkers(),
                   report_dir=tmp_path / "rep")


# -- a thread draws the plan; the parent hands out tasks while it draws ----------------------------
def test_drawn_gives_the_lists_in_order_and_signals_each_as_it_is_drawn():
    import threading
    from multiprocessing import connection

    from conformance.engine import workers

    gate = threading.Event()

    def lists():
        yield [1, 2]
        gate.wait()
        yield []
        yield [3]

    drawn = workers.Drawn(lists())
    assert connection.wait([drawn], timeout=None) == [drawn] and drawn.ready()
    assert next(drawn) == [1, 2]
    assert connection.wait([drawn], timeout=0) == [] and not drawn.ready()   # held at the gate
    gate.set()
    assert list(drawn) == [[], [3]]


def test_drawn_raises_the_drawing_error_where_the_next_list_is_taken():
    from conformance.engine import workers

    def lists():
        yield ["a"]
        raise ValueError("planted drawing error")

    drawn = workers.Drawn(lists())
    assert next(drawn) == ["a"]
    with pytest.raises(ValueError, match="planted drawing error"):
        next(drawn)


def test_a_worker_gets_its_next_task_while_the_parent_is_still_drawing(tmp_path, monkeypatch):
    import time

    seen = _results_seen(monkeypatch)

    tasks = _small_tasks()

    def chunks():
        yield tasks[:2]
        # the draw of the next family blocks until both tasks of the first have come back: they can
        # only if the parent takes results (and sends the second task) while this draw is under way
        give_up = time.monotonic() + 600   # a guard against hanging, not a timing assertion
        while len(seen) < 2:
            assert time.monotonic() < give_up, "the parent took no result while the plan was being drawn"
            time.sleep(0.01)
        yield tasks[2:]

    monkeypatch.setattr(runner, "plan_chunks", lambda *a, **k: chunks())
    got = runner.run(suite="collectives", progress=False, processes=1, shrink_seconds=0, report_dir=tmp_path / "rep")
    assert [r.case_id for r in got.results] == seen == [t.case_id for t in tasks] and got.ok
    assert [r["type"] for r in _records(tmp_path / "rep")] == ["plan", "case", "case", "case", "summary"]


# -- workers started ahead (the command line starts them while its preflight runs) ----------------
def test_a_run_takes_over_workers_started_ahead_and_starts_none_of_its_own(monkeypatch):
    from conformance.engine import workers

    early = workers.start(2, platform="cpu", devices=8, run_task=runner.run_task)
    made: list = []
    init = workers._Worker.__init__

    def spy(self, *a, **k):
        made.append(self)
        init(self, *a, **k)

    monkeypatch.setattr(workers._Worker, "__init__", spy)
    monkeypatch.setattr(runner, "plan_chunks", lambda *a, **k: iter([_small_tasks()]))
    got = runner.run(suite="collectives", progress=False, processes=2, shrink_seconds=0, started_workers=early)
    assert made == [] and got.ok and sorted(r.case_id for r in got.results) == sorted(t.case_id for t in _small_tasks())
    early.close()   # taken over: nothing left to stop
    with pytest.raises(RuntimeError, match="taken over by a run already"):
        early.take()


def test_workers_started_ahead_that_no_run_takes_over_are_stopped_by_close(tmp_path):
    from conformance.engine import workers

    with workers.start(1, platform="cpu", devices=8, run_task=runner.run_task, env={"PLANTED_VAR": "1"}) as early:
        assert "PLANTED_VAR" not in os.environ   # the workers' environment only
        procs = [w.proc for w in early._workers]
        logs = early._logs
    assert procs and not any(p.is_alive() for p in procs) and not os.path.exists(logs)


class GcProbeXla:
    """xla_backend, except that each call writes the calling process's garbage-collector settings
    to a file of its own in `folder`."""

    def __init__(self, folder: str):
        self.folder = folder

    def _note(self) -> None:
        import gc

        with open(os.path.join(self.folder, f"gc-{os.getpid()}"), "w") as fh:
            fh.write(repr((gc.get_threshold(), gc.get_freeze_count())))

    def __getattr__(self, name):
        real = getattr(xla_backend, name)
        if name not in ("shard_map", "pmap", "jit", "device_put"):
            return real

        def call(*a, **kw):
            self._note()
            return real(*a, **kw)
        return call


def test_a_worker_freezes_what_it_imported_and_collects_young_objects_less_often(tmp_path):
    import gc
    from conformance.engine import workers

    before = gc.get_threshold()
    got = runner.run(suite="errors", examples=1, progress=False, processes=1, xla=GcProbeXla(str(tmp_path)))
    assert got.ok
    notes = [eval(p.read_text()) for p in tmp_path.glob("gc-*")]
    assert notes, "no call reached the XLA engine in a worker"
    for threshold, frozen in notes:
        assert threshold == workers.GC_THRESHOLD
        assert frozen > 10_000   # JAX, NumPy and this package's modules, at least
    assert gc.get_threshold() == before   # the parent's collector is left alone


class AbortingXla:
    """xla_backend, except that every shard_map aborts its process (as a fatal XLA CHECK does)."""

    def shard_map(self, f, **kw):
        sys.stderr.write("F0000 planted.cc:1] Check failed: planted abort\n")
        sys.stderr.flush()
        os.abort()


def test_a_worker_that_dies_on_the_xla_side_after_refsim_raised_says_refsim_raised_first(monkeypatch):
    # refsim raises on the program (JAX's tracer rejects it); the runner then runs the XLA side to tell
    # a JAX error from refsim's own, and there XLA aborts: the record of the death says refsim raised
    from conformance.cases import Program
    from conformance.suites import base
    from refsim import Mesh, PartitionSpec as P

    prog = Program(family="planted", source="def f(a):\n    assert a.ndim == 0, 'planted: JAX traced it'\n    return a\n",
                   entry="shard_map", mesh=Mesh((2,), ("x",)), args=(np.arange(4, dtype=np.float32),),
                   in_specs=(P("x"),), out_specs=P("x"), labels=(("op", "planted"),))
    tasks = base.group_tasks("programs", [prog], seed=0, variants=1)
    monkeypatch.setattr(runner, "plan_chunks", lambda *a, **k: [tasks])
    (got,) = runner.run(suite="programs", progress=False, processes=1, xla=AbortingXla(), shrink_seconds=0).results
    assert got.status == "error" and got.details["worker_exit"] == "killed by SIGABRT"
    assert ("before it died: refsim raised AssertionError on this case: planted: JAX traced it; the XLA side was "
            "then run to tell a JAX tracing error from refsim's own\n") in got.message
    assert got.details["fatal_line"] == "F0000 planted.cc:1] Check failed: planted abort"


def test_a_note_outside_a_worker_writes_nothing(capfd):
    from conformance.engine import workers

    workers.note("nothing to see")
    assert capfd.readouterr().err == ""


def _planted_program_tasks():
    from conformance.cases import Program
    from conformance.suites import base
    from refsim import Mesh, PartitionSpec as P

    prog = Program(family="planted", source="def f(a):\n    return a * 2\n", entry="shard_map", mesh=Mesh((2,), ("x",)),
                   args=(np.arange(4, dtype=np.float32),), in_specs=(P("x"),), out_specs=P("x"),
                   labels=(("op", "planted"),))
    return base.group_tasks("programs", [prog], seed=0, variants=1)


@pytest.mark.parametrize("regex, status", [("Check failed: planted abort", "xfail"), ("Check failed: another", "error")])
def test_an_aborts_entry_makes_a_worker_death_with_its_fatal_line_an_xfail(monkeypatch, tmp_path, regex, status):
    from conformance.verdict import xfails

    monkeypatch.setattr(runner, "plan_chunks", lambda *a, **k: [_planted_program_tasks()])
    listed = xfails.XfailList(xfails.parse(f"planted[* aborts(/{regex}/): a planted CHECK"))
    (got,) = runner.run(suite="programs", progress=False, processes=1, xla=AbortingXla(), shrink_seconds=0,
                        xfails=listed).results
    assert got.status == status and got.details["worker_exit"] == "killed by SIGABRT"
    assert got.details["failure"]["kind"] == "aborts"
    if status == "xfail":
        assert got.message.startswith(f"expected abort aborts(/{regex}/): a planted CHECK\nthe worker process")
    else:
        assert (f"listed in the xfails file at <xfails>:1 as aborts(/{regex}/) ('planted[*': a planted CHECK), but "
                f"this failure is not that one: XLA's fatal line does not match /{regex}/: F0000 planted.cc:1] Check "
                "failed: planted abort; the xfails entry at <xfails>:1") in got.message
    # in this process the case is not run at all: its abort would end the run
    here = runner.run(suite="programs", progress=False, xla=AbortingXla(), shrink_seconds=0, xfails=listed).results
    assert [(r.status, r.examples) for r in here] == [("xfail", 0)]
    assert here[0].message == f"not run in this process: aborts(/{regex}/): a planted CHECK (worker processes run it)"


def test_a_case_an_aborts_entry_lists_that_agrees_in_a_worker_passes_when_sometimes(monkeypatch):
    from conformance.verdict import xfails

    monkeypatch.setattr(runner, "plan_chunks", lambda *a, **k: [_planted_program_tasks()])
    for line, want in (("sometimes aborts(/x/)", "pass"), ("aborts(/x/)", "xpass")):
        listed = xfails.XfailList(xfails.parse(f"planted[* {line}: r"))
        (got,) = runner.run(suite="programs", progress=False, processes=1, shrink_seconds=0, xfails=listed).results
        assert got.status == want, got.message
