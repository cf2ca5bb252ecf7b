"""The record of one conformance case and the interface every reporter implements.

The runner produces one `CaseResult` per case as it finishes and hands it to each
`Reporter`; JSON lines, JUnit XML, the HTML page, the progress bar and the final
table are all reporters, so a crash loses at most the case in flight.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol

STATUSES = ("pass", "fail", "error", "timeout", "xfail", "xpass", "unsupported")


@dataclasses.dataclass
class CaseResult:
    """One case: what ran, how it ended, and what a person needs to reproduce it.

    status: "pass" (agreed), "fail" (disagreed), "error" (a side crashed or rejected a
    valid case), "xfail" (disagreed as the platform's xfails file expects), "xpass"
    (agreed although listed in xfails: the entry is stale), "unsupported" (the
    platform cannot run it at all; never counted as a pass), "timeout" (still running after the
    run's per-case time limit: killed with its worker).
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
    details: dict = dataclasses.field(default_factory=dict)
    phases: dict = dataclasses.field(default_factory=dict)  # seconds per `conformance.report.timing` phase

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r}; expected one of {STATUSES}.")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

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
