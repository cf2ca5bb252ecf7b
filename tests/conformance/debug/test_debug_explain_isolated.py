"""XLA runs in a worker process for explain and bisect: a fatal XLA CHECK ends the worker, not
the caller, and is reported as a crash of the step that was running.

The CHECK is planted in the worker (`conformance.faults.compiler.XLA_CHECK_IN_COMPILE` and
friends: it prints XLA's ``Check failed`` line and aborts, as a failed CHECK does).
"""
import json
import os

import numpy as np
import pytest

import jax
from jax import lax

import xla_backend
from conformance.debug import bisect
from conformance.debug.explain import explain
from conformance.faults import compiler as planted
from conformance.faults import lowering as faults
from psum_reproducer import REPRO

P = jax.sharding.PartitionSpec
X = np.arange(16, dtype=np.float32).reshape(8, 2) - 5


@pytest.fixture(scope="module")
def m8():
    return xla_backend.mesh((8,), ("i",))


def _f(a):
    b = a * 2
    c = lax.ppermute(b, "i", [(j, (j + 1) % 8) for j in range(8)])
    return lax.psum(c + b, "i")


def test_a_check_in_the_compile_is_a_compiler_crash_and_this_process_lives_on(m8):
    pid = os.getpid()
    with faults.inject(planted.XLA_CHECK_IN_COMPILE):
        e = explain(_f, X, mesh=m8, in_specs=P("i"), out_specs=P())
    assert os.getpid() == pid
    assert e.diverged_in == "compiler" and e.crash, e.report()
    assert "Check failed: planted fatal CHECK in the compile" in e.crash and "signal 6" in e.crash
    assert e.stages[2].status == "crashed" and e.stages[3].status == "not evaluated"
    # the next explain starts a fresh worker
    assert explain(_f, X, mesh=m8, in_specs=P("i"), out_specs=P()).diverged_in is None


def test_a_check_while_running_is_a_backend_crash(m8):
    with faults.inject(planted.XLA_CHECK_IN_EXECUTE):
        e = explain(_f, X, mesh=m8, in_specs=P("i"), out_specs=P())
    assert e.diverged_in == "backend" and "planted fatal CHECK in the execute" in e.crash, e.report()
    assert e.agrees == {"lowered": True, "compiled": True, "executed": None}


def test_bisect_names_the_equation_whose_op_makes_xla_crash(m8):
    with faults.inject(planted.xla_check_on("stablehlo.collective_permute")):
        r = bisect(_f, X, mesh=m8, in_specs=P("i"), out_specs=P())
    d = r.divergence
    assert d is not None and d.primitive == "ppermute" and "planted fatal CHECK" in d.crash, r.report()
    assert r.report().startswith("CRASH: XLA fails on the program once it includes equation")
    assert bisect(_f, X, mesh=m8, in_specs=P("i"), out_specs=P()).ok


def test_the_explain_cli_survives_a_fatal_check(tmp_path, capsys):
    from conformance.cli import main

    path = tmp_path / "repro.py"
    path.write_text(REPRO)
    with faults.inject(planted.XLA_CHECK_IN_COMPILE):
        assert main(["explain", str(path), "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert got["diverged_in"] == "compiler" and "Check failed" in got["crash"]
    assert [s["status"] for s in got["stages"]] == ["evaluated", "evaluated", "crashed", "not evaluated"]
    assert main(["explain", str(path)]) == 0
