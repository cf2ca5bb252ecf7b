"""JUnit XML: one testsuite per suite, failure/error/skipped elements, valid after every rewrite."""
import xml.etree.ElementTree as ET

import pytest

from conformance.report.junit import JUnitReporter, to_xml
from conformance.report.results import CaseResult

PLAN = {"platform": "cpu", "devices": 8, "seed": 0, "suites": ["collectives", "layouts"]}


def _results():
    return [
        CaseResult("psum[axes=x]", "collectives", "psum", "float32", "pass", seconds=0.5),
        CaseResult("all_gather[axis=1]", "collectives", "all_gather", "int32", "fail", seconds=0.25,
                   message="values differ on device 5\nmore text", repro_path="/tmp/repro_all_gather.py",
                   details={"report": "MISMATCH (1 found): all_gather[axis=1]\n  output 0, device 5: ..."}),
        CaseResult("ppermute[perm=bad]", "collectives", "ppermute", "int32", "error",
                   message="ValueError: perm has duplicate source",
                   details={"exception_type": "ValueError", "traceback": "Traceback (most recent call last): ..."}),
        CaseResult("pbroadcast[source=0]", "collectives", "pbroadcast", "float32", "unsupported",
                   message="XLA:CPU has no pbroadcast lowering"),
        CaseResult("named[P(x,y)]", "layouts", "named", "float32", "xfail", message="known HLO text difference"),
        CaseResult("hlo[iota]", "layouts", "hlo", "float32", "xpass", message="listed in xfails/cpu.txt"),
    ]


def _parse(path):
    return ET.parse(path).getroot()


def test_suites_cases_and_counts(tmp_path):
    path = tmp_path / "junit.xml"
    rep = JUnitReporter(path)
    rep.start(PLAN)
    for r in _results():
        rep.case_finished(r)
    rep.finish({})
    root = _parse(path)
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("6", "1", "1", "2")
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert list(suites) == ["collectives", "layouts"]
    coll, lay = suites["collectives"], suites["layouts"]
    assert (coll.get("tests"), coll.get("failures"), coll.get("errors"), coll.get("skipped")) == ("4", "1", "1", "1")
    assert float(coll.get("time")) == pytest.approx(0.75)
    assert (lay.get("tests"), lay.get("failures"), lay.get("errors"), lay.get("skipped")) == ("2", "0", "0", "1")
    props = {p.get("name"): p.get("value") for p in coll.find("properties")}
    assert props["platform"] == "cpu" and props["devices"] == "8" and props["suites"] == "collectives,layouts"
    assert props["complete"] == "true"
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert cases["psum[axes=x]"].get("classname") == "conformance.collectives.psum"
    assert cases["psum[axes=x]"].find("failure") is None and cases["psum[axes=x]"].find("skipped") is None


def test_failure_error_and_skipped_elements(tmp_path):
    root = ET.fromstring(to_xml(_results(), PLAN))
    cases = {c.get("name"): c for c in root.iter("testcase")}
    fail = cases["all_gather[axis=1]"].find("failure")
    assert fail.get("message") == "values differ on device 5"
    assert fail.get("type") == "mismatch"
    assert "MISMATCH (1 found)" in fail.text and "reproducer: /tmp/repro_all_gather.py" in fail.text
    err = cases["ppermute[perm=bad]"].find("error")
    assert err.get("type") == "ValueError" and "Traceback" in err.text
    skipped = cases["pbroadcast[source=0]"].find("skipped")
    assert skipped.get("message") == "unsupported on this platform: XLA:CPU has no pbroadcast lowering"
    assert cases["named[P(x,y)]"].find("skipped").get("message") == "expected failure: known HLO text difference"
    stale = cases["hlo[iota]"]
    assert stale.find("skipped") is None and stale.find("failure") is None
    assert "stale xfail entry: hlo[iota]" in stale.find("system-out").text
    statuses = {name: {p.get("name"): p.get("value") for p in c.find("properties")}["status"]
                for name, c in cases.items()}
    assert statuses["hlo[iota]"] == "xpass" and statuses["pbroadcast[source=0]"] == "unsupported"


def _cases(root):
    """The conformance cases of a document (not the "every planned case ran" marker of a partial one)."""
    return [tc for tc in root.iter("testcase") if tc.get("classname") != "conformance.run"]


def _marked_incomplete(root) -> bool:
    return any(e.get("type") == "incomplete" for e in root.iter("error"))


def test_rewritten_every_n_cases_and_valid_meanwhile(tmp_path):
    path = tmp_path / "sub" / "junit.xml"
    rep = JUnitReporter(path, every=2)
    rep.start(PLAN)
    root = _parse(path)  # valid (and empty) before any case finishes
    assert not _cases(root) and [s.get("name") for s in root.iter("testsuite")] == ["collectives", "layouts", "run"]
    # a partial document fails: a CI system reading it never sees a pass
    assert _marked_incomplete(root) and root.get("tests") == "1" and root.get("errors") == "1"
    rs = _results()
    rep.case_finished(rs[0])
    assert not _cases(_parse(path))
    rep.case_finished(rs[1])
    mid = _parse(path)
    assert len(_cases(mid)) == 2 and mid.get("tests") == "3" and _marked_incomplete(mid)
    assert {p.get("name"): p.get("value") for p in mid.find("testsuite/properties")}["complete"] == "false"
    rep.case_finished(rs[2])  # the process dies here: the file still holds the first two cases
    assert len(_cases(_parse(path))) == 2
    rep.finish({})
    done = _parse(path)
    assert done.get("tests") == "3" and len(_cases(done)) == 3 and not _marked_incomplete(done)
    assert not list(path.parent.glob("*.tmp*"))


def test_an_incomplete_summary_is_complete_false_with_a_failing_case(tmp_path):
    path = tmp_path / "junit.xml"
    rep = JUnitReporter(path)
    rep.start({**PLAN, "case_ids": ["psum[axes=x]", "all_gather[axis=1]", "never-ran"]})
    rs = _results()[:2]
    for r in rs:
        rep.case_finished(r)
    rep.finish({"complete": False, "ok": False, "planned_cases": 3, "missing_cases": 1,
                "missing_case_ids": ["never-ran"], "interrupted": "interrupted by SIGINT"})
    root = _parse(path)
    props = {p.get("name"): p.get("value") for p in root.find("testsuite/properties")}
    assert props["complete"] == "false" and "case_ids" not in props
    marker = next(e for e in root.iter("error") if e.get("type") == "incomplete")
    assert marker.get("message") == "1 of 3 planned cases did not run (interrupted by SIGINT); missing: never-ran"
    # a pass, a failure, and the marker as an error
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("3", "1", "1")


def test_control_characters_do_not_break_the_document():
    r = CaseResult("c\x00", "programs", "scan", "int32", "fail", message="\x1b[31mred\x1b[0m diff \x0b here")
    root = ET.fromstring(to_xml([r]))
    fail = root.find("testsuite/testcase/failure")
    assert fail.get("message") == "\\x1b[31mred\\x1b[0m diff \\x0b here"
    assert root.find("testsuite/testcase").get("name") == "c\\x00"


def test_every_must_be_a_positive_int(tmp_path):
    with pytest.raises(ValueError, match=r"every=0; pass how many cases to finish between rewrites, an int >= 1"):
        JUnitReporter(tmp_path / "j.xml", every=0)
