"""Report files: anything but a regular file is refused at once, and a failed write names its file
(issue 28, points 5 and 7). A FIFO in place of results.jsonl blocked `--resume` forever in
open(); a full disk printed "[Errno 28] No space left on device" and nothing else.

The disk is made full by replacing os.fsync (every report write is fsync'ed) in a small driver
script; nothing fills a real disk. A reader blocked on a FIFO by a regression is released by a
writer thread after a while, so a regression fails the test instead of hanging it."""
import errno
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from conformance.report import (HTML_NAME, JSONL_NAME, JUNIT_NAME, JsonlReporter, load_finished,
                                prepare_report_dir, read_records)
from conformance.report import lock as lock_mod
from conformance.report.files import check_regular, kind, write_error
from conformance.report.junit import atomic_write

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CLI_SMALL = ["run", "--suite", "layouts", "--examples", "1", "--no-progress", "--processes", "1"]


def _fifo(path):
    os.mkfifo(path)

    def release():  # a blocked reader (a regression) gets end-of-file instead of waiting forever
        import time

        time.sleep(20)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass

    threading.Thread(target=release, daemon=True).start()
    return path


def _cli(*argv, driver=None, env=None, timeout=120):
    cmd = [sys.executable, "-c", driver, *argv] if driver else [sys.executable, "-m", "conformance", *argv]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})))


def _one_error_line(r, code=2):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith(("WARNING", "I0000", "E0000"))]
    assert r.returncode == code, r.stderr + r.stdout
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


# -- not a regular file ------------------------------------------------------------------------------------------------
def test_resume_from_a_fifo_is_refused_at_once(tmp_path):
    rep = tmp_path / "rep"
    rep.mkdir()
    _fifo(rep / JSONL_NAME)
    line = _one_error_line(_cli(*CLI_SMALL, "--report", str(rep), "--resume", timeout=15))
    assert line == (f"error: report folder --report {str(rep)!r}: {JSONL_NAME} there is a FIFO (named pipe); remove it "
                    "or pass another folder."), line


@pytest.mark.parametrize("name", [JSONL_NAME, JUNIT_NAME, HTML_NAME, lock_mod.LOCK_NAME])
def test_a_report_file_that_is_a_fifo_or_a_device_is_refused_before_anything_is_written(tmp_path, name):
    rep = tmp_path / "rep"
    rep.mkdir()
    _fifo(rep / name)
    with pytest.raises(ValueError, match=f"{name} there is a FIFO"):
        prepare_report_dir(rep)
    assert os.listdir(rep) == [name]
    dev = tmp_path / "dev"
    dev.mkdir()
    os.symlink("/dev/null", dev / name)  # a link is followed: to a character device
    with pytest.raises(ValueError, match=f"{name} there is a character device"):
        prepare_report_dir(dev)


def test_readers_refuse_a_fifo_without_opening_it(tmp_path):
    path = _fifo(tmp_path / JSONL_NAME)
    for read in (read_records, load_finished, lambda p: JsonlReporter(p, resume=True).start({"type": "plan"})):
        with pytest.raises(ValueError, match=r"results file .*results.jsonl is a FIFO \(named pipe\), not a regular "
                                             "file; remove it"):
            read(path)
    assert lock_mod.read(tmp_path) is None  # no lock there (and nothing blocked)
    _fifo(tmp_path / lock_mod.LOCK_NAME)
    assert lock_mod.read(tmp_path) is None
    with pytest.raises(ValueError, match="the folder's lock .*conformance.lock is a FIFO"):
        lock_mod.acquire(tmp_path)


def test_merge_refuses_a_fifo(tmp_path):
    rep = tmp_path / "rep"
    rep.mkdir()
    _fifo(rep / JSONL_NAME)
    line = _one_error_line(_cli("merge", str(rep), "--out", str(tmp_path / "out"), timeout=15))
    assert "results.jsonl is a FIFO (named pipe), not a regular file" in line


def test_kind_names_what_a_path_is(tmp_path):
    (tmp_path / "f").write_text("")
    assert kind(tmp_path / "f") is None and kind(tmp_path / "missing") is None
    assert kind(tmp_path) == "a folder" and kind("/dev/null") == "a character device"
    check_regular(tmp_path / "f", "x")
    check_regular(tmp_path / "missing", "x")


# -- a full disk -------------------------------------------------------------------------------------------------------
FULL = textwrap.dedent("""
    import errno, os, sys
    real, seen = os.fsync, {}

    def fsync(fd):  # the disk fills up at the FULL_AFTER+1-th fsync of the file named FULL_AT
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name.startswith(os.environ["FULL_AT"]):
            seen[name] = seen.get(name, 0) + 1
            if seen[name] > int(os.environ["FULL_AFTER"]):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    if __name__ == "__main__":
        os.fsync = fsync
        from conformance.cli import main
        sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="the driver names files by /proc/self/fd")
@pytest.mark.parametrize("at, after", [(lock_mod.LOCK_NAME, 0), (JSONL_NAME, 1)])
def test_a_full_disk_names_the_file_and_the_folder(tmp_path, at, after):
    rep = tmp_path / "rep"
    r = _cli(*CLI_SMALL, "--report", str(rep), driver=FULL, env={"FULL_AT": at, "FULL_AFTER": str(after)})
    line = _one_error_line(r)
    assert line == (f"error: [Errno 28] No space left on device: cannot write {rep / at} (in folder {rep}); free "
                    f"space on the disk of {rep} (or raise its quota), or pass a --report folder on another disk"), line
    assert not (rep / lock_mod.LOCK_NAME).exists()  # the lock never stays behind
    assert not [n for n in os.listdir(rep) if ".tmp" in n]


def test_atomic_writes_name_their_file_and_leave_no_temporary(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    target = tmp_path / JUNIT_NAME
    with pytest.raises(OSError) as info:
        atomic_write(str(target), b"<testsuites/>")
    assert info.value.errno == errno.ENOSPC and str(target) in str(info.value) and "free space" in str(info.value)
    assert os.listdir(tmp_path) == []


def test_other_write_errors_keep_their_class_and_errno(tmp_path):
    err = write_error(tmp_path / "x", PermissionError(errno.EACCES, "Permission denied"))
    assert isinstance(err, PermissionError) and err.errno == errno.EACCES
    assert str(err) == (f"[Errno 13] Permission denied: cannot write {tmp_path / 'x'} (in folder {tmp_path}); check "
                        f"that {tmp_path} is writable, or pass another --report folder")
    assert isinstance(write_error(tmp_path / "d", IsADirectoryError(errno.EISDIR, "Is a directory")), IsADirectoryError)
