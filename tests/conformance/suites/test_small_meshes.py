"""Runs on machines with few devices (one GPU, two chips): every suite draws only what a mesh of
that size can express, and the plan names the families it could not draw."""
import pytest
from hypothesis import given, settings
from hypothesis.errors import InvalidArgument

from conformance.engine import runner
from conformance.suites.mpmd_checks import mpmd_cases
from conformance.suites import errors


def _families(tasks):
    return {t.family for t in tasks}


@pytest.mark.parametrize("devices, missing", [
    (1, {"perm_repeated_source", "perm_repeated_destination", "perm_out_of_range", "groups_unequal",
         "groups_repeated_index", "groups_missing_index", "spec_indivisible"}),
    (2, {"perm_repeated_source", "perm_repeated_destination", "perm_out_of_range", "groups_unequal",
         "groups_repeated_index", "groups_missing_index"}),
    (3, set()),
])
def test_errors_suite_draws_what_the_mesh_can_express(devices, missing):
    tasks = runner.plan_tasks("errors", examples=2, seed=0, devices=devices)
    assert _families(tasks) == set(errors.KINDS) - missing
    assert {line.split(":")[0] for line in runner.not_drawn("errors", devices=devices)} == \
        {f"errors/{k}" for k in missing}


def test_mpmd_suite_on_one_device_is_not_drawn_and_says_so():
    assert runner.plan_tasks("mpmd", examples=2, seed=0, devices=1) == []
    assert runner.not_drawn("mpmd", devices=1) == [
        "mpmd/round_trip: an MPMD mesh needs at least 2 devices (2 groups)"]
    assert runner.not_drawn("mpmd", devices=2) == []
    assert len(runner.plan_tasks("mpmd", examples=2, seed=0, devices=2)) >= 1


@settings(max_examples=25, deadline=None)
@given(mpmd_cases(max_devices=3))
def test_mpmd_cases_fit_the_devices(case):
    assert case.mesh(list(range(3))).size <= 3


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
def test_mpmd_cases_refuse_a_single_device():
    with pytest.raises(InvalidArgument, match="max_devices=1"):
        mpmd_cases(max_devices=1).example()


def test_one_device_run_of_every_suite_agrees_and_lists_what_it_skipped(tmp_path):
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "conformance", "run", "--devices", "1", "--examples", "1",
                        "--suite", "errors,mpmd,layouts", "--no-progress", "--shrink-seconds", "0",
                        "--compile-cache", "off", "--report", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    plan = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[0])
    assert plan["type"] == "plan" and "mpmd/round_trip: an MPMD mesh needs at least 2 devices (2 groups)" in plan["not_drawn"]
    assert "not drawn on 1 device(s)" in r.stdout
