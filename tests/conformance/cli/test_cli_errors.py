"""Issue 19's CLI and report findings: every bad argument or unusable report folder is one line on
stderr and exit status 2, nothing half-written is left behind, and the console/HTML output says
what a reader needs (versions, where reports go, one time, preformatted multi-line messages)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conformance import cli
from conformance.engine import runner
from conformance.report import (HTML_NAME, JSONL_NAME, JUNIT_NAME, HtmlReporter, JsonlReporter, JUnitReporter,
                                ProgressReporter, load_finished, print_table)
from conformance.report.html import render_page
from conformance.report.results import CaseResult, summarize

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the repository


def _one_line_exit_2(argv, capsys, needle):
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("argv,needle", [
    (["run", "--shrink-seconds", "-1"], "argument --shrink-seconds: '-1' must be a finite number >= 0"),
    (["run", "--shrink-seconds", "nan"], "argument --shrink-seconds: 'nan' must be a finite number >= 0"),
    (["run", "--shrink-seconds", "soon"], "'soon' is not a number of seconds"),
    (["run", "--seed", "-3"], "argument --seed: -3 must be >= 0"),
    (["run", "--examples", "0"], "argument --examples: 0 must be >= 1"),
    (["run", "--suite", "errors", "--resume", "--no-progress"], "--resume needs --report DIR"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, needle, capsys):
    _one_line_exit_2(argv, capsys, needle)


def _no_tmp_left(folder):
    left = [n for n in os.listdir(folder) if ".tmp" in n]
    assert not left, left


def test_report_that_is_a_file_or_cannot_be_created(tmp_path, capsys):
    f = tmp_path / "taken"
    f.write_text("")
    _one_line_exit_2(["run", "--suite", "errors", "--no-progress", "--report", str(f)], capsys,
                     f"report folder {str(f)!r} is a file; pass a folder for --report")
    under_a_file = f / "reports"  # NotADirectoryError, even for root
    _one_line_exit_2(["run", "--suite", "errors", "--no-progress", "--report", str(under_a_file)], capsys,
                     "cannot be created or written")


@pytest.mark.parametrize("name", [JSONL_NAME, JUNIT_NAME, HTML_NAME])
def test_report_file_that_is_a_folder_is_refused_before_anything_is_written(name, tmp_path, capsys):
    rep = tmp_path / "rep"
    (rep / name).mkdir(parents=True)
    _one_line_exit_2(["run", "--suite", "errors", "--no-progress", "--report", str(rep)], capsys,
                     f"{name} there is a folder; remove it or pass another folder")
    assert sorted(os.listdir(rep)) == [name]  # nothing else was created


def test_reporters_leave_no_tmp_file_when_the_target_is_a_folder(tmp_path):
    for cls, name in ((JUnitReporter, JUNIT_NAME), (HtmlReporter, HTML_NAME), (JsonlReporter, JSONL_NAME)):
        folder = tmp_path / cls.__name__
        (folder / name).mkdir(parents=True)
        with pytest.raises(IsADirectoryError):
            cls(str(folder / name)).start({"platform": "cpu"})
        _no_tmp_left(folder)


def test_resume_from_a_case_line_without_case_id_is_a_one_line_error(tmp_path, capsys):
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / JSONL_NAME).write_text(json.dumps({"type": "plan"}) + "\n"
                                  + json.dumps({"type": "case", "suite": "errors", "status": "pass"}) + "\n")
    with pytest.raises(ValueError, match=r"lacks 'case_id', 'family', 'dtype'"):
        load_finished(rep / JSONL_NAME)
    _one_line_exit_2(["run", "--suite", "errors", "--no-progress", "--report", str(rep), "--resume"], capsys,
                     "lacks 'case_id'")


def test_bisect_subcommand_configures_the_platform(tmp_path):
    """`python -m conformance bisect FILE` in a fresh process: the reproducer's 8 device ids exist."""
    repro = tmp_path / "ring.py"
    repro.write_text(textwrap.dedent('''\
        # conformance reproducer v1: shard_map/ring/2x4:reversed
        import numpy as np, jax
        from jax.sharding import PartitionSpec as P
        MESH_SHAPE = (2, 4)
        AXIS_NAMES = ('x', 'y')
        DEVICE_IDS = [[7, 6, 5, 4], [3, 2, 1, 0]]
        KIND = "shard_map"
        IN_SPECS = (P('x', 'y'),)
        OUT_SPECS = P(None, 'y')
        CHECK_VMA = True
        def program(a):
            return jax.lax.psum(jax.lax.ppermute(a, 'y', [(0, 1), (1, 2)]), 'x')
        def inputs(): return (np.arange(32, dtype=np.float32).reshape(4, 8),)
        TOLERANCE = "exact"
        '''))
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "conformance", "bisect", str(repro)], capture_output=True, text=True,
                       env=env, cwd=str(tmp_path), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "MATCH" in p.stdout and "not JAX devices" not in p.stdout + p.stderr


def _results():
    return [CaseResult("psum[a]", "collectives", "psum", "float32", "pass", examples=3),
            CaseResult("pbroadcast[b]", "collectives", "pbroadcast", "float32", "unsupported",
                       message="XLA:CPU has no lowering for pbroadcast"),
            CaseResult("pmean[c]", "collectives", "pmean", "int32", "xfail",
                       message="expected failure: reciprocal multiply\ndevice 3: 1 of 4 elements differ\n  [0]: 1 vs 2")]


def test_console_summary_names_versions_and_says_where_reports_go(tmp_path, capsys):
    import rich.console

    summary = summarize(_results(), wall_seconds=2.0, compile_seconds=1.0)
    summary["plan"] = {"platform": "cpu", "devices": 8, "jax": "0.10.2", "jaxlib": "0.10.2", "numpy": "2.4.6",
                       "python": "3.11.9"}
    buf = io.StringIO()
    print_table(summary, rich.console.Console(file=buf, width=120), results=_results())
    assert "platform cpu (8 devices); jax 0.10.2, jaxlib 0.10.2, numpy 2.4.6, python 3.11.9" in buf.getvalue()
    assert cli.main(["run", "--suite", "errors", "--examples", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "no report written: pass --report DIR" in out and "jax " in out and "jaxlib " in out


def test_progress_bar_ends_on_the_summary_time():
    import rich.console

    buf = io.StringIO()
    bar = ProgressReporter(total=3, console=rich.console.Console(file=buf, width=160, force_terminal=False))
    bar.start({"platform": "cpu", "devices": 8})
    for r in _results():
        bar.case_finished(r)
    summary = summarize(_results(), wall_seconds=123.4, compile_seconds=1.0)
    task = bar._progress.tasks[0]
    bar.finish(summary)
    assert task.fields["elapsed"] == "123.4 s" and task.fields["rate"] == "0.0 ex/s"


def test_html_keeps_multi_line_messages_preformatted():
    page = render_page(_results(), {"platform": "cpu"}, summarize(_results(), wall_seconds=1.0, compile_seconds=0.0))
    assert ('<pre class="message">expected failure: reciprocal multiply\ndevice 3: 1 of 4 elements differ\n'
            '  [0]: 1 vs 2</pre>') in page
    assert page.count("XLA:CPU has no lowering for pbroadcast") == 1


def test_unsupported_message_is_said_once():
    from conformance.verdict import xfails
    from conformance.suites import base

    entry = xfails.parse('pbroadcast[* unsupported: no lowering ("MLIR translation rule for primitive '
                         "'pbroadcast' not found for platform cpu\")")[0]
    out = base.Outcome("unsupported", "MLIR translation rule for primitive 'pbroadcast' not found for platform cpu")
    status, message = runner._apply_xfail(out, entry)
    assert status == "unsupported" and message.count("MLIR translation rule") == 1


def test_a_suite_filtered_run_does_not_call_other_suites_entries_stale(tmp_path):
    xf = tmp_path / "xf.txt"
    xf.write_text("pbroadcast[* unsupported: a collectives entry\nnever_drawn_case sometimes mismatch(value): matches nothing\n")
    res = runner.run(suite="errors", examples=1, progress=False, xfails=str(xf), shrink_seconds=0)
    assert res.ok and res.summary["unused_xfails"] == []


def test_unknown_platform_is_one_line_exit_2_in_a_fresh_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "XLA_BACKEND_PLATFORM")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "conformance", "run", "--platform", "nope", "--suite", "errors",
                        "--no-progress"], capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stdout + p.stderr
    assert lines[0].startswith("error: --platform nope: JAX could not start platform 'nope'")
