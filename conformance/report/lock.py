"""One run at a time per report folder: the lock file ``DIR/conformance.lock``.

Two runs writing one folder would interleave (or overwrite) each other's results.jsonl, junit.xml
and report.html, and both would name the folder as their report. A run (and `merge`, for its
``--out`` folder) therefore takes the folder's lock before it reads or writes anything there:

* the lock is an OS-level lock: an exclusive ``flock`` on the lock file, held for the run's life
  and dropped by the kernel when the owner dies, however it dies; the file holds one JSON object
  (the owner's ``pid``, ``host``, ``started`` (ISO time) and ``command``) only so that a refusal
  can name the owner;
* a second run whose ``flock`` is refused fails at once (`FolderLocked`, a ValueError: one line
  and exit status 2 at the command line) naming the owner's pid, host, start time and command,
  and how to go on: wait for it, pass another folder, or remove the lock if that run is over;
* a lock file nobody holds the ``flock`` of was left behind by a run that died (kill -9, a
  power cut, a reboot): it is taken over whatever pid it records (after a restart its pid may
  name an unrelated live process), and the run says so (`FolderLock.took_over` holds the old
  owner). A lock file written on another host is never taken over: a network file system may not
  show this host the other host's ``flock``, so this host cannot tell whether that run goes on.
  Where the file system has no ``flock`` (or the platform none), a recorded pid that runs on this
  host still keeps the lock.

The lock is released (the file removed) when the run ends, also when it is interrupted or fails.
Within one process the lock is re-entrant: the command line takes it before the platform check,
and the runner takes it again.
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import socket
import sys
import time

from conformance.report import files

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: the pid check alone
    fcntl = None

__all__ = ["LOCK_NAME", "FolderLock", "FolderLocked", "acquire", "describe", "read"]

LOCK_NAME = "conformance.lock"
_EMPTY_WAIT_S = 2.0   # how long an empty lock file (its owner between creating and writing it) is waited for
_HELD: dict = {}      # realpath of a folder -> the FolderLock this process holds on it


class FolderLocked(ValueError):
    """The report folder is in use by another run; the message names it and how to go on."""


def _command() -> str:
    argv = list(sys.argv)
    if argv and argv[0].endswith(os.path.join("conformance", "__main__.py")):
        return shlex.join(["python", "-m", "conformance"] + argv[1:])
    return shlex.join(argv) if argv and argv[0] else "python"


def describe(info: dict) -> str:
    """``pid 123 on host h (started 2025-01-02T03:04:05, command: python -m conformance run ...)``."""
    return (f"pid {info.get('pid', '?')} on host {info.get('host', '?')} (started {info.get('started', '?')}, "
            f"command: {info.get('command', '?')})")


def read(folder) -> dict | None:
    """The owner record of ``folder``'s lock; None when there is no lock (or it cannot be read)."""
    path = os.path.join(os.fspath(folder), LOCK_NAME)
    if files.kind(path) is not None:  # a FIFO would block the read
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return _parse(fh.read())
    except OSError:
        return None


def _parse(text: str) -> dict | None:
    try:
        info = json.loads(text)
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def _alive(pid) -> bool:
    """Whether process `pid` runs on this host (a zombie, dead but not yet reaped, counts as dead)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _try_flock(fd: int) -> bool | None:
    """Take the exclusive OS-level lock of `fd` without waiting: True (taken), False (another
    open file holds it), None (no flock here: the platform or the file system has none)."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None  # a file system without flock: the pid check alone decides
    return True


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read_fd(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while True:
        block = os.read(fd, 65536)
        if not block:
            break
        chunks.append(block)
    return _parse(b"".join(chunks).decode("utf-8", "replace"))


def _write_fd(fd: int, info: dict) -> None:
    data = (json.dumps(info) + "\n").encode("utf-8")
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, data)
    os.fsync(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _busy(folder: str, path: str, owner: dict | None, *, why: str) -> FolderLocked:
    who = describe(owner) if owner else "a run whose lock file cannot be read"
    return FolderLocked(
        f"report folder {folder!r} is in use by another run: {who}; {why}. Wait for that run to finish, pass "
        f"another --report folder, or, if that run is over, remove {path}.")


class FolderLock:
    """A held lock of a report folder: `release()` (or leave the `with` block) to free it.

    info: this run's owner record; took_over: the record of a dead run whose stale lock this one
    took over (None otherwise)."""

    def __init__(self, folder: str, path: str, fd: int, info: dict, took_over: dict | None):
        self.folder, self.path, self.info, self.took_over = folder, path, info, took_over
        self._fd = fd
        self._depth = 1

    @property
    def held(self) -> bool:
        return self._fd is not None

    def note(self) -> str:
        """The line a run prints when it took over a stale lock ("" otherwise)."""
        if not self.took_over:
            return ""
        return (f"note: report folder {self.folder!r} was locked by {describe(self.took_over)}, which is no "
                f"longer running on this host (no process holds the lock); this run took the lock over.")

    def release(self) -> None:
        if self._fd is None:
            return
        self._depth -= 1
        if self._depth > 0:
            return
        fd, self._fd = self._fd, None
        _HELD.pop(os.path.realpath(self.folder), None)
        try:
            if _same_file(fd, self.path):
                os.unlink(self.path)  # before closing: nobody can take the flock of a file still named
        except OSError:
            pass
        finally:
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def acquire(folder, *, command: str | None = None) -> FolderLock:
    """Take the lock of report folder `folder` (it must exist) for this process.

    Raises `FolderLocked` naming the other run when one holds its OS-level lock; takes over (and
    records in `FolderLock.took_over`) a lock file of this host that no process holds, whatever
    pid it records. Re-entrant in one process.
    """
    folder = os.fspath(folder)
    key = os.path.realpath(folder)
    mine = _HELD.get(key)
    if mine is not None and mine.held and mine.info.get("pid") == os.getpid():
        mine._depth += 1
        return mine
    path = os.path.join(folder, LOCK_NAME)
    files.check_regular(path, "the folder's lock")  # a FIFO there would block reading the owner
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.datetime.now().replace(microsecond=0).isoformat(),
            "command": command or _command()}
    empty_since = None
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            pass
        else:
            _try_flock(fd)  # a new file: nobody else can hold it yet
            try:
                with files.writing(path):
                    _write_fd(fd, info)
            except BaseException:
                os.close(fd)  # an empty or partial lock left here would hold the folder up
                _remove_quietly(path)
                raise
            lock = FolderLock(folder, path, fd, info, None)
            _HELD[key] = lock
            return lock
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue  # released meanwhile: try to create it again
        keep = False
        try:
            flocked = _try_flock(fd)
            if flocked is False:
                owner = _read_fd(fd)
                if owner is None:  # the owner is between creating and writing its lock
                    empty_since = empty_since or time.monotonic()
                    if time.monotonic() - empty_since < _EMPTY_WAIT_S:
                        time.sleep(0.02)
                        continue
                raise _busy(folder, path, owner, why="it holds the folder's lock")
            if not _same_file(fd, path):
                continue  # released (and maybe taken again) between open and flock: look again
            owner = _read_fd(fd)
            if owner is None:
                empty_since = empty_since or time.monotonic()
                if time.monotonic() - empty_since < _EMPTY_WAIT_S:
                    if flocked:
                        fcntl.flock(fd, fcntl.LOCK_UN)
                    time.sleep(0.02)
                    continue
                owner = {}  # an empty lock nobody holds: its run died before writing it
            elif owner.get("host") != socket.gethostname():
                raise _busy(folder, path, owner, why="it runs on another host, so this host cannot tell whether "
                                                     "it still goes on")
            elif flocked is None and _alive(owner.get("pid")):
                # no flock to ask: a live pid may be the owner (with a flock, nobody holding it settles it)
                raise _busy(folder, path, owner, why=f"pid {owner.get('pid')} is running on this host")
            with files.writing(path):
                _write_fd(fd, info)  # stale: take it over, under our flock
            keep = True
            lock = FolderLock(folder, path, fd, info, owner or {"pid": "?", "host": socket.gethostname()})
            _HELD[key] = lock
            return lock
        finally:
            if not keep:
                os.close(fd)
