"""Exporting and running bundles under the installed JAX (conformance.export.write / run / findings).

The hand-written program's expected outputs are NumPy's (2a + 1 and a column sum of small
integers, both exact in float32); a planted wrong value must be caught, a changed file refused.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import refsim
from conformance.export import run as run_mod
from conformance.export import write
from conformance.export.bundle import MANIFEST, BundleWriter, read_bundle
from refsim import NamedSharding, PartitionSpec as P

MESH = refsim.Mesh((4, 2), ("x", "y"), device_ids=np.array([[3, 1], [0, 2], [7, 6], [5, 4]]))
A = np.arange(32, dtype=np.float32).reshape(8, 4) - 7


def f(a):
    import jax.numpy as jnp

    return a * 2 + 1, jnp.sum(a, axis=0)


def _bundle(path, expected=None, copies=1):
    blob, text, meta = write.export_function(
        f, mesh=MESH, args=(A,), in_shardings=(NamedSharding(MESH, P("x", "y")),),
        out_shardings=(NamedSharding(MESH, P("x", None)), NamedSharding(MESH, P())))
    meta.update(case_id="hand[2a+1,colsum]", source="def f(a):\n    return a * 2 + 1, jnp.sum(a, axis=0)\n",
                ops=["mul", "add", "reduce_sum"], policies=[["exact", 0.0], ["exact", 0.0]])
    want = expected if expected is not None else [A * 2 + 1, A.sum(axis=0)]
    w = BundleWriter(path)
    for _ in range(copies):
        w.add(dict(meta), exported=blob, module_text=text, inputs=[A], expected=want)
    w.finish(exporter=write.exporter_record(), seed=None, skipped=[])
    return path


def test_the_hand_written_program_agrees_with_numpy_under_the_same_jax(tmp_path):
    path = _bundle(tmp_path / "b")
    entry = read_bundle(path).programs[0]
    assert entry["calling_convention_version"] >= 9 and entry["nr_devices"] == 8
    assert entry["mesh"]["device_ids"] == [[3, 1], [0, 2], [7, 6], [5, 4]]
    assert entry["in_specs"] == [["x", "y"]] and entry["out_specs"] == [["x", None], []]
    run = run_mod.run_bundle(path, report_dir=tmp_path / "r", say=lambda *_: None)
    (p,) = run.programs
    assert (p.outcome, p.outside, run.ok) == ("agree", [], True), p.message + p.report
    assert run.counts == {"programs": 1, "agree": 1, "disagree": 0, "error": 0, "outside-window": 0, "rejected": 0,
                          "exporters-own": 0}
    record = json.loads((tmp_path / "r" / run_mod.RUN_RECORD).read_text())
    assert record["verdict"] == "AGREE" and record["runner"]["jax"] == record["exporter"]["jax"]
    lines = [json.loads(ln) for ln in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    assert [r["status"] for r in lines if r.get("type") == "case"] == ["pass"]
    assert not (tmp_path / "r" / "findings").exists()


def test_a_planted_wrong_expected_value_is_a_finding_ready_to_file(tmp_path, capsys):
    wrong = A * 2 + 1
    wrong[5, 2] += 1   # row 5 lives on the devices of mesh row x=2 (ids 7, 6)
    path = _bundle(tmp_path / "b", expected=[wrong, A.sum(axis=0)])
    assert run_mod.main([str(path), "--report", str(tmp_path / "r")]) == 1
    out = capsys.readouterr().out
    assert "1 programs, 0 agree, 1 disagree, 0 error, 0 outside the window" in out
    record = json.loads((tmp_path / "r" / run_mod.RUN_RECORD).read_text())
    (p,) = record["programs"]
    assert p["outcome"] == "disagree" and p["signature"][0] == "cross-version:mismatch"
    assert "output 0, device 7" in p["report"] or "output 0, device 6" in p["report"], p["report"]
    assert "refsim 32.0, xla 31.0" in p["report"]   # A[5, 2] = 5*4 + 2 - 7 = 15: 2*15 + 1 = 31, planted 32
    (finding,) = record["findings"]
    folder = finding["folder"]
    assert sorted(os.listdir(folder)) == ["UPSTREAM.md", "expected.npz", "exported.bin", "finding.json",
                                          "inputs.npz", "module.mlir", "upstream.py"]
    issue = open(os.path.join(folder, "UPSTREAM.md")).read()
    assert "| jax |" in issue and "python upstream.py" in issue and "jnp.sum(a, axis=0)" in issue
    assert (tmp_path / "r" / "findings" / "CAUSES.md").exists()
    # the plain-JAX script shows the same difference on its own
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    script = subprocess.run([sys.executable, "upstream.py"], cwd=folder, capture_output=True, text=True, env=env,
                            timeout=300)
    assert script.returncode == 1, script.stdout + script.stderr
    assert "output 0: 1 of 32 elements differ; first at (5, 2): refsim 32.0, jax 31.0" in script.stdout


def test_a_failure_the_exporter_has_too_is_counted_but_no_cross_version_finding(tmp_path):
    wrong = A * 2 + 1
    wrong[0, 0] = -99
    path = _bundle(tmp_path / "b", expected=[wrong, A.sum(axis=0)])
    doc = json.loads((tmp_path / "b" / MANIFEST).read_text())
    doc["programs"][0]["exporter_run"] = {"outcome": "disagree", "message": "MISMATCH"}
    (tmp_path / "b" / MANIFEST).write_text(json.dumps(doc))
    run = run_mod.run_bundle(path, report_dir=tmp_path / "r", say=lambda *_: None)
    (p,) = run.programs
    assert (p.outcome, p.exporters_own, run.counts["exporters-own"]) == ("disagree", True, 1)
    assert "not a cross-version difference" in p.message
    assert run.findings == [] and not run.ok


def test_a_program_that_kills_the_runner_is_an_error_and_the_rest_still_run(tmp_path, monkeypatch):
    path = _bundle(tmp_path / "b", copies=2)
    monkeypatch.setenv(run_mod.ABORT_AT, "p000")   # the child aborts there, as on a fatal CHECK in XLA
    run = run_mod.run_bundle(path, report_dir=tmp_path / "r", say=lambda *_: None)
    first, second = run.programs
    assert (first.outcome, first.signature[0]) == ("error", "cross-version:crash")
    assert "the runner process was killed by signal 6" in first.message
    assert second.outcome == "agree", second.message   # a fresh process ran the rest
    (finding,) = run.findings
    assert finding.stage == "cross-version:crash" and os.path.exists(os.path.join(finding.folder, "upstream.py"))


def test_a_tampered_file_is_reported_and_never_run(tmp_path):
    path = _bundle(tmp_path / "b")
    inputs = tmp_path / "b" / "p000" / "inputs.npz"
    np.savez(inputs, arg0=A + 1)   # valid arrays, other values: only the digest catches it
    run = run_mod.run_bundle(path, report_dir=tmp_path / "r", say=lambda *_: None)
    (p,) = run.programs
    assert (p.outcome, p.ran, run.ok) == ("rejected", "not run", False)
    assert "p000/inputs.npz: sha256" in p.message and "not run" in p.message
    assert run.findings == []   # the bundle's fault, not JAX's: nothing to file upstream


def test_outside_the_window_is_reported_as_such_not_as_a_failure(tmp_path):
    path = _bundle(tmp_path / "b")
    doc = json.loads((tmp_path / "b" / MANIFEST).read_text())
    doc["programs"][0]["stablehlo_version"] = "99.0.0"   # as from a JAX far newer than this one
    (tmp_path / "b" / MANIFEST).write_text(json.dumps(doc))
    run = run_mod.run_bundle(path, report_dir=tmp_path / "r", say=lambda *_: None)
    (p,) = run.programs
    assert p.outcome == "outside-window" and p.ran == "agree" and run.ok
    assert "StableHLO artifact v99.0.0 is newer than this JAX's" in p.outside[0]
    lines = [json.loads(ln) for ln in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    (case,) = [r for r in lines if r.get("type") == "case"]
    assert case["status"] == "unsupported" and "outside the compatibility window" in case["message"]


def test_drawn_programs_export_and_agree_under_the_same_jax(tmp_path):
    res = write.export_bundle(tmp_path / "b", programs=3, seed=5, say=lambda *_: None)
    assert res.programs == 3
    bundle = read_bundle(tmp_path / "b")
    assert all(e["case_id"].startswith("sharded[") and "def f(" in e["source"] for e in bundle.programs)
    # the exporter ran each artifact itself: a runner can tell a cross-version difference from its own
    assert all(e["exporter_run"]["outcome"] == "agree" for e in bundle.programs), bundle.programs
    run = run_mod.run_bundle(tmp_path / "b", report_dir=tmp_path / "r", say=lambda *_: None)
    assert [p.outcome for p in run.programs] == ["agree"] * 3, [p.message for p in run.programs]


def test_the_runs_tolerances_are_the_sharded_suites(tmp_path):
    from conformance.strategies.sharded import ErrorBound
    from conformance.suites import base
    from conformance.suites import sharded as suite_mod
    from conformance.verdict.compare import Exact, as_outputs

    cases = [c for c in base.draw(suite_mod.strategy("sharded", None, 8), 8, 11) if c.transform != "none"]
    assert cases
    for case in cases:
        want = as_outputs(case.run(refsim))
        ours = run_mod.tolerances(want, [[k, v] for k, v in case.policies])
        for a, b in zip(ours, case.value_model_tolerances()):   # a bundle has no jaxpr: the value model
            assert type(a) is type(b)
            if isinstance(a, ErrorBound):
                assert a.bound == b.bound
            else:
                assert isinstance(a, Exact) and a.signed_zero is False
    with pytest.raises(ValueError, match="unknown policy 'ulp'"):
        run_mod.tolerances(want[:1], [["ulp", 1]])


def test_the_commands_refuse_bad_arguments(tmp_path, capsys):
    from conformance.cli import COMMANDS

    assert COMMANDS["export-bundle"].target == "conformance.export.write:main"
    assert COMMANDS["run-bundle"].target == "conformance.export.run:main"
    assert write.main(["--out", str(tmp_path / "x"), "--programs", "0"]) == 2
    assert "--programs 0" in capsys.readouterr().err
    assert run_mod.main([str(tmp_path)]) == 2
    assert "not an export bundle manifest" in capsys.readouterr().err
