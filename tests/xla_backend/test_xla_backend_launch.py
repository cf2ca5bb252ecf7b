"""`python -m xla_backend launch` never leaks: every way a run can end leaves no child alive.

Each child prints its pid and the pid of a grandchild it started (a `sleep` in the child's
process group), so every test can check that both are gone once the launcher has exited.
Most children do not import JAX, which keeps these tests cheap.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.multiprocess

LAUNCH = [sys.executable, "-m", "xla_backend", "launch"]
# Prints "pids <child> <grandchild>" and sleeps for ten minutes; the children listed in EXIT_NOW
# instead exit with EXIT_CODE once every child has printed (files in BARRIER count them).
CHILD = ("import os, subprocess, sys, time\n"
         "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
         "print('pids', os.getpid(), g.pid, flush=True)\n"
         "me, barrier = os.environ['XLA_BACKEND_PROCESS_ID'], os.environ.get('BARRIER')\n"
         "if barrier: open(os.path.join(barrier, me), 'w').close()\n"
         "if me in os.environ.get('EXIT_NOW', '').split(','):\n"
         "    n, t0 = int(os.environ['XLA_BACKEND_NUM_PROCESSES']), time.time()\n"
         "    while len(os.listdir(barrier)) < n and time.time() - t0 < 120: time.sleep(0.05)\n"
         "    sys.exit(int(os.environ.get('EXIT_CODE', '0')))\n"
         "time.sleep(600)\n")


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def start(args, *, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.Popen(LAUNCH + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for_pids(proc, count: int, timeout: float = 60.0) -> list[int]:
    """Read the launcher's live output until `count` children have reported their pids."""
    pids, deadline = [], time.monotonic() + timeout
    while len(pids) < 2 * count:
        assert time.monotonic() < deadline, f"children did not start within {timeout} s (pids so far {pids})"
        line = proc.stdout.readline()
        assert line, f"launcher output ended early; stderr: {proc.stderr.read()}"
        if "pids" in line:
            pids += [int(x) for x in line.split("pids", 1)[1].split()]
    return pids


def finish(proc, timeout: float = 60.0):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def assert_all_gone(pids):
    deadline = time.monotonic() + 10.0  # reparented processes are reaped asynchronously
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], f"processes still alive after the launcher exited: {pids}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_launcher_ends_every_child_and_prints_the_summary(sig):
    proc = start(["--processes", "2", "--no-join-check", "--", sys.executable, "-c", CHILD])
    pids = wait_for_pids(proc, 2)
    assert all(alive(p) for p in pids)
    proc.send_signal(sig)
    rc, out, err = finish(proc)
    assert rc == 128 + int(sig), err
    assert f"INTERRUPTED by {sig.name}" in err
    assert err.count(f"terminated by the launcher (the launcher got {sig.name})") == 2, err
    assert "Traceback" not in err
    assert_all_gone(pids)


def test_timeout_command_wrapping_the_launcher_leaves_nothing_behind():
    # The issue's reproduction: `timeout 5 python -m xla_backend launch ... -- sleep 600` (SIGTERM).
    proc = subprocess.Popen(["timeout", "8"] + LAUNCH + ["--processes", "2", "--no-join-check", "--",
                                                         sys.executable, "-c", CHILD],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = wait_for_pids(proc, 2)
    rc, _, err = finish(proc)
    assert rc == 124 and "INTERRUPTED by SIGTERM" in err
    assert_all_gone(pids)


def test_a_child_exiting_0_while_another_hangs_ends_the_run_after_the_grace_period(tmp_path):
    t0 = time.monotonic()
    proc = start(["--processes", "2", "--no-join-check", "--exit-grace", "1", "--timeout", "300", "--",
                  sys.executable, "-c", CHILD], env_extra={"EXIT_NOW": "0", "BARRIER": str(tmp_path)})
    pids = wait_for_pids(proc, 2)
    rc, _, err = finish(proc)
    assert rc == 1
    assert time.monotonic() - t0 < 120  # far below --timeout 300
    assert "process 0 (pid" in err and ": ok" in err
    assert "process 1 (pid" in err and "still running 1 s after process 0 exited 0" in err
    assert_all_gone(pids)


def test_a_failing_child_ends_the_others(tmp_path):
    proc = start(["--processes", "3", "--no-join-check", "--", sys.executable, "-c", CHILD],
                 env_extra={"EXIT_NOW": "1", "EXIT_CODE": "7", "BARRIER": str(tmp_path)})
    pids = wait_for_pids(proc, 3)
    rc, _, err = finish(proc)
    assert rc == 7 and "process 1 (pid" in err and "exit status 7" in err  # the child's own status
    assert err.count("terminated by the launcher (process 1 failed)") == 2
    assert_all_gone(pids)


def test_the_time_limit_ends_every_child():
    proc = start(["--processes", "2", "--no-join-check", "--timeout", "3", "--", sys.executable, "-c", CHILD])
    pids = wait_for_pids(proc, 2)
    rc, _, err = finish(proc)
    assert rc == 1 and "exceeded its time limit of 3 s" in err
    assert_all_gone(pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_sigkill_to_the_launcher_still_ends_its_children():
    # SIGKILL cannot be caught; the kernel's parent-death signal ends the direct children.
    code = "import os, time; print('pids', os.getpid(), os.getpid(), flush=True); time.sleep(600)"
    proc = start(["--processes", "2", "--no-join-check", "--", sys.executable, "-c", code])
    pids = wait_for_pids(proc, 2)
    proc.kill()
    finish(proc)
    assert_all_gone(pids)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "abc", ""])
def test_bad_timeout_values_are_refused_in_one_line(value):
    r = subprocess.run(LAUNCH + [f"--timeout={value}", "--", sys.executable, "-c", "print('ran')"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--timeout" in r.stderr
    assert "finite number of seconds > 0" in r.stderr or "not a number of seconds" in r.stderr


def test_run_local_refuses_bad_limits():
    from xla_backend.launch import run_local

    for kw in ({"timeout_s": float("nan")}, {"timeout_s": 0}, {"exit_grace_s": float("inf")}, {"grace_s": -1}):
        with pytest.raises(ValueError, match="finite number of seconds > 0"):
            run_local([sys.executable, "-c", "pass"], **kw)


def test_plain_jax_script_gets_its_devices_and_is_reported_when_it_never_joins():
    r = subprocess.run(LAUNCH + ["--processes", "2", "--devices-per-process", "3", "--timeout", "120", "--",
                                 sys.executable, "-c", "import jax; print('devices', jax.process_index(), "
                                 "jax.device_count())"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 1
    # --devices-per-process took effect without xla_backend: each process has 3 CPU devices
    assert "[process 0] devices 0 3" in r.stdout and "[process 1] devices 0 3" in r.stdout
    assert r.stderr.count("never joined the distributed runtime") == 2


def test_plain_jax_distributed_initialize_counts_as_joined():
    code = ("import os, jax\n"
            "jax.config.update('jax_cpu_collectives_implementation', 'gloo')\n"
            "jax.distributed.initialize(os.environ['XLA_BACKEND_COORDINATOR'], "
            "int(os.environ['XLA_BACKEND_NUM_PROCESSES']), int(os.environ['XLA_BACKEND_PROCESS_ID']))\n"
            "print('devices', jax.process_index(), jax.device_count(), flush=True)\n"
            "jax.distributed.shutdown()\n")
    r = subprocess.run(LAUNCH + ["--processes", "2", "--devices-per-process", "2", "--timeout", "120", "--",
                                 sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert "[process 0] devices 0 4" in r.stdout and "[process 1] devices 1 4" in r.stdout
    assert r.stderr.count("): ok\n") == 2 and "launch: ok: 2 processes joined" in r.stderr


def test_the_launchers_exit_status_is_the_first_failing_childs_own():
    from xla_backend.launch import LaunchResult, ProcessResult

    def result(*codes, timed_out=False):
        return LaunchResult([ProcessResult(i, 100 + i, c, "", 1.0 if c == 0 else None, "" if c is not None else "x")
                             for i, c in enumerate(codes)], 0, 1.0, timed_out)

    assert result(0, 0).exit_status() == 0
    assert result(None, 3, 5).exit_status() == 3          # process 0 was ended by the launcher
    assert result(-9, None).exit_status() == 128 + 9      # killed by SIGKILL, as a shell reports it
    assert result(0, None, timed_out=True).exit_status() == 1
