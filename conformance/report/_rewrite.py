"""The shared life cycle of reporters that rewrite one whole file (JUnit XML, the HTML page), and
the atomic write they share."""
from __future__ import annotations

import os

from conformance.report.files import writing
from conformance.report.results import CaseResult


class RewritingReporter:
    """Keeps the latest result per case id and rewrites its file at `start`, every `every`
    finished cases and at `finish`, so a crash always leaves a complete file behind.

    Subclasses implement `_render(summary, finished) -> bytes`; `_prepare(plan)` may add to the plan.
    """

    def __init__(self, path, *, every: int):
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"every={every!r}; pass how many cases to finish between rewrites, an int >= 1.")
        self.path = os.fspath(path)
        self.every = every
        self.results: dict[str, CaseResult] = {}
        self._plan: dict = {}
        self._since = 0

    def start(self, plan: dict) -> None:
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self._plan = dict(plan)
        self._prepare(self._plan)
        self._write(None, finished=False)

    def case_finished(self, result: CaseResult) -> None:
        self._record(result)
        self._since += 1
        if self._since >= self.every:
            self._write(None, finished=False)

    def finish(self, summary: dict) -> None:
        self._write(summary, finished=True)

    def _prepare(self, plan: dict) -> None:
        pass

    def _record(self, result: CaseResult) -> None:
        self.results[result.case_id] = result  # a re-run case replaces its earlier record

    def _write(self, summary, *, finished: bool) -> None:
        self._since = 0
        atomic_write(self.path, self._render(summary, finished))

    def _render(self, summary, finished: bool) -> bytes:
        raise TypeError(f"{type(self).__name__} must define _render(summary, finished) -> bytes")


def atomic_write(path: str, data: bytes) -> None:
    """Write through a temporary file and rename, so a reader never sees half a document."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with writing(path):  # a failure names the file, its folder and the fix
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)  # never leave a .tmp file behind
        raise


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
