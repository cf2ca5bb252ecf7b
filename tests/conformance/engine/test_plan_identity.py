"""The plan identity (issue 38): data sets per program, xfails strictness, partitioner, x64 and the
project's own version are part of it; `--resume` and `merge` refuse a mismatch or a plan record
that lacks one of them, naming the field."""
import json
import re
import shutil

import jax
import pytest

from conformance import cli
from conformance.engine import merge, plan, runner

PLAN = dict(suite="errors,layouts", examples=1, progress=False, processes=None, shrink_seconds=0)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    for k in (1, 2):
        assert runner.run(report_dir=root / f"s{k}", shard=(k, 2), data_per_program=3, **PLAN).ok
    return root


def _plan_line(folder):
    lines = (folder / "results.jsonl").read_text().splitlines()
    return json.loads(lines[0])


def _edit_plan(folder, change=None, drop=()):
    lines = (folder / "results.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    assert rec["type"] == "plan"
    rec.update(change or {})
    for k in drop:
        rec.pop(k)
    (folder / "results.jsonl").write_text("\n".join([json.dumps(rec)] + lines[1:]) + "\n")


def test_the_plan_record_carries_every_identity_field(shards):
    rec = _plan_line(shards / "s1")
    assert set(plan.RECORDED_KEYS) <= set(rec) and plan.unrecorded(rec) == []
    assert rec["data_per_program"] == 3 and rec["strict_xfails"] is False
    assert rec["partitioner"] in ("shardy", "gspmd") and isinstance(rec["x64"], bool)
    assert rec["project"] == plan.project_identity()


def test_project_identity_is_the_version_and_a_digest_of_the_sources():
    from importlib import metadata

    ident = plan.project_identity()
    assert re.fullmatch(r"[^+]+\+sha256:[0-9a-f]{64}", ident)
    assert ident.startswith(metadata.version("jax-conformance") + "+")
    assert plan.project_identity() is ident   # computed once per process


def test_config_entries_follow_jax_config():
    before = jax.config.jax_use_shardy_partitioner
    try:
        jax.config.update("jax_use_shardy_partitioner", False)
        assert plan.config_entries()["partitioner"] == "gspmd"
        jax.config.update("jax_use_shardy_partitioner", True)
        assert plan.config_entries()["partitioner"] == "shardy"
    finally:
        jax.config.update("jax_use_shardy_partitioner", before)


def test_differences_name_each_field_and_a_field_not_recorded():
    a = {"seed": 0, "data_per_program": 10, "project": "0.1.0+sha256:aa", "device_kinds": "cpu"}
    b = {"seed": 0, "data_per_program": 3, "strict_xfails": True, "project": "0.1.0+sha256:bb"}
    assert plan.differences(a, b) == ["data_per_program: 10 there, 3 now",
                                      "strict_xfails: not recorded there, True now",
                                      "project: '0.1.0+sha256:aa' there, '0.1.0+sha256:bb' now"]
    # a hardware entry only one record has (an API run records none) is not compared
    assert plan.differences({"process_count": 1}, {"process_count": 2}) == ["process_count: 1 there, 2 now"]


@pytest.mark.parametrize("change, message", [
    ({"data_per_program": 4}, "data_per_program: 3 there, 4 now"),
    ({"strict_xfails": True}, "strict_xfails: False there, True now"),
])
def test_resume_refuses_another_option_that_changes_what_is_checked(shards, tmp_path, change, message):
    folder = tmp_path / "r"
    shutil.copytree(shards / "s1", folder)
    before = (folder / "results.jsonl").read_bytes()
    opts = {**PLAN, "shard": (1, 2), "data_per_program": 3, **change}
    with pytest.raises(ValueError, match="another plan") as info:
        runner.run(report_dir=folder, resume=True, **opts)
    assert message in str(info.value)
    assert (folder / "results.jsonl").read_bytes() == before


@pytest.mark.parametrize("field", ["project", "partitioner", "x64"])
def test_resume_refuses_a_folder_of_other_code_or_config(shards, tmp_path, field):
    folder = tmp_path / "r"
    shutil.copytree(shards / "s1", folder)
    other = {"project": "0.0.9+sha256:" + "0" * 64, "partitioner": "other", "x64": "other"}[field]
    _edit_plan(folder, {field: other})
    with pytest.raises(ValueError, match=re.escape(f"{field}: {other!r} there, ")):
        runner.run(report_dir=folder, resume=True, shard=(1, 2), data_per_program=3, **PLAN)


def test_resume_refuses_a_plan_record_without_a_field_naming_it(shards, tmp_path, capsys):
    folder = tmp_path / "r"
    shutil.copytree(shards / "s1", folder)
    _edit_plan(folder, drop=("data_per_program", "project"))
    code = cli.main(["run", "--suite", "errors,layouts", "--examples", "1", "--no-progress", "--processes", "1",
                     "--report", str(folder), "--resume", "--shard", "1/2", "--data-per-program", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "data_per_program: not recorded there, 3 now" in err[0] and "project: not recorded there" in err[0]
    assert "has no data_per_program, project" in err[0]


def test_merge_refuses_shards_of_another_data_per_program(shards, tmp_path, capsys):
    other = tmp_path / "s2"
    assert runner.run(report_dir=other, shard=(2, 2), data_per_program=5, **PLAN).ok
    assert merge.main([str(shards / "s1"), str(other), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert f"data_per_program: 3 in {shards / 's1'}, 5 in {other}" in err
    assert not (tmp_path / "m").exists()


def test_merge_refuses_a_folder_of_other_code(shards, tmp_path, capsys):
    other = tmp_path / "s2"
    shutil.copytree(shards / "s2", other)
    _edit_plan(other, {"project": "0.0.9+sha256:" + "0" * 64})
    assert merge.main([str(shards / "s1"), str(other), "--out", str(tmp_path / "m")]) == 2
    assert "project: '" in capsys.readouterr().err


def test_merge_refuses_folders_whose_plan_records_lack_a_field(shards, tmp_path, capsys):
    old = []
    for k in (1, 2):
        old.append(tmp_path / f"s{k}")
        shutil.copytree(shards / f"s{k}", old[-1])
        _edit_plan(old[-1], drop=("data_per_program", "strict_xfails"))
    # both older: they agree with each other, but neither can be shown to be of this plan's code
    assert merge.main([str(p) for p in old] + ["--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "plan record has no data_per_program, strict_xfails" in err and str(old[0]) in err
    # one older folder beside a current one: named as not recorded
    assert merge.main([str(shards / "s1"), str(old[1]), "--out", str(tmp_path / "m")]) == 2
    assert "data_per_program: 3 in" in capsys.readouterr().err


def test_merge_of_one_plan_still_merges(shards, tmp_path):
    assert merge.main([str(shards / "s1"), str(shards / "s2"), "--out", str(tmp_path / "m")]) == 0
    assert _plan_line(tmp_path / "m")["data_per_program"] == 3
