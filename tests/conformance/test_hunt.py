"""`python -m conformance hunt`: failure signatures, a short hunt's report, a clean stop on SIGTERM,
and the coverage table built from hunt reports."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance import coverage
from conformance.hunt import signature
from conformance.report.results import CaseResult

ROOT = Path(__file__).resolve().parents[2]


def result(status, **details):
    return CaseResult(case_id="sharded[ops=pad,transform=grad]", suite="sharded", family="sharded", dtype="float32",
                      status=status, message=details.pop("message", ""), details=details)


class FakeCase:
    op_patterns = (("with_sharding_constraint", "sharded"), ("pad", "uneven"), ("max", "compiler"))


def test_signature_of_each_kind_of_failure():
    assert signature(result("pass")) is None and signature(result("xfail")) is None
    crash = result("error", worker_exit="killed by SIGABRT", stderr_tail="    @ 0x1 xla::spmd::Foo()",
                   fatal_line="F1126 06:34:17.634 18514 spmd_partitioner_util.h:118] Check failed: "
                              "ShapeUtil::IsScalarWithElementType(value.shape(), primitive_type) ")
    assert signature(crash, FakeCase()) == (
        "crash", "spmd_partitioner_util.h", "Check failed: ShapeUtil::IsScalarWithElementType(value.shape(), primitive_type)")
    lowering = result("error", failure={"side": "xla", "exception": "ValueError",
                                        "message": "Cannot lower jaxpr with verifier errors:\n\ttype of return"},
                      traceback='File "xla_backend/cache.py", in compiled')
    assert signature(lowering, FakeCase()) == ("lowering", "pad+max", "ValueError: Cannot lower jaxpr with verifier errors:")
    runtime = result("error", failure={"side": "xla", "exception": "JaxRuntimeError",
                                       "message": "INTERNAL: RET_CHECK failure (external/xla/fft_thunk.cc:168) x"},
                     traceback='File "xla_backend/cache.py", line 60, in timed_run')
    assert signature(runtime, FakeCase()) == (
        "runtime", "fft_thunk.cc", "JaxRuntimeError: INTERNAL: RET_CHECK failure (external/xla/fft_thunk.cc:N) x")
    trace = result("error", failure={"side": "refsim", "exception": "ValueError", "message": "Length of spec (1)"},
                   traceback='File "refsim/interpreter/api.py", in trace')
    assert signature(trace, FakeCase())[0] == "trace"
    rule = result("error", failure={"side": "refsim", "exception": "AssertionError", "message": "bad"},
                  traceback='File "refsim/interpreter/rules/elementwise.py", line 3')
    assert signature(rule, FakeCase())[0] == "refsim"
    mismatch = result("fail", stage={"diverged_in": "compiler", "op": "stablehlo.slice"},
                      failure={"kind": "mismatch", "classes": ["value"]})
    assert signature(mismatch, FakeCase()) == ("mismatch:compiler", "stablehlo.slice", "value")
    assert signature(result("timeout"), FakeCase()) == ("hang", "pad+max", "timeout")


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT), CONFORMANCE_COMPILE_CACHE="off")


def test_short_hunt_writes_every_program_and_a_summary(tmp_path):
    rep = tmp_path / "hunt"
    p = subprocess.run([sys.executable, "-m", "conformance", "hunt", "--minutes", "0.2", "--processes", "1",
                        "--seed", "3", "--report", str(rep), "--shrink-seconds", "0"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT, env=_env())
    assert p.returncode in (0, 1), p.stdout + p.stderr
    summary = json.loads((rep / "hunt.json").read_text())
    assert summary["partial"] is False and summary["programs"] >= 1
    cases = [json.loads(ln) for ln in (rep / "results.jsonl").read_text().splitlines()]
    cases = [c for c in cases if c["type"] == "case"]
    assert len(cases) == summary["programs"]
    prog = cases[0]["details"]["program"]
    assert prog["transform"] in ("none", "grad", "vjp", "vmap") and prog["partitioner"] in ("shardy", "gspmd")
    assert all(len(op) == 2 for op in prog["ops"])
    assert f"{summary['programs']} programs" in p.stdout and "distinct failure" in p.stdout
    assert (p.returncode == 1) == bool(summary["findings"])
    for f in summary["findings"]:
        assert Path(f["path"]).exists() if f["path"] else True


def test_sigterm_stops_a_hunt_cleanly_and_marks_it_partial(tmp_path):
    rep = tmp_path / "hunt"
    proc = subprocess.Popen([sys.executable, "-m", "conformance", "hunt", "--minutes", "10", "--processes", "1",
                             "--report", str(rep), "--shrink-seconds", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=_env())
    jsonl = rep / "results.jsonl"
    stop = time.monotonic() + 300
    while time.monotonic() < stop and proc.poll() is None:
        if jsonl.exists() and '"type":"case"' in jsonl.read_text():
            break
        time.sleep(1)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode in (0, 1), out + err
    summary = json.loads((rep / "hunt.json").read_text())
    assert summary["partial"] is True and summary["programs"] >= 1
    assert "partial hunt" in out


def test_hunt_rejects_bad_arguments():
    p = subprocess.run([sys.executable, "-m", "conformance", "hunt", "--minutes", "0"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, env=_env())
    assert p.returncode == 2 and "--minutes" in p.stderr
    p = subprocess.run([sys.executable, "-m", "conformance", "hunt", "--minutes", "1", "--suite", "programs"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=_env())
    assert p.returncode == 2 and "sharded" in p.stderr


def test_coverage_counts_programs_per_op_pattern_and_direction(tmp_path):
    rows = [{"type": "plan", "jax": "0.10.2"}]
    for transform, ops in (("none", [["pad", "sharded"], ["cumsum", "uneven"]]), ("grad", [["pad", "sharded"]]),
                           ("vjp", [["pad", "replicated"], ["pad", "replicated"]])):
        rows.append({"type": "case", "status": "pass", "details": {"program": {
            "ops": ops, "transform": transform, "axis_types": "auto", "partitioner": "shardy", "mesh": [2]}}})
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    data = coverage.collect([str(tmp_path)])
    # pad: sharded once forward, once backward; replicated once backward (a program counts once per pattern)
    assert data["cells"][("pad", "sharded", "fwd")] == 1 and data["cells"][("pad", "sharded", "bwd")] == 1
    assert data["cells"][("pad", "replicated", "bwd")] == 1 and data["cells"][("cumsum", "uneven", "fwd")] == 1
    text = coverage.render(data, ["x"])
    pad = next(ln for ln in text.splitlines() if ln.startswith("| pad |"))
    assert pad == "| pad | 0 / 1 | 1 / 1 | · | · | · | 1 / 2 | 0.10.2 |"
    assert "Programs run: 3 on jax 0.10.2" in text


@pytest.mark.parametrize("argv", [["/nonexistent-report"]])
def test_coverage_cli_rejects_a_missing_folder(argv, capsys):
    assert coverage.main(argv) == 2 and "does not exist" in capsys.readouterr().err


def test_explaining_a_gspmd_reproducer_leaves_the_partitioner_alone(tmp_path):
    import jax

    from conformance.debug.explain.summary import stage_of_reproducer

    path = tmp_path / "repro.py"
    path.write_text("import jax\njax.config.update('jax_use_shardy_partitioner', False)\nKIND = 'nonsense'\n")
    before = jax.config.jax_use_shardy_partitioner
    stage = stage_of_reproducer(str(path))
    assert stage["diverged_in"] is None and stage["error"]
    assert jax.config.jax_use_shardy_partitioner == before


def test_a_listed_case_that_differs_otherwise_is_still_a_mismatch():
    res = result("error", failure={"kind": "mismatch", "side": "xla", "classes": ["nan-introduced"]},
                 message="MISMATCH (4 found) ... listed in the xfails file as mismatch(value)")
    assert signature(res, FakeCase()) == ("mismatch:unlocalised", "pad+max", "nan-introduced")


def test_coverage_out_keeps_the_hand_written_part_after_the_marker(tmp_path):
    rows = [{"type": "plan", "jax": "0.10.2"},
            {"type": "case", "status": "pass", "details": {"program": {
                "ops": [["pad", "sharded"]], "transform": "none", "axis_types": "auto", "partitioner": "shardy",
                "mesh": [2]}}}]
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    page = tmp_path / "page.md"
    page.write_text("old table\n\n" + coverage.KEEP_MARKER + "\n\n## Hunts\n\nby hand\n")
    assert coverage.main([str(tmp_path / "r"), "--out", str(page)]) == 0
    text = page.read_text()
    assert "old table" not in text and "Programs run: 1 on jax 0.10.2" in text
    assert text.endswith(coverage.KEEP_MARKER + "\n\n## Hunts\n\nby hand\n")
    assert text.index("| pad |") < text.index(coverage.KEEP_MARKER)


def test_signature_of_a_jax_lowering_error_names_its_primitive_and_stage():
    # JAX filters its own frames: the innermost frame shown is the project's .lower( call, inside a
    # compile-cache call; jax 0.12 names the primitive, so one JAX bug is one signature across programs
    tb = ('  File "xla_backend/cache.py", line 37, in compiled\n    exe = compile_fn()\n'
          '  File "xla_backend/staging.py", line 473, in lower\n    low = self.call.lower(*self.args)\n')
    msg = "Expected last op to be sdy.sharding_constraint, but got: stablehlo.custom_call and output type=" \
          "i32[3,1]{U:x} for primitive reduce_sum"
    err = result("error", failure={"side": "xla", "exception": "AssertionError", "message": msg}, traceback=tb)
    stage, op, cls = signature(err, FakeCase())
    assert (stage, op) == ("lowering", "reduce_sum") and cls.startswith("AssertionError: Expected last op")


# -- cases and the example database as data (issue 38) -------------------------------------------
def _drawn(count=8, seed=77):
    from conformance.suites import base
    from conformance.suites import sharded as suite_mod

    return base.draw(suite_mod.strategy("sharded", None, 8), count, seed)


def test_a_case_file_is_data_that_rebuilds_the_same_program(tmp_path):
    from conformance import hunt

    for case in _drawn():
        path = tmp_path / "case.json"
        hunt.write_case(case, str(path))
        doc = json.loads(path.read_text())           # plain JSON: arrays as base64 .npy bytes
        assert doc["format"] == hunt.CASE_FORMAT and doc["case_id"] == case.case_id
        back = hunt.read_case(str(path))
        assert back.source == case.source and back.case_id == case.case_id and back.policies == case.policies
        assert hunt.program_digest(back) == hunt.program_digest(case)


class _Payload:
    """A pickle that would create a file if it were ever unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_database_entries_that_are_not_programs_are_skipped_and_counted(tmp_path):
    import pickle

    from conformance import hunt

    cases = _drawn()
    good = hunt._entry({"seed": 77, "count": 8, "index": 2, "devices": 8, "shrink": []}, cases[2])
    marker = tmp_path / "ran"
    doc = json.loads(good)
    blobs = [good, b"\x00\xffgarbage", pickle.dumps(_Payload(str(marker))), b"[1, 2]", b'{"format": 1}',
             json.dumps(dict(doc, index=9)).encode(),                           # out of range
             json.dumps(dict(doc, program="sha256:" + "0" * 64)).encode(),     # another program now
             json.dumps(dict(doc, devices=64)).encode()]                       # more devices than the hunt
    got, origins, skipped = hunt.replay(blobs, 8)
    assert [hunt.program_digest(c) for c in got] == [doc["program"]]
    assert origins == {cases[2].case_id: {"seed": 77, "count": 8, "index": 2, "devices": 8, "shrink": []}}
    assert skipped == {"unreadable": 5, "stale": 1, "foreign": 1} and not marker.exists()


def test_a_shrunk_program_is_stored_as_its_path_through_the_candidates():
    from conformance import hunt
    from conformance.suites.sharded import candidates

    case = next(c for c in _drawn() if len(list(candidates(c))) >= 2)
    step1 = list(candidates(case))[1]
    accepted = [step1] + list(candidates(step1))[:1]
    path = hunt._shrink_path(case, accepted)
    assert path is not None and path[0] == 1 and len(path) == len(accepted)
    # derived again from the strategy (the drawn case at its own index, then the path)
    idx = [hunt.program_digest(c) for c in _drawn()].index(hunt.program_digest(case))
    entry = hunt._entry({"seed": 77, "count": 8, "index": idx, "devices": 8, "shrink": path}, accepted[-1])
    got, _, skipped = hunt.replay([entry], 8)
    assert not skipped and hunt.program_digest(got[0]) == hunt.program_digest(accepted[-1])


def _fake_workers(fail, batches_max=2, phases=None):
    """A stand-in for `workers.run_in_workers`: each task's result at once (no XLA), an "error" of
    the XLA compile with message fail[case_id] for the listed cases; stops after `batches_max`
    batches (None: when the hunt stops drawing); a passing result has `phases` (seconds by phase)."""
    from conformance.report.results import CaseResult

    def run_in_workers(tasks, *, more, **_):
        batches = 0
        for batch in more:
            for task, _entry in batch:
                msg = fail.get(task.case_id)
                if msg is None:
                    yield CaseResult(case_id=task.case_id, suite="sharded", family="sharded", dtype=task.dtype,
                                     status="pass", phases=dict(phases or {}),
                                     compile_seconds=(phases or {}).get("xla_compile", 0.0))
                else:
                    yield CaseResult(case_id=task.case_id, suite="sharded", family="sharded", dtype=task.dtype,
                                     status="error", message=msg,
                                     details={"failure": {"side": "xla", "exception": "ValueError", "message": msg},
                                              "traceback": 'File "x.py", line 1, in f\n    exe = low.compile()\n'})
            batches += bool(batch)
            if batches_max is not None and batches >= batches_max:
                return
    return run_in_workers


def test_a_rerun_on_the_same_report_keeps_the_number_of_a_replayed_finding(tmp_path, monkeypatch):
    from conformance import hunt

    rep = tmp_path / "hunt"
    quiet = lambda *a, **k: None  # noqa: E731
    kw = dict(processes=1, shrink_seconds=0, upstream=False, progress_every=0, out=quiet)
    # what a hunt with seed=5 draws first: a batch of its master generator's first seed
    target = _drawn(hunt.BATCH, random.Random(5).randrange(2 ** 32))[0].case_id
    monkeypatch.setattr(hunt.workers, "run_in_workers", _fake_workers({target: "planted compile error"}))
    r1 = hunt.hunt(minutes=5, report_dir=str(rep), seed=5, **kw)
    assert [(f.number, f.earlier) for f in r1.findings] == [(1, False)]
    first = sorted(os.listdir(rep / "findings"))
    assert first[0].startswith("001-compile-") and first[1:] == ["CAUSES.md"]
    folder = rep / "findings" / first[0]
    # one folder per finding, each file once (no second copy under repros/)
    assert sorted(os.listdir(folder)) == ["case.json", "finding.json", "repro.py"]
    assert not (rep / "repros").exists()

    # the rerun (another seed) replays the program first: the same signature keeps finding 001,
    # and a new signature gets the next number
    lines = []
    monkeypatch.setattr(hunt.workers, "run_in_workers", _fake_workers({target: "planted compile error"}))
    r2 = hunt.hunt(minutes=5, report_dir=str(rep), seed=6, **dict(kw, out=lines.append))
    assert any("replaying 1 failing program" in ln for ln in lines)
    assert [(f.number, f.earlier, f.path) for f in r2.findings] == [(1, True, str(folder / "repro.py"))]
    assert sorted(os.listdir(rep / "findings")) == first
    summary = json.loads((rep / "hunt.json").read_text())
    assert summary["database"] == {"replayed": 1, "skipped": {}} and summary["findings"][0]["number"] == 1

    second = next(c.case_id for c in _drawn(hunt.BATCH, random.Random(7).randrange(2 ** 32)) if c.case_id != target)
    monkeypatch.setattr(hunt.workers, "run_in_workers",
                        _fake_workers({target: "planted compile error", second: "another planted error"}))
    r3 = hunt.hunt(minutes=5, report_dir=str(rep), seed=7, **kw)
    assert sorted((f.number, f.earlier) for f in r3.findings) == [(1, True), (2, False)]
    assert len(os.listdir(rep / "findings")) == 3


def test_a_database_entry_that_is_not_a_case_does_not_stop_a_hunt(tmp_path, monkeypatch):
    from hypothesis.database import DirectoryBasedExampleDatabase

    from conformance import hunt

    rep = tmp_path / "hunt"
    db = DirectoryBasedExampleDatabase(str(rep / "examples"))
    for blob in (b"not json", b'{"format": "conformance-hunt-entry-1"}', b"\x80\x04K\x01."):
        db.save(hunt.DB_KEY, blob)
    lines = []
    monkeypatch.setattr(hunt.workers, "run_in_workers", _fake_workers({}))
    r = hunt.hunt(minutes=5, report_dir=str(rep), seed=1, processes=1, shrink_seconds=0, upstream=False,
                  progress_every=0, out=lines.append)
    assert r.programs >= 1 and r.database == {"replayed": 0, "skipped": {"unreadable": 3}}
    assert any("skipped 3 example-database entries" in ln for ln in lines)


def test_check_runs_a_case_file_and_refuses_a_pickle(tmp_path):
    import pickle

    from conformance import hunt

    case = _drawn(1, 3)[0]
    assert hunt.check_in_subprocess(case, 8, timeout=300, with_xfails=True) is None, case.case_id
    marker = tmp_path / "ran"
    bad = tmp_path / "case.pkl"
    bad.write_bytes(pickle.dumps(_Payload(str(marker))))
    p = subprocess.run([sys.executable, "-m", "conformance.hunt", "--check", str(bad)], capture_output=True,
                       text=True, timeout=300, cwd=ROOT, env=_env())
    assert p.returncode == 2 and "not a hunt case file" in p.stderr and not marker.exists()


# -- a hunt you can repeat and watch (issue 41) -----------------------------------------------------
def _case_ids(rep):
    rows = [json.loads(ln) for ln in (rep / "results.jsonl").read_text().splitlines()]
    return [r["case_id"] for r in rows if r["type"] == "case"]


def test_the_same_seed_and_program_budget_draw_the_same_programs(tmp_path, monkeypatch):
    from conformance import hunt

    monkeypatch.setattr(hunt.workers, "run_in_workers", _fake_workers({}, batches_max=None))
    kw = dict(processes=1, shrink_seconds=0, upstream=False, progress_every=0, out=lambda *a: None)
    a = hunt.hunt(programs=11, seed=31, report_dir=str(tmp_path / "a"), **kw)
    b = hunt.hunt(programs=11, seed=31, report_dir=str(tmp_path / "b"), **kw)
    assert a.programs == b.programs == 11 and a.seed == b.seed == 31
    assert _case_ids(tmp_path / "a") == _case_ids(tmp_path / "b")
    hunt.hunt(programs=11, seed=32, report_dir=str(tmp_path / "c"), **kw)
    assert _case_ids(tmp_path / "a") != _case_ids(tmp_path / "c")
    # no seed given: a random one, recorded, and it repeats the hunt
    r = hunt.hunt(programs=9, report_dir=str(tmp_path / "d"), **kw)
    summary = json.loads((tmp_path / "d" / "hunt.json").read_text())
    assert isinstance(summary["seed"], int) and summary["seed"] == r.seed and summary["plan"]["seed"] == r.seed
    hunt.hunt(programs=9, seed=r.seed, report_dir=str(tmp_path / "e"), **kw)
    assert _case_ids(tmp_path / "d") == _case_ids(tmp_path / "e")
    assert summary["budget"] == {"minutes": None, "programs": 9}


def test_a_hunt_restricted_to_ops_draws_only_those_ops(tmp_path, monkeypatch):
    from conformance import hunt

    monkeypatch.setattr(hunt.workers, "run_in_workers", _fake_workers({}, batches_max=None))
    hunt.hunt(programs=8, seed=3, ops=["cumsum", "pad"], report_dir=str(tmp_path / "r"), processes=1,
              shrink_seconds=0, upstream=False, progress_every=0, out=lambda *a: None)
    rows = [json.loads(ln) for ln in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    ops = {op for r in rows if r["type"] == "case" for op, _ in r["details"]["program"]["ops"]}
    assert ops and ops <= {"cumsum", "pad", "pad_neg_interior", "with_sharding_constraint", "reshard"}
    with pytest.raises(ValueError, match="not ops the sharded strategy draws"):
        hunt.hunt(programs=1, ops=["no_such_op"], report_dir=str(tmp_path / "s"), out=lambda *a: None)


def test_progress_lines_go_to_stderr_with_no_terminal(tmp_path, monkeypatch):
    import io

    from conformance import hunt

    target = _drawn(hunt.BATCH, random.Random(4).randrange(2 ** 32))[2].case_id
    monkeypatch.setattr(hunt.workers, "run_in_workers", _fake_workers({target: "planted compile error"},
                                                                       batches_max=None))
    stream = io.StringIO()   # not a terminal
    hunt.hunt(programs=16, seed=4, report_dir=str(tmp_path / "r"), processes=1, shrink_seconds=0, upstream=False,
              progress_every=1e-6, progress_stream=stream, out=lambda *a: None)
    lines = stream.getvalue().splitlines()
    assert lines and all(ln.startswith("hunt ") for ln in lines)
    last = lines[-1]
    assert "16 programs (" in last and "/s)" in last and "1 finding(s): 1 new, 0 known" in last, last
    assert "1 error" in last and "budget 16 programs, seed 4" in last


def test_the_report_counts_programs_and_the_compile_share_of_the_work(tmp_path, monkeypatch):
    from conformance import hunt

    # two workers compiling at once: 3 s of compiling out of 4 s of work per program, in less wall time
    monkeypatch.setattr(hunt.workers, "run_in_workers",
                        _fake_workers({}, batches_max=None, phases={"xla_compile": 3.0, "refsim": 1.0}))
    rep = tmp_path / "r"
    hunt.hunt(programs=5, seed=2, report_dir=str(rep), processes=2, shrink_seconds=0, upstream=False,
              progress_every=0, out=lambda *a: None)
    rows = [json.loads(ln) for ln in (rep / "results.jsonl").read_text().splitlines()]
    summary = next(r for r in rows if r["type"] == "summary")
    assert summary["cases"] == 5 and summary["compile_share"] == pytest.approx(0.75)
    page = (rep / "report.html").read_text()
    assert '<th class="l">cases</th><td class="l">0</td>' not in page
    assert '<th class="l">cases</th><td class="l">5</td>' in page
    assert '<th class="l">time compiling</th><td class="l">75%</td>' in page


def test_a_database_entry_of_an_ops_hunt_replays_with_those_ops_only():
    from conformance import hunt
    from conformance.strategies.sharded import sharded_programs
    from conformance.suites import base

    cases = base.draw(sharded_programs(ops=("cumsum",), max_devices=8), 8, 41)
    entry = hunt._entry({"seed": 41, "count": 8, "index": 3, "devices": 8, "shrink": [], "ops": ["cumsum"]}, cases[3])
    got, origins, skipped = hunt.replay([entry], 8)
    assert not skipped and hunt.program_digest(got[0]) == hunt.program_digest(cases[3])
    assert origins[got[0].case_id]["ops"] == ["cumsum"]
    doc = json.loads(entry)
    for bad, reason in ((dict(doc, ops=["no_such_op"]), "stale"), (dict(doc, ops="cumsum"), "unreadable"),
                        (dict(doc, ops=[]), "unreadable")):
        assert hunt.replay([json.dumps(bad).encode()], 8)[2] == {reason: 1}
