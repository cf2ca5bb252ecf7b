"""The record of one conformance case and the interface every reporter implements.

The runner produces one `CaseResult` per case as it finishes and hands it to each
`Reporter`; JSON lines, JUnit XML, the HTML page, the progress bar and the final
table are all reporters, so a crash loses at most the case in flight.

A summary covers the whole plan or says it does not (`cover`): a run that was interrupted, a
shard, or a merge of some shards is `INCOMPLETE` (never AGREE), with the missing cases named.
`verdict` and `exit_status` turn a summary into the run's word and its exit status.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Protocol

from conformance.report.failure import Failure

STATUSES = ("pass", "fail", "error", "timeout", "xfail", "xpass", "unsupported")

# Exit statuses of `python -m conformance run` and `merge` (docs/reports.md).
EXIT_AGREE = 0        # every planned case ran, and none disagreed
EXIT_DISAGREE = 1     # every planned case ran, and some failed, erred or timed out (or --strict-xfails)
EXIT_USAGE = 2        # bad arguments, a platform that cannot start, a folder in use or of another plan
EXIT_INCOMPLETE = 3   # some planned cases did not run: interrupted, a process lost, shards missing
VERDICTS = ("AGREE", "DISAGREE", "INCOMPLETE")
MISSING_SHOWN = 10    # missing case ids a summary lists (the count is always there)


@dataclasses.dataclass
class CaseResult:
    """One case: what ran, how it ended, and what a person needs to reproduce it.

    status: "pass" (agreed), "fail" (disagreed), "error" (a side crashed or rejected a
    valid case), "xfail" (disagreed as the platform's xfails file expects), "xpass"
    (agreed although listed in xfails: the entry is stale), "unsupported" (the
    platform cannot run it at all; never counted as a pass), "timeout" (still running after the
    run's per-case time limit: killed with its worker).
    `details` is the case's typed failure record (`conformance.report.failure.Failure`; a dict
    given here is read with `Failure.from_json`), empty for a case that agreed.
    """

    case_id: str
    suite: str
    family: str
    dtype: str
    status: str
    examples: int = 1
    seconds: float = 0.0
    compile_seconds: float = 0.0
    message: str = ""
    repro_path: str | None = None
    details: Failure = dataclasses.field(default_factory=Failure)
    phases: dict = dataclasses.field(default_factory=dict)  # seconds per `conformance.report.timing` phase

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r}; expected one of {STATUSES}.")
        self.details = Failure.from_json(self.details)

    def to_json(self) -> dict:
        """The results.jsonl object: the fields as JSON, `details` as `Failure.to_json` writes it."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["details"] = self.details.to_json()
        return copy.deepcopy(out)

    @classmethod
    def from_json(cls, d: dict) -> "CaseResult":
        """The CaseResult of a JSON record; ValueError naming what is missing or malformed."""
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [n for n in required if n not in d]
        if missing:
            raise ValueError(f"case record {str(d)[:120]} lacks {', '.join(map(repr, missing))}; a case record "
                             f"needs {', '.join(required)}.")
        try:
            return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})
        except TypeError as e:
            raise ValueError(f"case record {str(d)[:120]} is malformed: {e}.") from None


class Reporter(Protocol):
    """Receives results as they happen. `start` gets the run's plan (platform, suites,
    seed, examples, versions); `finish` gets the summary dict the runner computes."""

    def start(self, plan: dict) -> None: ...

    def case_finished(self, result: CaseResult) -> None: ...

    def finish(self, summary: dict) -> None: ...


def summarize(results: list[CaseResult], *, wall_seconds: float, compile_seconds: float) -> dict[str, Any]:
    """Counts per status, per (suite, family, dtype), examples/s and the compile share."""
    by_status = {s: 0 for s in STATUSES}
    table: dict[tuple, dict] = {}
    examples = 0
    for r in results:
        by_status[r.status] += 1
        examples += r.examples
        row = table.setdefault((r.suite, r.family, r.dtype), {s: 0 for s in STATUSES} | {"examples": 0})
        row[r.status] += 1
        row["examples"] += r.examples
    return {
        "cases": len(results),
        "examples": examples,
        "by_status": by_status,
        "table": [dict(suite=k[0], family=k[1], dtype=k[2], **v) for k, v in sorted(table.items())],
        "wall_seconds": wall_seconds,
        "examples_per_second": examples / wall_seconds if wall_seconds > 0 else 0.0,
        "compile_seconds": compile_seconds,
        "compile_share": compile_seconds / wall_seconds if wall_seconds > 0 else 0.0,
        "ok": by_status["fail"] == 0 and by_status["error"] == 0 and by_status["timeout"] == 0,  # xpass: a stale xfail, warned about
    }


def cover(summary: dict, planned_ids, results, *, why: str | None = None, planned: int | None = None,
          missing_ids=None) -> dict:
    """Record in `summary` whether `results` cover the plan, and the verdict (returns `summary`).

    planned_ids: the plan's case ids in plan order (None when not known: then `planned`, the
    planned case count, and `missing_ids`, the missing ids known, say what is missing). Sets
    ``complete``, ``planned_cases``, ``missing_cases`` (a count), ``missing_case_ids`` (the first
    `MISSING_SHOWN`, plan order), ``interrupted`` (`why` the run stopped early, when given and
    something is missing) and ``verdict``; an incomplete summary is never ``ok``.
    """
    got = {r.case_id for r in results}
    if planned_ids is not None:
        planned_ids = list(planned_ids)
        missing = [c for c in planned_ids if c not in got]
        n_planned, n_missing = len(planned_ids), len(missing)
    else:
        missing = [c for c in (missing_ids or ()) if c not in got]
        n_planned = planned if planned is not None else len(got)
        n_missing = max(n_planned - len(got), len(missing))
    summary["planned_cases"] = n_planned
    summary["missing_cases"] = n_missing
    summary["missing_case_ids"] = missing[:MISSING_SHOWN]
    summary["complete"] = n_missing == 0 and not summary.get("missing_shards")
    if not summary["complete"]:
        summary["ok"] = False
        if why:
            summary["interrupted"] = why
    summary["verdict"] = verdict(summary)
    return summary


def verdict(summary: dict) -> str:
    """"INCOMPLETE" when the summary does not cover its plan, else "AGREE" or "DISAGREE" (its ``ok``).
    A summary written before plans were checked for coverage (no ``complete`` key) counts as complete."""
    if not summary.get("complete", True):
        return "INCOMPLETE"
    by = summary.get("by_status", {})
    ok = summary.get("ok", not (by.get("fail") or by.get("error") or by.get("timeout")))
    return "AGREE" if ok else "DISAGREE"


def exit_status(summary: dict) -> int:
    """`EXIT_AGREE`, `EXIT_DISAGREE` or `EXIT_INCOMPLETE` for the verdict of `summary`."""
    return {"AGREE": EXIT_AGREE, "DISAGREE": EXIT_DISAGREE, "INCOMPLETE": EXIT_INCOMPLETE}[verdict(summary)]


def missing_text(summary: dict) -> str:
    """What an incomplete summary lacks, in one line: ``16 of 24 planned cases did not run (interrupted
    by SIGINT); missing shards 2/2; first missing: a, b, ... (and 6 more)``; "" when complete."""
    if summary.get("complete", True):
        return ""
    n, planned = summary.get("missing_cases", 0), summary.get("planned_cases", 0)
    text = f"{n} of {planned} planned case{'' if planned == 1 else 's'} did not run"
    if summary.get("interrupted"):
        text += f" ({summary['interrupted']})"
    if summary.get("missing_shards"):
        text += f"; missing shard{'' if len(summary['missing_shards']) == 1 else 's'} " + ", ".join(
            summary["missing_shards"])
    ids = summary.get("missing_case_ids") or []
    if ids:
        more = n - len(ids)
        text += "; missing: " + ", ".join(ids) + (f" (and {more} more)" if more > 0 else "")
    return text
