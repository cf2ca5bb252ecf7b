"""The files of a report folder: only regular files are read, and a failed write names its file.

A FIFO in place of results.jsonl made `--resume` block forever in `open()`; a full disk printed
"[Errno 28] No space left on device" without saying which file. `check_regular` refuses anything
but a regular file (or a missing one) before it is opened; `writing(path)` turns an OSError of a
write into one naming the file, its folder and the fix, with the same errno (and class).

    from conformance.report.files import check_regular, writing
    check_regular("out/results.jsonl", "the results file")   # ValueError if a FIFO, device, folder...
    with writing("out/results.jsonl"):
        ...  # an OSError here: "[Errno 28] No space left on device: cannot write out/results.jsonl ..."
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat

__all__ = ["check_regular", "kind", "write_error", "writing"]

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG)


def kind(path) -> str | None:
    """None for a regular file (a symbolic link is followed) or a missing path; else what it is."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_regular(path, what: str) -> None:
    """ValueError naming `path` when it exists and is not a regular file: reading a FIFO or a
    device would block or never end, and writing one would not keep what was written."""
    found = kind(path)
    if found is not None:
        raise ValueError(f"{what} {os.fspath(path)!s} is {found}, not a regular file; remove it (or pass another "
                         "--report folder): a report folder's files are read and rewritten in place.")


def write_error(path, exc: OSError) -> OSError:
    """`exc` (an OSError of writing `path`) with a message naming the file, its folder and the fix."""
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    fix = (f"free space on the disk of {folder} (or raise its quota), or pass a --report folder on another disk"
           if exc.errno in _FULL else f"check that {folder} is writable, or pass another --report folder")
    return OSError(exc.errno, f"{exc.strerror or exc}: cannot write {path} (in folder {folder}); {fix}")


@contextlib.contextmanager
def writing(path):
    """Run the body; an OSError raised in it becomes `write_error(path, ...)` (chained)."""
    try:
        yield
    except OSError as e:
        raise write_error(path, e) from e
