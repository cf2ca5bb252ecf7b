"""A report folder is owned by one run at a time (issue 28, point 2): `conformance.report.lock`."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conformance import cli
from conformance.engine import merge, runner
from conformance.report import lock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SMALL = dict(suite="layouts", examples=1, progress=False, processes=None, shrink_seconds=0)
CLI_SMALL = ["run", "--suite", "layouts", "--examples", "1", "--no-progress", "--processes", "1"]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["CONFORMANCE_COMPILE_CACHE"] = "off"
    return env


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # reaped: the pid runs nothing now
    return p.pid


def _write_lock(folder, **info):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, lock.LOCK_NAME), "w", encoding="utf-8") as fh:
        json.dump({"pid": 1, "host": socket.gethostname(), "started": "2020-01-01T00:00:00",
                   "command": "python -m conformance run --report R", **info}, fh)


def test_a_second_run_on_a_folder_in_use_is_refused_naming_the_first(tmp_path, capsys):
    folder = str(tmp_path / "rep")
    first = subprocess.Popen([sys.executable, "-m", "conformance", *CLI_SMALL, "--report", folder],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    try:
        t0 = time.monotonic()
        while lock.read(folder) is None:
            assert first.poll() is None, first.communicate()
            assert time.monotonic() - t0 < 300, "the first run never took the folder's lock"
            time.sleep(0.02)
        first.send_signal(signal.SIGSTOP)  # it holds the folder: it stays alive, and busy, as long as we like
        owner = lock.read(folder)
        assert owner["pid"] == first.pid and owner["host"] == socket.gethostname()
        code = cli.main(CLI_SMALL + ["--seed", "1", "--report", folder])
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert code == 2 and len(err) == 1
        assert f"pid {first.pid} on host {socket.gethostname()}" in err[0] and "in use by another run" in err[0]
        assert "pass another --report folder" in err[0] and lock.LOCK_NAME in err[0]
        with pytest.raises(lock.FolderLocked, match=f"pid {first.pid}"):
            runner.run(report_dir=folder, seed=1, **SMALL)
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out[-2000:] + err[-2000:]
    # the folder holds the first run alone (seed 0), and its lock is gone
    recs = [json.loads(x) for x in open(os.path.join(folder, "results.jsonl"), encoding="utf-8")]
    assert [r["seed"] for r in recs if r["type"] == "plan"] == [0] and recs[-1]["verdict"] == "AGREE"
    assert lock.read(folder) is None and not os.path.exists(os.path.join(folder, lock.LOCK_NAME))


def test_a_stale_lock_of_a_dead_pid_on_this_host_is_taken_over(tmp_path, capsys):
    folder = tmp_path / "rep"
    dead = _dead_pid()
    _write_lock(folder, pid=dead)
    res = runner.run(report_dir=folder, **SMALL)
    assert res.ok
    err = capsys.readouterr().err
    assert f"locked by pid {dead} on host {socket.gethostname()}" in err and "took the lock over" in err
    assert not (folder / lock.LOCK_NAME).exists()


@pytest.mark.parametrize("pid", ["this process", 1])
def test_a_lock_of_a_live_pid_that_nobody_holds_is_taken_over(tmp_path, capsys, pid):
    # after a restart the recorded pid may name an unrelated live process (pid reuse): the lock is
    # the OS-level flock, and nobody holds it
    pid = os.getpid() if pid == "this process" else pid
    folder = tmp_path / "rep"
    _write_lock(folder, pid=pid)
    res = runner.run(report_dir=folder, **SMALL)
    assert res.ok
    err = capsys.readouterr().err
    assert f"locked by pid {pid} on host {socket.gethostname()}" in err and "took the lock over" in err
    assert "no process holds the lock" in err
    assert not (folder / lock.LOCK_NAME).exists()


def _holder(folder):
    """A live process that holds `folder`'s lock until its stdin closes (started, lock taken)."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; from conformance.report import lock\n"
                          "l = lock.acquire(sys.argv[1], command='holder')\nprint('held', flush=True)\n"
                          "sys.stdin.read(); l.release()\n", str(folder)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_lock_held_by_another_live_process_is_refused(tmp_path, capsys):
    folder = tmp_path / "rep"
    folder.mkdir()
    holder = _holder(folder)
    try:
        with pytest.raises(lock.FolderLocked, match=f"pid {holder.pid} on host .*it holds the folder's lock"):
            lock.acquire(folder)
        # the owner record is only read for the message: an edited pid does not free the folder
        _write_lock(folder, pid=_dead_pid(), command="holder")
        with pytest.raises(lock.FolderLocked, match="it holds the folder's lock"):
            runner.run(report_dir=folder, **SMALL)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    with lock.acquire(folder) as mine:  # released by its owner: free again
        assert mine.took_over is None


def test_a_lock_of_another_host_is_never_taken_over(tmp_path, capsys):
    folder = tmp_path / "rep"
    _write_lock(folder, pid=_dead_pid(), host="elsewhere.example")
    code = cli.main(CLI_SMALL + ["--report", str(folder)])
    err = capsys.readouterr().err
    assert code == 2 and "on host elsewhere.example" in err and "another host" in err
    assert f"remove {folder / lock.LOCK_NAME}" in err
    assert lock.read(folder)["host"] == "elsewhere.example"


def test_the_lock_is_released_when_a_run_fails(tmp_path):
    folder = tmp_path / "rep"
    (folder).mkdir()
    (folder / "results.jsonl").write_text(json.dumps({"type": "plan", "seed": 7}) + "\n")
    with pytest.raises(ValueError, match="another plan"):
        runner.run(report_dir=folder, resume=True, **SMALL)
    assert not (folder / lock.LOCK_NAME).exists()


def test_the_lock_is_reentrant_in_one_process_and_exclusive_across_processes(tmp_path):
    folder = str(tmp_path)
    with lock.acquire(folder) as outer:
        inner = lock.acquire(folder)
        assert inner is outer
        inner.release()
        assert lock.read(folder)["pid"] == os.getpid()  # still held by the outer block
        probe = subprocess.run([sys.executable, "-c", "import sys; from conformance.report import lock\n"
                                "try:\n    lock.acquire(sys.argv[1])\nexcept lock.FolderLocked as e:\n"
                                "    print(e); sys.exit(7)\n", folder],
                               capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120)
        assert probe.returncode == 7 and f"pid {os.getpid()}" in probe.stdout
    assert lock.read(folder) is None


def test_merge_into_a_folder_in_use_is_refused(tmp_path, capsys):
    assert runner.run(report_dir=tmp_path / "s1", shard=(1, 2), **SMALL).ok
    out = tmp_path / "m"
    out.mkdir()
    holder = _holder(out)
    try:
        assert merge.main([str(tmp_path / "s1"), "--out", str(out)]) == 2
        assert f"in use by another run: pid {holder.pid}" in capsys.readouterr().err
        assert not (out / "results.jsonl").exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
