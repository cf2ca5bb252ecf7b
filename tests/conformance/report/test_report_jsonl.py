"""JSON-lines results: written per case, readable after a crash, resumable."""
import json
import os

import numpy as np
import pytest

from conformance.report.jsonl import JsonlReporter, load_finished, read_records
from conformance.report.results import CaseResult

PLAN = {"platform": "cpu", "devices": 8, "seed": 3, "suites": ["collectives"], "examples": 10}


def _results():
    return [
        CaseResult("psum[axes=x,dtype=float32,mesh=2x4:default]", "collectives", "psum", "float32", "pass",
                   examples=10, seconds=0.25, compile_seconds=0.125),
        CaseResult("ppermute[perm=((0,1),),dtype=int32,mesh=2:reversed]", "collectives", "ppermute", "int32", "fail",
                   examples=3, message="values differ on device 1", repro_path="/tmp/r.py",
                   details={"device_errors": {"1": 4}}),
        CaseResult("pbroadcast[source=0,dtype=float32,mesh=4:default]", "collectives", "pbroadcast", "float32",
                   "unsupported", message="XLA:CPU has no pbroadcast lowering"),
    ]


def _lines(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_plan_cases_summary_lines(tmp_path):
    path = tmp_path / "out" / "results.jsonl"
    rep = JsonlReporter(path)
    rep.start(PLAN)
    rs = _results()
    for k, r in enumerate(rs):
        rep.case_finished(r)
        # on disk as soon as case_finished returns: plan + k+1 cases
        lines = _lines(path)
        assert len(lines) == k + 2
        assert lines[-1] == {"type": "case", **r.to_json()}
    rep.finish({"cases": 3, "ok": False})
    lines = _lines(path)
    assert lines[0] == {"type": "plan", **PLAN, "resumed": False}
    assert [line["type"] for line in lines] == ["plan", "case", "case", "case", "summary"]
    assert lines[-1] == {"type": "summary", "cases": 3, "ok": False}


def test_every_case_is_fsynced(tmp_path, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    rep = JsonlReporter(tmp_path / "r.jsonl")
    rep.start(PLAN)
    before = len(calls)
    for r in _results():
        rep.case_finished(r)
    assert len(calls) - before == 3


def test_numpy_values_in_details_are_written_as_json(tmp_path):
    rep = JsonlReporter(tmp_path / "r.jsonl")
    rep.start(PLAN)
    rep.case_finished(CaseResult("c", "programs", "scan", "int32", "fail",
                                 details={"count": np.int64(4), "where": np.array([[1, 2]]), "axes": {"x"}}))
    rep.close()
    got = load_finished(tmp_path / "r.jsonl")["c"].details
    assert got == {"count": 4, "where": [[1, 2]], "axes": ["x"]}


def test_load_finished_round_trips_and_tolerates_truncated_last_line(tmp_path):
    path = tmp_path / "r.jsonl"
    rep = JsonlReporter(path)
    rep.start(PLAN)
    rs = _results()
    for r in rs:
        rep.case_finished(r)
    rep.close()
    with open(path, "ab") as fh:  # a crash half-way through writing the next record
        fh.write(b'{"type": "case", "case_id": "all_gather[ax')
    got = load_finished(path)
    assert list(got) == [r.case_id for r in rs]
    assert got[rs[1].case_id] == rs[1]
    assert got[rs[1].case_id].details == {"device_errors": {"1": 4}}


def test_later_record_of_a_case_wins(tmp_path):
    path = tmp_path / "r.jsonl"
    rep = JsonlReporter(path)
    rep.start(PLAN)
    rep.case_finished(CaseResult("c", "programs", "scan", "int32", "error", message="crashed"))
    rep.case_finished(CaseResult("c", "programs", "scan", "int32", "pass"))
    rep.close()
    assert load_finished(path)["c"].status == "pass"


def test_corruption_before_the_last_line_is_an_error(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"type": "plan"}\n{"type": "case", "case_id": \n{"type": "summary"}\n')
    with pytest.raises(ValueError, match=r"line 2 is not a JSON record.*only the last line may be truncated"):
        load_finished(path)


def test_missing_file_means_nothing_finished(tmp_path):
    assert load_finished(tmp_path / "absent.jsonl") == {}


def test_resume_keeps_finished_cases_and_does_not_duplicate_replays(tmp_path):
    path = tmp_path / "r.jsonl"
    rs = _results()
    first = JsonlReporter(path)
    first.start(PLAN)
    first.case_finished(rs[0])
    first.case_finished(rs[1])
    first.close()
    with open(path, "ab") as fh:
        fh.write(b'{"type": "ca')  # crashed mid-line

    done = load_finished(path)
    assert set(done) == {rs[0].case_id, rs[1].case_id}
    second = JsonlReporter(path, resume=True)
    second.start(PLAN)
    for r in done.values():  # a runner may replay what it loaded to every reporter
        second.case_finished(r)
    second.case_finished(rs[2])
    second.finish({"cases": 3})
    types = [r["type"] for r in read_records(path)]
    assert types == ["plan", "case", "case", "plan", "case", "summary"]
    assert read_records(path)[3]["resumed"] is True
    assert list(load_finished(path)) == [r.case_id for r in rs]


def test_without_resume_the_file_starts_over(tmp_path):
    path = tmp_path / "r.jsonl"
    rep = JsonlReporter(path)
    rep.start(PLAN)
    rep.case_finished(_results()[0])
    rep.finish({})
    again = JsonlReporter(path)
    again.start(PLAN)
    again.close()
    assert [r["type"] for r in read_records(path)] == ["plan"]


def test_reporting_before_start_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match=r"not started; call start\(plan\)"):
        JsonlReporter(tmp_path / "r.jsonl").case_finished(_results()[0])
