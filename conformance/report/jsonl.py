"""JSON-lines results: the record a crash cannot lose and `--resume` continues from.

The file holds one JSON object per line: a ``{"type": "plan", ...}`` line when a run
starts, one ``{"type": "case", ...CaseResult fields}`` line per finished case
(written, flushed and fsync'ed before the next case starts) and a
``{"type": "summary", ...}`` line when the run ends. A run killed mid-write leaves
at most one truncated last line, which `load_finished` ignores.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from conformance.report.files import check_regular, writing
from conformance.report.results import CaseResult

__all__ = ["JsonlReporter", "load_finished", "read_records"]


def _json_default(obj: Any):
    """JSON for what `details` may carry besides plain data: NumPy scalars/arrays, sets, tuples' kin."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    return repr(obj)


def dumps(record: dict) -> str:
    """One line of JSON (no embedded newlines; non-finite floats as JSON's NaN/Infinity extension)."""
    return json.dumps(record, default=_json_default, ensure_ascii=False, separators=(",", ":"))


def read_records(path) -> list[dict]:
    """Every complete record of a results file, in order.

    A last line that is not valid JSON (a crash mid-write) is dropped; an invalid line
    anywhere else means the file was edited or corrupted and raises ValueError.
    """
    check_regular(path, "results file")  # a FIFO would block open() forever
    with open(path, "rb") as fh:
        raw = fh.read()
    lines = raw.split(b"\n")
    complete_tail = raw.endswith(b"\n")
    records = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if n == len(lines) and not complete_tail:
                break  # the truncated last line of a crashed run
            raise ValueError(
                f"{os.fspath(path)!s} line {n} is not a JSON record ({exc}); only the last line may be "
                "truncated. Delete the damaged line or start without --resume."
            ) from None
        if not isinstance(rec, dict) or "type" not in rec:
            raise ValueError(f"{os.fspath(path)!s} line {n} is not a conformance record "
                             f"(expected an object with a 'type' key, got {line[:80]!r}).")
        records.append(rec)
    return records


def load_finished(path) -> dict[str, CaseResult]:
    """The finished cases of a results file by case id (a later record of a case wins).

    A missing file gives {} (nothing finished yet), so `--resume` on a fresh folder
    simply starts.
    """
    if not os.path.exists(path):
        return {}
    out: dict[str, CaseResult] = {}
    for rec in read_records(path):
        if rec["type"] == "case":
            try:
                result = CaseResult.from_json(rec)
            except ValueError as e:
                raise ValueError(f"{os.fspath(path)!s}: {e} Delete the record or start without --resume.") from None
            out[result.case_id] = result
    return out


class JsonlReporter:
    """Writes `path` as described in the module docstring; each case is on disk when `case_finished` returns.

    resume=False starts a new file. resume=True keeps the finished cases of an earlier run
    (dropping a truncated last line and the old summary), appends a new plan line marked
    ``"resumed": true``, and skips a case whose identical record is already there, so a
    runner may replay loaded results to every reporter without duplicating them.
    """

    def __init__(self, path, *, resume: bool = False):
        self.path = os.fspath(path)
        self.resume = resume
        self._fh = None
        self._known: dict[str, dict] = {}

    # -- Reporter -----------------------------------------------------------------------
    def start(self, plan: dict) -> None:
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        kept: list[dict] = []
        if self.resume and os.path.exists(self.path):
            kept = [r for r in read_records(self.path) if r["type"] != "summary"]
            for r in kept:
                if r["type"] == "case":
                    self._known[r["case_id"]] = r
        # Rewrite through a temporary file so the kept records survive a crash right here.
        tmp = self.path + ".tmp"
        try:
            with writing(self.path):
                with open(tmp, "w", encoding="utf-8") as fh:
                    for r in kept:
                        fh.write(dumps(r) + "\n")
                    fh.write(dumps({"type": "plan", **plan, "resumed": bool(kept)}) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
        except BaseException:
            if os.path.isfile(tmp):
                os.remove(tmp)  # never leave a .tmp file behind
            raise
        with writing(self.path):
            self._fh = open(self.path, "a", encoding="utf-8")

    def case_finished(self, result: CaseResult) -> None:
        record = {"type": "case", **result.to_json()}
        # Compare through JSON so a replayed result matches the record it was loaded from.
        if json.loads(dumps(record)) == self._known.get(result.case_id):
            return
        self._write(record)
        self._known[result.case_id] = record

    def finish(self, summary: dict) -> None:
        self._write({"type": "summary", **summary})
        self.close()

    # -- helpers ------------------------------------------------------------------------
    def _write(self, record: dict) -> None:
        if self._fh is None:
            raise RuntimeError(f"JsonlReporter({self.path!r}) is not started; call start(plan) before reporting cases.")
        with writing(self.path):
            self._fh.write(dumps(record) + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
