"""A hunt's findings on disk: one folder per distinct failure, and their root causes.

``DIR/findings/NNN-stage-op/`` holds everything about finding NNN, each file once:

* ``finding.json``: the record (`Finding`): signature (stage, op, error class), how often it was
  seen, the first case, the message, the root cause (`conformance.upstream.causes.cause_key`),
  the known bug it is (docs/found-bugs.md) or none, and the upstream report's summary;
* ``repro.py``: the project's reproducer (format v1, refsim's values embedded), which
  ``python -m conformance bisect`` and ``explain`` read;
* ``case.json``: the shrunk program as data, which ``python -m conformance hunt --check`` runs;
* ``upstream.py`` and ``UPSTREAM.md``: the plain-JAX script and the issue body
  (`conformance.upstream.report`).

``DIR/findings/CAUSES.md`` lists the findings grouped by root cause, each group new or known.
`earlier_findings` reads the records back (JSON only) so a rerun on the same folder keeps their
numbers; a folder without a readable record is skipped.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re

from conformance.upstream.causes import group

__all__ = ["CAUSES", "RECORD", "Finding", "causes", "earlier_findings", "print_findings", "write_causes",
           "write_record"]

RECORD = "finding.json"
CAUSES = "CAUSES.md"
FORMAT = "conformance-hunt-finding-1"


@dataclasses.dataclass
class Finding:
    """One distinct failure: its signature, how often it was seen, and where its files are."""

    stage: str
    op: str
    error: str
    count: int
    case_id: str
    status: str
    path: str | None = None     # the project's reproducer (repro.py)
    message: str = ""
    number: int = 0             # its NNN in findings/
    earlier: bool = False       # first written by an earlier hunt on this report folder
    folder: str | None = None
    cause: str = ""
    digest: str = ""            # the shrunk program's (`conformance.hunt.program_digest`)
    known: int | None = None    # its docs/found-bugs.md number
    known_why: str = ""
    upstream: dict | None = None   # `conformance.upstream.report.UpstreamReport.to_json()`
    note: str = ""

    @property
    def signature(self) -> tuple:
        return (self.stage, self.op, self.error)

    def verdict(self) -> str:
        """"known: found-bugs N" or "new" (or why there is nothing to file)."""
        if self.known is not None:
            return f"known: found-bugs {self.known}"
        if self.stage == "refsim":
            return "refsim's own defect (not for upstream)"
        if self.upstream is not None and not self.upstream.get("reproduces"):
            return "new, but its plain-JAX script does not reproduce it"
        like = (self.upstream or {}).get("resembles")
        return f"new (resembles found-bugs {like['number']})" if like else "new"


def write_record(finding: Finding) -> None:
    with open(os.path.join(finding.folder, RECORD), "w", encoding="utf-8") as fh:
        json.dump({"format": FORMAT, **dataclasses.asdict(finding)}, fh, indent=1, default=str)


_NUMBERED = re.compile(r"^(\d+)-")


def earlier_findings(findings_dir: str) -> tuple[dict, int]:
    """({(stage, op, error): Finding} of the findings in `findings_dir`, the highest number used)."""
    known, top = {}, 0
    try:
        names = sorted(os.listdir(findings_dir))
    except OSError:
        return known, top
    fields = {f.name for f in dataclasses.fields(Finding)}
    for name in names:
        num = _NUMBERED.match(name)
        if not num:
            continue
        top = max(top, int(num.group(1)))
        try:
            with open(os.path.join(findings_dir, name, RECORD), encoding="utf-8") as fh:
                doc = json.load(fh)
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                continue
            f = Finding(**{k: v for k, v in doc.items() if k in fields})
        except (OSError, UnicodeDecodeError, ValueError, TypeError):
            continue
        if not all(isinstance(x, str) for x in f.signature) or f.signature in known:
            continue
        known[f.signature] = dataclasses.replace(f, count=0, earlier=True, number=int(num.group(1)))
    return known, top


def causes(findings: list) -> list:
    """The root causes of `findings` (`conformance.upstream.causes.group`), as JSON-able dicts."""
    rows = [{"number": f.number, "cause": f.cause or " ".join(f.signature), "digest": f.digest,
             "known": f.known, "known_why": f.known_why} for f in sorted(findings, key=lambda f: f.number)]
    return [c.to_json() for c in group(rows)]


def write_causes(findings_dir: str, findings: list) -> list:
    """Write ``CAUSES.md`` (the findings grouped by root cause) and return the groups."""
    groups = causes(findings)
    by_number = {f.number: f for f in findings}
    lines = ["# Findings by root cause", "",
             "Each group is one defect to file (or one already known): its findings share a fatal CHECK or an error "
             "message with the numbers dropped, the same wrong op and sharding pattern, the same minimal program, "
             "or the same known bug (docs/found-bugs.md).", "",
             "| cause | findings | status | why one group |", "|---|---|---|---|"]
    for g in groups:
        nums = ", ".join(f"[{n:03d}]({os.path.basename(by_number[n].folder or '')}/UPSTREAM.md)"
                         if by_number[n].folder else f"{n:03d}" for n in g["findings"])
        status = f"known: found-bugs {g['known']}" if g["known"] is not None else by_number[g["findings"][0]].verdict()
        lines.append(f"| {g['key'].replace('|', '/')} | {nums} | {status} | {'; '.join(g['why']).replace('|', '/')} |")
    with open(os.path.join(findings_dir, CAUSES), "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return groups


def print_findings(result, out=print) -> None:
    """The closing table of a `conformance.hunt.HuntResult`: one row per distinct failure, then
    the root causes."""
    state = "partial hunt (stopped by a signal)" if result.partial else "hunt"
    new = sum(1 for f in result.findings if f.known is None)
    out(f"{state}: {result.programs} programs in {result.minutes:.1f} min (seed {result.seed}), "
        f"{len(result.findings)} distinct failure(s): {new} new, {len(result.findings) - new} known")
    if result.findings:
        out(f"{'#':>3} {'stage':<22} {'count':>5}  {'op':<26} error")
        for f in sorted(result.findings, key=lambda f: f.number):
            out(f"{f.number:>3} {f.stage:<22} {f.count:>5}  {f.op[:26]:<26} {f.error[:80]}")
            out(f"{'':>3} {'':<22} {'':>5}  {f.verdict()}" + (f"; {f.folder}" if f.folder else "")
                + (" (an earlier hunt's finding)" if f.earlier else ""))
    if result.causes:
        out(f"{len(result.causes)} root cause(s):")
        for c in result.causes:
            status = f"known: found-bugs {c['known']}" if c["known"] is not None else "new"
            out(f"  {', '.join(f'{n:03d}' for n in c['findings'])}: {status}: {c['key'][:110]}")
    for err in result.generator_errors:
        out(f"strategy defect (a batch could not be drawn): {err.splitlines()[0]}")
    out(f"report: {result.report_dir}/results.jsonl, {result.report_dir}/findings/ (CAUSES.md, one folder per "
        f"finding), {result.report_dir}/hunt.json")
