"""`--shard K/N`, `python -m conformance merge`, plan identity for --resume, and the platform preflight."""
import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance import cli
from conformance.engine import merge, runner
from conformance.engine.plan import parse_shard, select_shard, select_shard_chunks

BASE = ["run", "--suite", "errors,layouts", "--examples", "1", "--no-progress"]
PLAN = dict(suite="errors,layouts", examples=1, progress=False, processes=None, shrink_seconds=0)


def cases(folder):
    """[(case_id, status)] of a report folder's results.jsonl, in file order."""
    out = []
    for line in (folder / "results.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["type"] == "case":
            out.append((rec["case_id"], rec["status"]))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    codes = {}
    # in this process (the CLI's workers would only add start-up time); the CLI is tested below
    for name, shard in (("full", None), ("s1", (1, 2)), ("s2", "2/2")):
        codes[name] = 0 if runner.run(report_dir=root / name, shard=shard, **PLAN).ok else 1
    return root, codes


@given(st.lists(st.integers(), max_size=30), st.integers(1, 7))
def test_shards_partition_the_plan_and_interleave_back(tasks, n):
    shards = [select_shard(tasks, (k, n)) for k in range(1, n + 1)]
    assert sum(len(s) for s in shards) == len(tasks)
    # position p of the plan is in shard p % n + 1, at index p // n
    rebuilt = [shards[p % n][p // n] for p in range(len(tasks))]
    assert rebuilt == tasks


@given(st.lists(st.lists(st.integers(), max_size=6), max_size=8), st.integers(1, 5), st.data())
def test_a_shard_of_a_plan_drawn_in_chunks_is_the_shard_of_the_whole_plan(chunks, n, data):
    # the streamed run draws family by family: positions count across the chunks
    k = data.draw(st.integers(1, n))
    whole = [t for c in chunks for t in c]
    got = list(select_shard_chunks(iter(chunks), (k, n)))
    assert len(got) == len(chunks)                      # one (maybe empty) list per chunk, as it comes
    want = [t for p, t in enumerate(whole) if p % n == k - 1]
    assert [t for c in got for t in c] == want == select_shard(whole, f"{k}/{n}")
    assert list(select_shard_chunks(iter(chunks), None)) == chunks


def test_a_bad_shard_of_a_chunked_plan_is_refused_before_drawing():
    def never():
        raise AssertionError("drawn")
        yield

    with pytest.raises(ValueError, match="--shard '3/2'"):
        select_shard_chunks(never(), "3/2")


def test_two_shards_merged_are_exactly_the_unsplit_run(runs, tmp_path, capsys):
    root, codes = runs
    assert codes == {"full": 0, "s1": 0, "s2": 0}
    full, s1, s2 = cases(root / "full"), cases(root / "s1"), cases(root / "s2")
    assert s1 and s2 and not {c for c, _ in s1} & {c for c, _ in s2}
    assert merge.main([str(root / "s1"), str(root / "s2"), "--out", str(tmp_path / "merged")]) == 0
    merged = cases(tmp_path / "merged")
    # exactly the cases of the unsplit run, each once, with the same outcomes (workers finish in any order)
    assert len(merged) == len(full) == len(dict(merged)) and dict(merged) == dict(full)
    assert merged == s1 + s2
    for name in ("junit.xml", "report.html"):
        assert (tmp_path / "merged" / name).stat().st_size > 0
    records = [json.loads(x) for x in (tmp_path / "merged" / "results.jsonl").read_text().splitlines()]
    summary = records[-1]
    assert summary["type"] == "summary" and summary["cases"] == len(full) and summary["ok"]
    assert records[0]["shards"] == ["1/2", "2/2"] and "missing_shards" not in records[0]
    assert "AGREE" in capsys.readouterr().out


def test_merge_refuses_folders_of_another_plan(runs, tmp_path, capsys):
    root, _ = runs
    other = tmp_path / "seed1"
    assert runner.run(report_dir=other, shard=(2, 2), **{**PLAN, "seed": 1}).ok
    assert merge.main([str(root / "s1"), str(other), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "another plan" in err and "seed: 0 in" in err and "1 in" in err and str(other) in err
    assert not (tmp_path / "m").exists()  # nothing is written


@pytest.mark.parametrize("pair, message", [
    (("s1", "s1"), "are both shard 1/2"),
    (("s1", "full"), "cannot merge sharded and unsharded folders"),
])
def test_merge_refuses_overlapping_folders(runs, tmp_path, capsys, pair, message):
    root, _ = runs
    assert merge.main([str(root / pair[0]), str(root / pair[1]), "--out", str(tmp_path / "m")]) == 2
    assert message in capsys.readouterr().err


def test_merge_refuses_a_folder_without_results(tmp_path, capsys):
    assert merge.main([str(tmp_path), "--out", str(tmp_path / "m")]) == 2
    assert "is not a report folder" in capsys.readouterr().err


@pytest.mark.parametrize("change, message", [
    ({"seed": 5}, "seed: 0 there, 5 now"),
    ({"examples": 2}, "examples: 1 there, 2 now"),
    ({"shard": (2, 2)}, "shard: 1/2 there, 2/2 now"),
    ({"shard": None}, "shard: 1/2 there, none now"),
])
def test_resume_refuses_a_folder_of_another_plan(runs, tmp_path, change, message):
    import shutil

    root, _ = runs
    folder = tmp_path / "resume"
    shutil.copytree(root / "s1", folder)
    before = (folder / "results.jsonl").read_bytes()
    with pytest.raises(ValueError, match="another plan") as info:
        runner.run(report_dir=folder, resume=True, **{**PLAN, "shard": (1, 2), **change})
    assert message in str(info.value)
    assert (folder / "results.jsonl").read_bytes() == before  # untouched


def test_cli_resume_of_another_seed_is_one_line_exit_2(runs, tmp_path, capsys):
    import shutil

    root, _ = runs
    folder = tmp_path / "resume"
    shutil.copytree(root / "s1", folder)
    assert cli.main(BASE + ["--report", str(folder), "--resume", "--shard", "1/2", "--seed", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "seed: 0 there, 3 now" in err[0]


def test_resume_of_the_same_plan_and_shard_runs_nothing_new(runs, tmp_path):
    import shutil

    root, _ = runs
    folder = tmp_path / "resume"
    shutil.copytree(root / "s1", folder)
    assert runner.run(report_dir=folder, resume=True, shard="1/2", **PLAN).ok
    assert cases(folder) == cases(root / "s1")


@pytest.mark.parametrize("text", ["0/2", "3/2", "a/b", "1", "1/0", "-1/2"])
def test_bad_shards_are_refused(text):
    with pytest.raises(ValueError, match="--shard"):
        parse_shard(text)
    with pytest.raises(SystemExit) as info:
        cli.main(BASE + ["--shard", text])
    assert info.value.code == 2


def _has_cuda_plugin() -> bool:
    from xla_backend.platform import installed_plugins

    return any("cuda" in name for name in installed_plugins())


@pytest.mark.skipif(_has_cuda_plugin(), reason="a CUDA plugin is installed: the platform may well start here")
def test_preflight_names_a_missing_platform_in_one_line_before_any_case():
    r = subprocess.run([sys.executable, "-m", "conformance", "run", "--platform", "cuda", "--suite", "errors",
                        "--examples", "1", "--no-progress"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "platform 'cuda'" in lines[0] and "pip install" in lines[0] and "--platform" in lines[0]
    assert r.stdout == ""  # no case ran, no table
