"""The typed failure record: its fields, its results.jsonl object (unchanged format), old readers."""
import json

import numpy as np
import pytest

from conformance.report.failure import FORMAT_VERSION, Failure, case_failure, stage_line
from conformance.report.jsonl import JsonlReporter, load_finished
from conformance.report.results import CaseResult

# A "fail" record's details as results.jsonl held them before the record was typed (written by hand).
OLD_FAIL = {
    "description": "psum over x", "mesh": {"axis_sizes": [2], "axis_names": ["x"], "device_ids": [0, 1]},
    "layouts": [], "report": "MISMATCH (1 found)", "device_errors": {"0": 3, "1": 1},
    "failure": {"kind": "mismatch", "side": "xla", "classes": ["value"]},
    "shrunk": "shrunk to mesh 2", "stage": {"diverged_in": "compiled", "op": "all-reduce", "source": None},
}


def test_an_old_record_reads_into_typed_fields_and_writes_back_unchanged():
    f = Failure.from_json(OLD_FAIL)
    assert f.description == "psum over x" and f.report == "MISMATCH (1 found)"
    assert f.signature == {"kind": "mismatch", "side": "xla", "classes": ["value"]}
    assert f.mismatches == 4 and f.side == "xla" and f.diverged_in == "compiled"
    assert f.extra == {}
    assert f.to_json() == OLD_FAIL
    assert FORMAT_VERSION == 1


def test_unknown_keys_round_trip_in_extra():
    d = {"traceback": "Traceback ...", "from_a_newer_writer": [1, 2]}
    f = Failure.from_json(d)
    assert f.traceback == "Traceback ..." and f.extra == {"from_a_newer_writer": [1, 2]}
    assert f.to_json() == d


def test_the_record_reads_as_the_old_dict():
    f = Failure(report="r", signature={"kind": "mismatch"})
    assert f == {"report": "r", "failure": {"kind": "mismatch"}}
    assert f["failure"]["kind"] == "mismatch" and f.get("stage") is None and "traceback" not in f
    assert dict(f) == {"report": "r", "failure": {"kind": "mismatch"}}
    f["shrunk"] = "note"
    f["custom"] = 1
    assert f.shrunk == "note" and f.extra == {"custom": 1}
    del f["report"]
    assert f.report is None and "report" not in f
    with pytest.raises(KeyError):
        f["stage"]
    assert not Failure() and Failure() == {}


def test_details_must_be_an_object():
    with pytest.raises(ValueError, match="details must be a JSON object"):
        Failure.from_json(["not", "a", "dict"])


def test_case_result_carries_the_record_and_jsonl_writes_the_old_object(tmp_path):
    r = CaseResult("c", "collectives", "psum", "float32", "fail", details=dict(OLD_FAIL))
    assert isinstance(r.details, Failure) and r.details.mismatches == 4
    assert r.to_json()["details"] == OLD_FAIL
    path = tmp_path / "r.jsonl"
    rep = JsonlReporter(path)
    rep.start({"platform": "cpu"})
    rep.case_finished(r)
    with open(path, encoding="utf-8") as fh:
        lines = [json.loads(line) for line in fh]
    assert lines[1]["details"] == OLD_FAIL
    back = load_finished(path)["c"]
    assert isinstance(back.details, Failure) and back.details.stage["op"] == "all-reduce"


def test_stage_line_of_the_record():
    assert Failure().stage_line() == ""
    assert Failure(stage={"diverged_in": "compiled", "op": "all-reduce"}).stage_line() == \
        "stage: diverged in compiled at all-reduce"
    assert stage_line({"error": "no program"}) == "stage: not localised (no program)"


def test_case_failure_of_a_program():
    import refsim
    from conformance.cases import Program
    from refsim.layouts import PartitionSpec as P

    mesh = refsim.Mesh((2,), ("x",))
    case = Program(family="identity", source="def f(a):\n    return a\n", entry="shard_map",
                   mesh=mesh, args=(np.arange(4, dtype=np.float32),), in_specs=(P("x"),), out_specs=P("x"))
    f = case_failure(case, exception_type="ValueError")
    assert f.mesh == {"axis_sizes": [2], "axis_names": ["x"], "device_ids": [0, 1]}
    assert [e["blocks"] for e in f.layouts] == [{"0": [[0, 2]], "1": [[2, 4]]}]
    assert f.exception_type == "ValueError" and f.report is None
