"""`python -m conformance run --distributed` under the launcher: 2 processes x 4 CPU devices.

The suite runs with meshes spanning both processes (device ids 0..3 and 2048..2051 as the
CPU platform numbers them); process 0 gathers, compares and writes the report. A process
that hangs, dies or draws another plan ends the run with a message naming it, and no
process outlives the launcher.
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from conformance.cases import DEVICE_ORDERS

pytestmark = pytest.mark.multiprocess

LAUNCH = [sys.executable, "-m", "xla_backend", "launch", "--processes", "2", "--devices-per-process", "4",
          "--timeout", "400"]
RUN = [sys.executable, "-m", "conformance", "run", "--distributed", "--suite", "collectives", "--no-progress"]


def launch(args, *, env_extra=None, timeout=500):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(LAUNCH + ["--"] + args, capture_output=True, text=True, timeout=timeout, env=env)


def logical_ids(case_id: str) -> set:
    """The plan's device ids of a case's mesh, read from its id (``mesh=2x4:reversed``, ``random(3,1)``)."""
    mesh = re.search(r"mesh=([0-9x]+):(\w+)(?:\(([0-9,]+)\))?\]?$", case_id)
    shape, order, listed = mesh.groups()
    assert order in DEVICE_ORDERS
    if listed:
        return {int(i) for i in listed.split(",")}
    n = 1
    for s in shape.split("x"):
        n *= int(s)
    return set(range(n))


def launcher_pids(stderr: str) -> list[int]:
    return [int(p) for p in re.findall(r"launch: process \d+ \(pid (\d+)\)", stderr)]


def assert_gone(pids):
    from tests.xla_backend.test_xla_backend_launch import alive

    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids and not [p for p in pids if alive(p)]


def test_collectives_suite_across_two_processes_agrees_and_reports_the_global_devices(tmp_path):
    rep = tmp_path / "report"
    r = launch(RUN + ["--examples", "4", "--report", str(rep), "--case-timeout", "300"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    records = [json.loads(line) for line in (rep / "results.jsonl").read_text().splitlines()]
    plan = records[0]
    cases = [x for x in records if x["type"] == "case"]
    # the report lists 8 global devices over 2 processes, with the platform's own ids
    hw = plan["hardware"]
    assert plan["distributed"] and hw["device_count"] == 8 and hw["process_count"] == 2
    by_process = {}
    for d in hw["devices"]:
        by_process.setdefault(d["process"], []).append(d["id"])
    assert sorted(by_process) == [0, 1] and all(len(v) == 4 for v in by_process.values())
    assert not set(by_process[0]) & set(by_process[1])
    assert plan["global_devices"] == 8 and plan["process_count"] == 2
    assert "process 1: ids " in plan["topology"]
    # every case agrees (pmap over devices interleaving processes is a JAX multi-process limitation)
    statuses = {x["status"] for x in cases}
    assert statuses <= {"pass", "unsupported", "xfail"}, [(x["case_id"], x["message"][:300]) for x in cases
                                                           if x["status"] in ("fail", "error", "xpass")]
    for x in cases:
        if x["status"] == "unsupported":
            assert x["family"] == "pbroadcast" or "entry=pmap" in x["case_id"], x["case_id"]
    # and many of the passing cases ran on meshes spanning both processes
    spanning = [x["case_id"] for x in cases if x["status"] == "pass"
                and min(logical_ids(x["case_id"])) < 4 <= max(logical_ids(x["case_id"]))]
    assert len(spanning) >= 5, spanning
    assert records[-1]["type"] == "summary" and records[-1]["ok"]
    # process 0 wrote the report; process 1 its log
    assert (rep / "junit.xml").exists() and "process 1: ids" in (rep / "report.html").read_text()
    log1 = (rep / "logs" / "process-1.log").read_text()
    assert "joined: 8 devices over 2 processes" in log1 and "case #0 " in log1
    # --resume: process 0 reads the finished cases and tells the others; nothing runs again
    again = launch(RUN + ["--examples", "4", "--report", str(rep), "--case-timeout", "300", "--resume"])
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    after = [json.loads(line) for line in (rep / "results.jsonl").read_text().splitlines()]
    assert [x for x in after if x["type"] == "case"] == cases
    assert sum(x["type"] == "plan" for x in after) == 2 and after[-1]["ok"]


def test_a_hanging_process_ends_the_run_naming_it_within_the_case_timeout(tmp_path):
    t0 = time.monotonic()
    r = launch(RUN + ["--examples", "1", "--case-timeout", "5"],
               env_extra={"CONFORMANCE_DISTRIBUTED_FAULT": "hang:1:0"})
    assert r.returncode == 3  # process 0's own: the run did not finish (the launcher passes it on)
    assert time.monotonic() - t0 < 200
    out = r.stdout + r.stderr
    assert "process 1 did not send its results of case #0" in out and "hung or has died" in out
    assert "process 1: no case finished" in out
    assert_gone(launcher_pids(r.stderr))


def test_a_dying_process_ends_the_run_naming_it(tmp_path):
    r = launch(RUN + ["--examples", "1", "--case-timeout", "60"],
               env_extra={"CONFORMANCE_DISTRIBUTED_FAULT": "die:1:1"})
    assert r.returncode == 17  # the dying process's own status, passed on by the launcher
    assert re.search(r"launch: process 1 \(pid \d+\): exit status 17", r.stderr), r.stderr
    assert re.search(r"launch: process 0 \(pid \d+\): terminated by the launcher \(process 1 failed\)", r.stderr)
    assert_gone(launcher_pids(r.stderr))


def test_processes_that_draw_different_plans_are_refused():
    # process k runs with --seed k: the same command line cannot give them different plans otherwise
    cmd = " ".join(RUN) + " --examples 1 --case-timeout 60 --seed $XLA_BACKEND_PROCESS_ID"
    r = launch(["sh", "-c", cmd])
    assert r.returncode == 1
    out = r.stdout + r.stderr
    assert "process 1 drew another plan than process 0: seed: 0 on process 0, 1 here" in out
    assert_gone(launcher_pids(r.stderr))


def test_suites_that_cannot_run_distributed_are_refused_before_joining(capsys):
    from conformance import cli

    assert cli.main(["run", "--distributed", "--suite", "layouts", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "layouts cannot run with --distributed" in err and "collectives, programs" in err


def test_distributed_outside_a_job_says_how_to_start_one():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_BACKEND_", "SLURM_", "OMPI_", "JAX_COORD"))}
    r = subprocess.run(RUN + ["--examples", "1"], capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "needs a jax.distributed job" in r.stderr and "python -m xla_backend launch" in r.stderr


def test_remap_case_puts_platform_ids_in_every_mesh():
    import numpy as np

    from conformance.cases import Program
    from conformance.engine.distributed import remap_case
    from refsim import Mesh, NamedSharding, PartitionSpec as P

    ids = [0, 1, 2, 3, 2048, 2049, 2050, 2051]  # jax.devices() of 2 CPU processes x 4 devices
    a = Mesh((2, 2), ("x", "y"), device_ids=np.array([[5, 1], [4, 0]]))
    b = Mesh((4,), ("x",), device_ids=np.array([7, 6, 2, 3]))
    case = Program("move", "def f(a):\n    return a\n", "device_put", a, (np.arange(8.0).reshape(4, 2),),
                   in_shardings=(NamedSharding(a, P("x", "y")),), out_shardings=NamedSharding(b, P("x")))
    got = remap_case(case, ids)
    assert got.args is case.args and "ids [[2049, 1], [2048, 0]]" in got.describe()
    assert np.asarray(got.mesh.device_ids).tolist() == [[2049, 1], [2048, 0]]
    assert np.asarray(got.in_shardings[0].mesh.device_ids).tolist() == [[2049, 1], [2048, 0]]
    assert np.asarray(got.out_shardings.mesh.device_ids).tolist() == [2051, 2050, 2, 3]
    assert got.in_shardings[0].spec == P("x", "y") and got.out_shardings.spec == P("x")
    assert remap_case(case, list(range(8))) is case  # one process: ids are already the platform's
