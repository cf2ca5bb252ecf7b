"""`python -m conformance`: arguments, exit status, reports, dispatch to bisect / mutate."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conformance import cli

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the repository


@pytest.mark.parametrize("argv,message", [
    (["run", "--suite", "nope"], "'nope': choose from collectives, layouts, programs, errors, mpmd, sharded, all"),
    (["run", "--examples", "0"], "0 must be >= 1"),
    (["run", "--devices", "two"], "'two' is not an integer"),
])
def test_bad_arguments_exit_2_naming_the_value(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_resume_needs_a_report_folder(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--suite", "errors", "--resume", "--no-progress"])
    assert exc.value.code == 2 and "--resume needs --report DIR" in capsys.readouterr().err


def test_missing_xfails_file_exits_2(capsys, tmp_path):
    assert cli.main(["run", "--suite", "errors", "--no-progress", "--xfails", str(tmp_path / "no.txt")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_run_agrees_writes_reports_and_prints_the_table(tmp_path, capsys):
    rep = tmp_path / "rep"
    code = cli.main(["run", "--suite", "errors,layouts", "--examples", "1", "--no-progress", "--report", str(rep)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "AGREE" in out and "examples/s" in out and "compiling" in out
    assert {"results.jsonl", "junit.xml", "report.html"} <= set(os.listdir(rep))
    # --resume: every case is already finished, the table is the same
    assert cli.main(["run", "--suite", "errors,layouts", "--examples", "1", "--no-progress", "--report", str(rep),
                     "--resume"]) == 0


def test_a_disagreement_exits_1(tmp_path, capsys):
    """Without the CPU xfails file, pbroadcast (no XLA:CPU lowering) is an error, so the run fails."""
    empty = tmp_path / "none.txt"
    empty.write_text("# nothing expected\n")
    code = cli.main(["run", "--suite", "collectives", "--examples", "1", "--no-progress", "--xfails", str(empty),
                     "--shrink-seconds", "0"])
    out = capsys.readouterr().out
    assert code == 1
    assert "DISAGREE" in out


def test_bisect_is_dispatched(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bisect", "--help"])
    assert exc.value.code == 0
    assert "bisect" in capsys.readouterr().out


def test_mutate_is_dispatched(monkeypatch):
    import types

    seen = []
    monkeypatch.setitem(sys.modules, "conformance.engine.mutate", types.SimpleNamespace(main=lambda argv: seen.append(argv) or 3))
    import conformance

    monkeypatch.setattr(conformance, "mutate", sys.modules["conformance.engine.mutate"], raising=False)
    assert cli.main(["mutate", "--faults", "x"]) == 3
    assert seen == [["--faults", "x"]]


def test_module_entry_point_runs_in_a_fresh_process(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    p = subprocess.run([sys.executable, "-m", "conformance", "run", "--suite", "layouts", "--examples", "1",
                        "--no-progress", "--devices", "4"], cwd=str(tmp_path), env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "AGREE" in p.stdout
