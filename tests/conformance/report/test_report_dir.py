"""A --report folder: the three file reporters together, a crash mid-run, and --resume."""
import xml.etree.ElementTree as ET

import pytest

from conformance.report import HTML_NAME, JSONL_NAME, JUNIT_NAME, load_finished, open_report_dir
from conformance.report.results import CaseResult, summarize

PLAN = {"platform": "cpu", "devices": 8, "seed": 0, "suites": ["collectives"]}


def _case(k, status="pass"):
    return CaseResult(f"psum[k={k}]", "collectives", "psum", "int32", status, examples=2,
                      message="" if status == "pass" else f"device {k} differs")


def test_crash_then_resume(tmp_path):
    folder = tmp_path / "report"
    reporters = open_report_dir(folder)
    for r in reporters:
        r.start(PLAN)
    for k in range(3):
        for r in reporters:
            r.case_finished(_case(k, "fail" if k == 1 else "pass"))
    # the process dies here: no finish()
    assert sorted(p.name for p in folder.iterdir()) == sorted([JSONL_NAME, JUNIT_NAME, HTML_NAME])
    ET.parse(folder / JUNIT_NAME)  # still a valid document
    done = load_finished(folder / JSONL_NAME)
    assert [r.status for r in done.values()] == ["pass", "fail", "pass"]

    reporters = open_report_dir(folder, resume=True)
    for r in reporters:
        r.start(PLAN)
    results = list(done.values()) + [_case(3)]
    for res in results:
        for r in reporters:
            r.case_finished(res)
    summary = summarize(results, wall_seconds=1.0, compile_seconds=0.0)
    for r in reporters:
        r.finish(summary)
    assert list(load_finished(folder / JSONL_NAME)) == [f"psum[k={k}]" for k in range(4)]
    root = ET.parse(folder / JUNIT_NAME).getroot()
    assert (root.get("tests"), root.get("failures")) == ("4", "1")
    page = (folder / HTML_NAME).read_text()
    assert "DISAGREE" in page and "psum[k=1]" in page


def test_report_path_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "taken"
    f.write_text("")
    with pytest.raises(ValueError, match=r"is a file; pass a folder for --report"):
        open_report_dir(f)
