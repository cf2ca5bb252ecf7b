"""2 processes x 4 CPU devices under jax.distributed with gloo collectives.

The worker is `python -m xla_backend selftest --distributed`: psum, all_gather,
all_to_all, ppermute and a reshard across both processes, each process checking its
own shards and every process's gathered shards against per-device NumPy loops.
"""
import json
import sys
import time

import pytest

from xla_backend.launch import LaunchError, port_is_free, run_local

pytestmark = pytest.mark.multiprocess
EXPECTED_CHECKS = {"psum", "all_gather", "all_to_all", "ppermute", "reshard"}


def test_two_processes_four_devices_each(tmp_path):
    t0 = time.monotonic()
    report = tmp_path / "report_{process_id}.json"
    res = run_local([sys.executable, "-m", "xla_backend", "selftest", "--distributed",
                     "--json", str(report)], processes=2, devices_per_process=4, timeout_s=100)
    assert time.monotonic() - t0 < 120
    assert res.ok and port_is_free(res.port)
    all_ids = None
    local_by_process = {}
    for pid in (0, 1):
        rep = json.loads((tmp_path / f"report_{pid}.json").read_text())
        assert rep["process_id"] == pid and rep["process_count"] == 2 and rep["devices"] == 8
        assert set(rep["checks"]) == EXPECTED_CHECKS
        for name, c in rep["checks"].items():
            assert c["ok"], f"process {pid} {name}: {c.get('error')}\n{c.get('traceback')}"
            assert sorted(c["local_devices"]) == sorted(rep["local_devices"])
            assert len(c["all_devices"]) == 8
            all_ids = all_ids or sorted(c["all_devices"])
            assert sorted(c["all_devices"]) == all_ids
        local_by_process[pid] = set(rep["local_devices"])
    # each process held 4 distinct devices, and together they are every device
    assert all(len(v) == 4 for v in local_by_process.values())
    assert local_by_process[0] | local_by_process[1] == set(all_ids)
    assert not local_by_process[0] & local_by_process[1]


def test_a_crashing_process_fails_the_run_and_nothing_is_left(tmp_path):
    # Process 1 dies before joining; process 0 would wait in jax.distributed.initialize.
    code = ("import os, sys\n"
            "if os.environ['XLA_BACKEND_PROCESS_ID'] == '1': sys.exit(3)\n"
            "from xla_backend import distributed\n"
            "distributed.initialize(timeout_s=100)\n")
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        run_local([sys.executable, "-c", code], processes=2, devices_per_process=4, timeout_s=100)
    assert time.monotonic() - t0 < 30
    msg = str(info.value)
    assert "process 1 (pid" in msg and "exit status 3" in msg
    assert "process 0 (pid" in msg and "terminated by the launcher" in msg
    res = info.value.result
    assert not res.ok and port_is_free(res.port)
    import os

    for p in res.processes:  # every child is gone
        with pytest.raises(ProcessLookupError):
            os.kill(p.pid, 0)


def test_a_hung_run_times_out_as_an_error():
    with pytest.raises(LaunchError, match="exceeded its time limit"):
        run_local([sys.executable, "-c", "import time; time.sleep(60)"], processes=2,
                  devices_per_process=1, timeout_s=1.0)


def test_cli_reports_failure_with_exit_status():
    import subprocess

    r = subprocess.run([sys.executable, "-m", "xla_backend", "launch", "--processes", "2",
                        "--devices-per-process", "1", "--", sys.executable, "-c",
                        "import os,sys; sys.exit(int(os.environ['XLA_BACKEND_PROCESS_ID']) * 5)"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 5  # the failing process's own status
    assert "FAILED" in r.stderr and "exit status 5" in r.stderr


def test_port_check_sees_a_listener():
    import socket

    from xla_backend.launch import free_port

    port = free_port()
    assert port_is_free(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not port_is_free(port)
