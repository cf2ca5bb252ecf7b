"""A verdict covers the whole plan or says it does not (issue 28, points 1 and 2, Ctrl-C of 7).

An interrupted run, a run whose executor stopped early (a lost distributed process), one shard,
or a merge of some shards is INCOMPLETE: exit status 3, junit ``complete="false"`` with a failing
test case, and a summary naming the missing cases; `--resume` then completes it. `--resume`
refuses a results file without a plan line, with other xfails, or with a foreign case line, and
so does `merge` for a foreign line.

The expected case ids come from the plan generator (`runner.plan_tasks`) and from the files the
run wrote, never from the coverage code under test.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from conformance import cli
from conformance.engine import merge, runner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SMALL = dict(suite="layouts", examples=1, progress=False, processes=None, shrink_seconds=0)
CLI_SMALL = ["run", "--suite", "layouts", "--examples", "1", "--no-progress", "--processes", "1"]
# The CLI with every case taking `sys.argv[1]` seconds more in its worker and again once it is
# recorded, so a signal sent once the first case is recorded always finds cases still to run: the
# workers run cases while the plan is still being drawn and the reporters see them only once it
# is, so a fast worker could have run all of them by the first record (the signal would then
# come after the last case, where the verdict stands). `slow_task` is `SLOW_TASK` in a folder on
# the PYTHONPATH (the spawned workers import it by name).
SLOW_TASK = ("import os, time\n"
             "from conformance.engine import runner\n"
             "_run_task = runner.run_task\n"
             "def run_task(*args, **kwargs):\n"
             "    time.sleep(float(os.environ['SLOW_TASK_SECONDS']))\n"
             "    return _run_task(*args, **kwargs)\n")
SLOW_CLI = ("import os, sys, time\n"
            "os.environ['SLOW_TASK_SECONDS'] = sys.argv[1]\n"
            "import slow_task\n"
            "from conformance.engine import runner\n"
            "runner.run_task = slow_task.run_task\n"
            "from conformance.report import jsonl\n"
            "orig = jsonl.JsonlReporter.case_finished\n"
            "def slow(self, result):\n"
            "    orig(self, result)\n"
            "    time.sleep(float(sys.argv[1]))\n"
            "jsonl.JsonlReporter.case_finished = slow\n"
            "from conformance.cli import main\n"
            "sys.exit(main(sys.argv[2:]))\n")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["CONFORMANCE_COMPILE_CACHE"] = "off"
    return env


def records(folder):
    with open(os.path.join(folder, "results.jsonl"), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def case_ids(folder):
    return [r["case_id"] for r in records(folder) if r["type"] == "case"]


def junit(folder):
    root = ET.parse(os.path.join(folder, "junit.xml")).getroot()
    complete = {p.get("value") for p in root.iter("property") if p.get("name") == "complete"}
    errors = [e for e in root.iter("error") if e.get("type") == "incomplete"]
    return root, complete, errors


def planned(**kw):
    args = {"suite": "layouts", "examples": 1, **kw}
    return [t.case_id for t in runner.plan_tasks(args.pop("suite"), **args)]


def _wait_for_a_case(proc, folder, limit_s=300):
    path = os.path.join(folder, "results.jsonl")
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the run ended before recording a case: {proc.returncode}\n{out}\n{err}")
        try:
            with open(path, encoding="utf-8") as fh:
                if any('"type":"case"' in line for line in fh):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("no case was recorded")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_makes_the_run_incomplete_in_one_line_and_resume_completes_it(tmp_path, sig):
    folder = str(tmp_path / "rep")
    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "slow_task.py").write_text(SLOW_TASK)
    env = _env()
    env["PYTHONPATH"] = str(tmp_path / "slow") + os.pathsep + env["PYTHONPATH"]
    # The signal's default disposition in the child: a shell without job control starts a background
    # job (`pytest ... &`) with SIGINT ignored, every process below inherits that, and the run keeps a
    # handler it did not install (an ignored SIGINT stays ignored, as `nohup` leaves SIGHUP) and finishes.
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CLI, "2", *CLI_SMALL, "--report", folder],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(getattr(signal, sig), signal.SIG_DFL))
    _wait_for_a_case(proc, folder)
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err + out, err
    want = planned()
    done = case_ids(folder)
    missing = [c for c in want if c not in done]
    assert 1 <= len(done) < len(want) and missing
    assert f"interrupted by {sig} after {len(done)} of {len(want)} cases" in lines[0]
    assert f"{len(missing)} cases missing" in lines[0] and "--resume" in lines[0]
    assert "continue with: python -m conformance run --suite" in lines[0], lines[0]  # the subcommand included
    summary = records(folder)[-1]
    assert summary["type"] == "summary" and summary["verdict"] == "INCOMPLETE" and not summary["ok"]
    assert summary["complete"] is False and summary["interrupted"] == f"interrupted by {sig}"
    assert summary["planned_cases"] == len(want) and summary["missing_cases"] == len(missing)
    assert summary["missing_case_ids"] == missing[:10]
    _, complete, errors = junit(folder)
    assert complete == {"false"} and len(errors) == 1 and f"{len(missing)} of {len(want)}" in errors[0].get("message")
    page = open(os.path.join(folder, "report.html"), encoding="utf-8").read()
    assert "INCOMPLETE" in page and "AGREE" not in page.replace("DISAGREE", "") and missing[0] in page
    assert not os.path.exists(os.path.join(folder, "conformance.lock"))
    if sig != "SIGINT":
        return
    # the same command with --resume runs only the missing cases and completes the plan
    again = subprocess.run([sys.executable, "-m", "conformance", *CLI_SMALL, "--report", folder, "--resume"],
                           capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "AGREE" in again.stdout and "INCOMPLETE" not in again.stdout
    assert sorted(case_ids(folder)) == sorted(want) and case_ids(folder)[:len(done)] == done
    summary = records(folder)[-1]
    assert summary["verdict"] == "AGREE" and summary["complete"] and summary["missing_cases"] == 0
    root, complete, errors = junit(folder)
    assert complete == {"true"} and not errors and root.get("tests") == str(len(want))


class _StopsEarly:
    """An executor that runs two cases, then fails as a lost distributed process does."""

    def __call__(self, todo, opts):
        for task, entry in todo[:2]:
            yield runner.run_task(task, None, entry, **opts)
        raise RuntimeError("process 1 did not send its results of case #2: it is hung or has died")


def test_an_executor_that_stops_early_leaves_an_incomplete_report(tmp_path):
    folder = tmp_path / "rep"
    with pytest.raises(RuntimeError, match="process 1 did not send"):
        runner.run(report_dir=folder, executor=_StopsEarly(), **SMALL)
    want = planned()
    summary = records(folder)[-1]
    assert summary["verdict"] == "INCOMPLETE" and summary["missing_cases"] == len(want) - 2
    assert summary["missing_case_ids"] == want[2:12]
    assert summary["interrupted"].startswith("stopped by RuntimeError: process 1 did not send")
    _, complete, errors = junit(folder)
    assert complete == {"false"} and errors


def test_a_complete_run_is_agree_with_the_plan_ids_in_its_plan_line(tmp_path):
    res = runner.run(report_dir=tmp_path / "rep", **SMALL)
    assert res.verdict == "AGREE" and res.complete and res.ok
    plan = records(tmp_path / "rep")[0]
    assert plan["type"] == "plan" and plan["case_ids"] == planned() and plan["xfails_digest"].startswith("sha256:")


# -- merge ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    for k in (1, 2):
        assert runner.run(report_dir=root / f"s{k}", shard=(k, 2), **SMALL).ok
    return root


def _merge(capsys, *argv):
    code = merge.main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_a_merge_of_one_of_two_shards_is_incomplete(shards, tmp_path, capsys):
    want, first = planned(), planned()[0::2]
    assert case_ids(shards / "s1") == first
    code, out, _ = _merge(capsys, shards / "s1", "--out", tmp_path / "m")
    assert code == 3
    assert "INCOMPLETE" in out and "AGREE" not in out.replace("DISAGREE", "") and "missing shard 2/2" in out
    summary = records(tmp_path / "m")[-1]
    assert summary["verdict"] == "INCOMPLETE" and summary["missing_shards"] == ["2/2"]
    assert summary["planned_cases"] == len(want) and summary["missing_cases"] == len(want) - len(first)
    _, complete, errors = junit(tmp_path / "m")
    assert complete == {"false"} and errors


def test_a_merge_of_every_shard_is_the_whole_plan(shards, tmp_path, capsys):
    code, out, _ = _merge(capsys, shards / "s2", shards / "s1", "--out", tmp_path / "m")
    assert code == 0 and "AGREE" in out
    plan, summary = records(tmp_path / "m")[0], records(tmp_path / "m")[-1]
    assert plan["case_ids"] == planned() and summary["complete"] and summary["verdict"] == "AGREE"


def _drop_last_case(folder):
    """The shard's run killed before its last case (no summary either)."""
    recs = records(folder)
    last = [i for i, r in enumerate(recs) if r["type"] == "case"][-1]
    kept = [r for i, r in enumerate(recs) if i != last and r["type"] != "summary"]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    return recs[last]["case_id"]


def test_a_merge_with_a_shard_that_lost_cases_names_them(shards, tmp_path, capsys):
    s2 = tmp_path / "s2"
    shutil.copytree(shards / "s2", s2)
    lost = _drop_last_case(s2)
    code, out, _ = _merge(capsys, shards / "s1", s2, "--out", tmp_path / "m")
    assert code == 3 and lost in out
    summary = records(tmp_path / "m")[-1]
    assert summary["missing_cases"] == 1 and summary["missing_case_ids"] == [lost]


def test_a_merge_of_an_interrupted_unsharded_run_is_incomplete(tmp_path, capsys):
    folder = tmp_path / "full"
    assert runner.run(report_dir=folder, **SMALL).ok
    lost = _drop_last_case(folder)
    code, out, _ = _merge(capsys, folder, "--out", tmp_path / "m")
    assert code == 3 and "INCOMPLETE" in out and lost in out
    assert records(tmp_path / "m")[-1]["missing_case_ids"] == [lost]


def _append_foreign_case(folder):
    rec = next(r for r in records(folder) if r["type"] == "case")
    rec = {**rec, "case_id": "psum[axes=('x',),groups=none,dtype=float32,mesh=3:copied-in]"}
    with open(folder / "results.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec) + "\n")
    return rec["case_id"]


def test_merge_refuses_a_foreign_case_line(shards, tmp_path, capsys):
    s2 = tmp_path / "s2"
    shutil.copytree(shards / "s2", s2)
    foreign = _append_foreign_case(s2)
    code, _, err = _merge(capsys, shards / "s1", s2, "--out", tmp_path / "m")
    assert code == 2 and foreign in err and "not in its plan" in err
    assert not (tmp_path / "m").exists()


# -- resume -------------------------------------------------------------------------------------------------
def test_resume_refuses_a_foreign_case_line(shards, tmp_path):
    folder = tmp_path / "s1"
    shutil.copytree(shards / "s1", folder)
    foreign = _append_foreign_case(folder)
    before = (folder / "results.jsonl").read_bytes()
    with pytest.raises(ValueError, match="not in this plan") as info:
        runner.run(report_dir=folder, resume=True, shard=(1, 2), **SMALL)
    assert foreign in str(info.value) and str(folder / "results.jsonl") in str(info.value)
    assert (folder / "results.jsonl").read_bytes() == before


def test_resume_refuses_a_results_file_without_a_plan_line(shards, tmp_path, capsys):
    folder = tmp_path / "s1"
    shutil.copytree(shards / "s1", folder)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records(folder)
                                                  if r["type"] == "case"))
    code = cli.main(CLI_SMALL + ["--shard", "1/2", "--report", str(folder), "--resume"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1
    assert "no plan line" in err[0] and str(folder / "results.jsonl") in err[0]


def test_resume_refuses_other_xfails(shards, tmp_path):
    folder = tmp_path / "s1"
    shutil.copytree(shards / "s1", folder)
    other = tmp_path / "other.txt"
    other.write_text("NamedSharding* raises(ValueError, /x/): listed to change the verdicts\n")
    with pytest.raises(ValueError, match="other xfails entries") as info:
        runner.run(report_dir=folder, resume=True, shard=(1, 2), xfails=str(other), **SMALL)
    assert str(other) in str(info.value) and "new --report folder" in str(info.value)
    # the same entries under another name (a copy of the file) resume fine: the digest is of the entries
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing expected\n")
    same = runner.run(report_dir=tmp_path / "fresh", xfails=str(empty), **SMALL)
    assert same.ok
    blank = tmp_path / "blank.txt"
    blank.write_text("\n")
    assert runner.run(report_dir=tmp_path / "fresh", resume=True, xfails=str(blank), **SMALL).ok


@pytest.mark.multiprocess
def test_a_distributed_run_that_loses_a_process_is_incomplete(tmp_path):
    """Process 1 hangs at its third case: process 0 ends the run naming it, its report is INCOMPLETE
    (it was `ok` and complete before) and its exit status is 3."""
    import re

    folder = tmp_path / "rep"
    r = subprocess.run([sys.executable, "-m", "xla_backend", "launch", "--processes", "2", "--devices-per-process", "4",
                        "--timeout", "400", "--", sys.executable, "-m", "conformance", "run", "--distributed",
                        "--suite", "collectives", "--no-progress", "--examples", "1", "--case-timeout", "5",
                        "--report", str(folder)], capture_output=True, text=True, timeout=500, cwd=ROOT,
                       env={**_env(), "CONFORMANCE_DISTRIBUTED_FAULT": "hang:1:2"})
    assert r.returncode == 3  # process 0's "did not finish", passed on by the launcher
    assert re.search(r"launch: process 0 \(pid \d+\): exit status 3", r.stderr), r.stderr[-3000:]
    recs = records(folder)
    plan, summary = recs[0], recs[-1]
    done = [x["case_id"] for x in recs if x["type"] == "case"]
    assert len(done) == 2 and done == plan["case_ids"][:2]
    assert summary["type"] == "summary" and summary["verdict"] == "INCOMPLETE" and not summary["ok"]
    assert summary["missing_cases"] == len(plan["case_ids"]) - 2
    assert summary["interrupted"].startswith("stopped by DistributedRunError: process 1 did not send")
    _, complete, errors = junit(folder)
    assert complete == {"false"} and errors
