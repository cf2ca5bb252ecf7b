"""An ``aborts(/regex/)`` xfails entry accepts only a worker killed by SIGABRT while XLA compiles or
runs the case, with XLA's fatal line matching the regex: every other death of a listed case's worker
is an error that names the entry and why (conformance.engine.workers, conformance.verdict.xfails).

Each case below writes the entry's fatal line to stderr and then dies otherwise: by another signal,
by an exit, in refsim's step, in a check that runs both sides, after another fatal line, or without
a fatal line at all. Only the SIGABRT in XLA's step after the matching line is "xfail".
"""
from __future__ import annotations

import functools
import os
import signal
import sys

import numpy as np
import pytest

from conformance.engine import runner

MATCHING = "F0000 00:00:1.0 77 planted.cc:1] Check failed: planted abort"
ANOTHER = "F0000 00:00:1.0 77 other.cc:2] Check failed: another abort"
ENTRY = "died[* aborts(/Check failed: planted abort/): a planted CHECK\n"
ACCEPTS = ("the xfails entry at {where} aborts(/Check failed: planted abort/) accepts only a worker killed by "
           "SIGABRT while XLA compiles or runs the case, with a fatal line /Check failed: planted abort/ matches")


def _die(how: str) -> None:
    """Write XLA's fatal line for the entry (or none, or another after it) and end the process as `how` says."""
    if how != "no_fatal_line":
        sys.stderr.write(MATCHING + "\n")
    if how == "another_fatal_line":
        sys.stderr.write(ANOTHER + "\n")
    sys.stderr.write("*** Check failure stack trace: ***\n    @ 0x1 xla::Planted()\n")
    sys.stderr.flush()
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "sigsegv":
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)   # no faulthandler: the signal's own death
        os.kill(os.getpid(), signal.SIGSEGV)
    if how == "exit0":
        os._exit(0)
    if how == "exit3":
        os._exit(3)
    os.abort()


class DyingXla:
    """xla_backend, except that a shard_map dies as its function's docstring says (a fatal XLA CHECK,
    another signal, an exit), when the XLA side compiles the case."""

    def shard_map(self, f, **kw):
        _die((f.__doc__ or "").strip())


def _aborting_check(xla):
    _die("sigabrt")


def _tasks() -> list:
    from conformance.cases import Program
    from conformance.suites import base
    from refsim import Mesh, PartitionSpec as P

    def program(how: str, body: str = "return a * 2") -> Program:
        return Program(family="died", source=f"def f(a):\n    '{how}'\n    {body}\n", entry="shard_map",
                       mesh=Mesh((2,), ("x",)), args=(np.arange(4, dtype=np.float32),), in_specs=(P("x"),),
                       out_specs=P("x"), labels=(("how", how),))

    on_xla = [program(h) for h in ("sigabrt", "sigkill", "sigsegv", "exit0", "exit3", "another_fatal_line",
                                   "no_fatal_line")]
    # the program itself aborts, with the entry's fatal line, while refsim traces and runs it
    in_refsim = program("in_refsim", "import sys, os\n    sys.stderr.write(%r)\n    sys.stderr.flush()\n    "
                                     "os.abort()" % (MATCHING + "\n"))
    tasks = [t for p in on_xla + [in_refsim] for t in base.group_tasks("programs", [p], seed=0, variants=1)]
    check = base.CheckTask("died[how=in_check]", "programs", "died", "float32", functools.partial(_aborting_check))
    return tasks + [check]


@pytest.fixture(scope="module")
def died(tmp_path_factory):
    """{how: CaseResult} of one run of every case in worker processes, under ENTRY in an xfails file."""
    from conformance.verdict import xfails

    path = tmp_path_factory.mktemp("xfails") / "cpu.txt"
    path.write_text(ENTRY, encoding="utf-8")
    listed = xfails.load(str(path))
    mp = pytest.MonkeyPatch()
    mp.setattr(runner, "plan_chunks", lambda *a, **k: [_tasks()])
    try:
        got = runner.run(suite="programs", progress=False, processes=2, xla=DyingXla(), shrink_seconds=0,
                         xfails=listed)
    finally:
        mp.undo()
    out = {r.case_id.split("how=")[1].split(",")[0].rstrip("]"): r for r in got.results}
    assert len(out) == len(got.results) == 9, [r.case_id for r in got.results]
    return out, f"{path}:1"


def test_a_sigabrt_in_xlas_step_with_the_matching_fatal_line_is_xfail(died):
    results, where = died
    got = results["sigabrt"]
    assert got.status == "xfail", got.message
    assert got.message.startswith("expected abort aborts(/Check failed: planted abort/): a planted CHECK\n"
                                  "the worker process running this case died (killed by SIGABRT, in step 'xla')")
    assert got.details["fatal_line"] == MATCHING
    assert got.details["failure"]["step"] == "xla" and got.details["failure"]["signal"] == "SIGABRT"


@pytest.mark.parametrize("how, exit, why", [
    ("sigkill", "killed by SIGKILL", "the worker was killed by SIGKILL, not by SIGABRT"),
    ("sigsegv", "killed by SIGSEGV", "the worker was killed by SIGSEGV, not by SIGABRT"),
    ("exit0", "exit code 0", "the worker exited with code 0, it was not killed by SIGABRT"),
    ("exit3", "exit code 3", "the worker exited with code 3, it was not killed by SIGABRT"),
    ("another_fatal_line", "killed by SIGABRT",
     f"XLA's fatal line does not match /Check failed: planted abort/: {ANOTHER}"),
    ("no_fatal_line", "killed by SIGABRT",
     "the worker was killed by SIGABRT while XLA ran the case, but XLA wrote no fatal line"),
    ("in_refsim", "killed by SIGABRT", "the worker was killed by SIGABRT in refsim's step (refsim evaluating the "
     "case), which is never an XLA abort, not while XLA compiled or ran the case"),
    ("in_check", "killed by SIGABRT", "the worker was killed by SIGABRT in a check that runs refsim and XLA "
     "together (which side aborted cannot be told), not while XLA compiled or ran the case"),
])
def test_any_other_death_is_an_error_naming_the_entry_and_why(died, how, exit, why):
    results, where = died
    got = results[how]
    assert got.status == "error", got.message
    assert got.details["worker_exit"] == exit
    assert (f"listed in the xfails file at {where} as aborts(/Check failed: planted abort/) ('died[*': a planted "
            f"CHECK), but this failure is not that one: {why}; {ACCEPTS.format(where=where)}") in got.message
