"""JUnit XML for CI systems (Jenkins, GitLab, GitHub test reporters).

One ``<testsuite>`` per conformance suite, one ``<testcase>`` per case (``classname``
``conformance.<suite>.<family>``, ``name`` the case id). A disagreement is a
``<failure>``, a crash or a wrongly rejected case an ``<error>``; "xfail" and
"unsupported" cases are ``<skipped>`` with their reason, and "xpass" (a stale xfails
entry) passes with a warning in ``<system-out>``. The file is rewritten atomically
every `every` cases and at the end, so a crash always leaves a valid document. A document that
does not cover its plan (written mid-run, or an INCOMPLETE run) has ``complete=false`` and one
failing test case saying what is missing: it never reads as a pass.
"""
from __future__ import annotations

import datetime
import re
import socket
import xml.etree.ElementTree as ET

from conformance.report._rewrite import RewritingReporter, atomic_write
from conformance.report.results import CaseResult

__all__ = ["JUnitReporter", "atomic_write", "to_xml"]

# Characters XML 1.0 forbids (C0 controls except tab/newline/return, lone surrogates, U+FFFE/F);
# a mismatch message may carry raw bytes or ANSI colour codes.
_ILLEGAL_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_MESSAGE_LIMIT = 1000  # characters of the one-line `message` attribute; the full text is the element body


def _clean(text) -> str:
    return _ILLEGAL_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def _first_line(text: str) -> str:
    # split on "\n" only: str.splitlines would also break at vertical tab and form feed
    for line in str(text).split("\n"):
        if line.strip(" \t\r"):
            return line.strip(" \t\r")[:_MESSAGE_LIMIT]
    return ""


def _case_element(r: CaseResult) -> ET.Element:
    tc = ET.Element("testcase", classname=_clean(f"conformance.{r.suite}.{r.family}"), name=_clean(r.case_id),
                    time=f"{r.seconds:.3f}")
    body, d = r.message, r.details
    if d.report and d.report not in body:
        body = f"{body}\n\n{d.report}" if body else d.report
    if r.repro_path:
        body += f"\n\nreproducer: {r.repro_path}"
    if d.stage:
        body += f"\n{d.stage_line()}"
    if r.status == "fail":
        el = ET.SubElement(tc, "failure", message=_clean(_first_line(r.message) or "refsim and XLA disagree"),
                           type="mismatch")
        el.text = _clean(body)
    elif r.status in ("error", "timeout"):
        el = ET.SubElement(tc, "error", message=_clean(_first_line(r.message) or r.status),
                           type=_clean("timeout" if r.status == "timeout" else d.exception_type or "error"))
        el.text = _clean(body + ("\n\n" + d.traceback if d.traceback else ""))
    elif r.status in ("xfail", "unsupported"):
        what = "expected failure" if r.status == "xfail" else "unsupported on this platform"
        reason = _first_line(r.message)
        ET.SubElement(tc, "skipped", message=_clean(f"{what}: {reason}" if reason else what), type=r.status)
    elif r.status == "xpass":
        out = ET.SubElement(tc, "system-out")
        out.text = _clean(f"warning: stale xfail entry: {r.case_id} passed although the xfails file expects it to "
                          f"fail ({r.message or 'no reason given'}); remove the entry.")
    # pytest's layout: <properties> is the first child of <testcase>
    props = ET.Element("properties")
    for key, value in (("status", r.status), ("dtype", r.dtype), ("examples", r.examples),
                       ("compile_seconds", f"{r.compile_seconds:.3f}")):
        ET.SubElement(props, "property", name=key, value=_clean(value))
    tc.insert(0, props)
    return tc


def _counts(results) -> dict:
    return {
        "tests": len(results),
        "failures": sum(r.status == "fail" for r in results),
        "errors": sum(r.status in ("error", "timeout") for r in results),
        "skipped": sum(r.status in ("xfail", "unsupported") for r in results),
        "time": sum(r.seconds for r in results),
    }


def _incomplete_element(results, plan: dict, summary: dict | None) -> ET.Element:
    """The ``<testcase>`` that fails a document which does not cover its plan, so that a CI system
    reading only the JUnit file never shows a partial run as a pass."""
    from conformance.report.results import missing_text

    if summary is None:  # written mid-run: the run is still going, or was killed
        planned = plan.get("cases")
        text = (f"the run has not finished (or was killed): {len(results)} of "
                f"{planned if planned is not None else '?'} planned cases recorded so far")
    else:
        text = missing_text(summary) or "the run does not cover its plan"
    tc = ET.Element("testcase", classname="conformance.run", name="every planned case ran", time="0.000")
    el = ET.SubElement(tc, "error", message=_clean(_first_line(text)), type="incomplete")
    el.text = _clean(text + "\n\nThe verdict is INCOMPLETE: the cases that did not run are not a pass. Resume the "
                            "run with --resume (or merge the missing shards) to complete it.")
    return tc


def to_xml(results: list[CaseResult], plan: dict | None = None, *, timestamp: str | None = None,
           complete: bool = True, summary: dict | None = None) -> bytes:
    """The JUnit document (UTF-8 bytes) for `results`, suites in order of first appearance.

    `plan` entries become ``<property>`` elements of every suite (not its ``case_ids``); ``complete=False``
    marks a document that does not cover its plan (property ``complete`` = ``false``): written
    mid-run (`summary` None) or for an INCOMPLETE summary. Such a document also holds one
    ``<error type="incomplete">`` test case (suite ``run``) naming what is missing, so it never
    reads as a pass.
    """
    plan = {k: v for k, v in (plan or {}).items() if k != "case_ids"}
    timestamp = timestamp or datetime.datetime.now().replace(microsecond=0).isoformat()
    by_suite: dict[str, list[CaseResult]] = {}
    for r in results:
        by_suite.setdefault(r.suite, []).append(r)
    for s in plan.get("suites") or ():
        by_suite.setdefault(str(s), [])
    total = _counts(results)
    root = ET.Element("testsuites", name="conformance", tests=str(total["tests"]), failures=str(total["failures"]),
                      errors=str(total["errors"]), skipped=str(total["skipped"]), time=f"{total['time']:.3f}")
    host = socket.gethostname()
    for suite, rs in by_suite.items():
        c = _counts(rs)
        ts = ET.SubElement(root, "testsuite", name=_clean(suite), tests=str(c["tests"]), failures=str(c["failures"]),
                           errors=str(c["errors"]), skipped=str(c["skipped"]), time=f"{c['time']:.3f}",
                           timestamp=timestamp, hostname=_clean(host))
        props = ET.SubElement(ts, "properties")
        for key, value in sorted(plan.items()):
            if isinstance(value, (str, int, float, bool)) or value is None:
                ET.SubElement(props, "property", name=_clean(key), value=_clean(value))
            elif isinstance(value, (list, tuple)):
                ET.SubElement(props, "property", name=_clean(key), value=_clean(",".join(map(str, value))))
        ET.SubElement(props, "property", name="complete", value="true" if complete else "false")
        for r in rs:
            ts.append(_case_element(r))
    if not complete:
        marker = _incomplete_element(results, plan, summary)
        ts = ET.SubElement(root, "testsuite", name="run", tests="1", failures="0", errors="1", skipped="0",
                           time="0.000", timestamp=timestamp, hostname=_clean(host))
        props = ET.SubElement(ts, "properties")
        ET.SubElement(props, "property", name="complete", value="false")
        ts.append(marker)
        root.set("tests", str(total["tests"] + 1))
        root.set("errors", str(total["errors"] + 1))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


class JUnitReporter(RewritingReporter):
    """Keeps every result and writes the JUnit file at `start`, every `every` cases and at `finish`."""

    def __init__(self, path, *, every: int = 25):
        super().__init__(path, every=every)
        self._timestamp: str | None = None

    def _prepare(self, plan: dict) -> None:
        self._timestamp = datetime.datetime.now().replace(microsecond=0).isoformat()

    def _render(self, summary, finished: bool) -> bytes:
        complete = finished and (summary or {}).get("complete", True)
        return to_xml(list(self.results.values()), self._plan, timestamp=self._timestamp, complete=complete,
                      summary=summary if finished else None)
