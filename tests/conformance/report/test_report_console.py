"""The live progress bar and the final table."""
import io

import pytest
import rich.console

from conformance.report.console import ProgressReporter, print_table, summary_line
from conformance.report.results import CaseResult, summarize


def _console(width=80):
    buf = io.StringIO()
    return rich.console.Console(file=buf, width=width, color_system=None, force_terminal=False), buf


def _results():
    return [
        CaseResult("psum[a]", "collectives", "psum", "float32", "pass", examples=6, seconds=1.0),
        CaseResult("psum[b]", "collectives", "psum", "float32", "fail", examples=2, message="device 3 differs",
                   repro_path="/tmp/repro_psum.py"),
        CaseResult("psum[c]", "collectives", "psum", "int32", "pass", examples=5),
        CaseResult("pbroadcast[a]", "collectives", "pbroadcast", "float32", "unsupported",
                   message="no pbroadcast lowering"),
        CaseResult("named[a]", "layouts", "named", "float32", "xpass", message="in xfails/cpu.txt"),
        CaseResult("scan[a]", "programs", "scan_psum", "int32", "xfail", examples=3),
    ]


def _row(text, *starts):
    return next(line for line in text.splitlines() if line.split()[:len(starts)] == list(starts)).split()


def test_table_rows_totals_speed_and_warnings():
    rs = _results()
    summary = summarize(rs, wall_seconds=4.0, compile_seconds=1.0)
    console, buf = _console()
    print_table(summary, console, results=rs)
    out = buf.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 80
    # family dtype pass fail error xfail xpass unsupported examples ("·" for zero)
    assert _row(out, "psum", "float32") == ["psum", "float32", "1", "1", "·", "·", "·", "·", "8"]
    assert _row(out, "psum", "int32") == ["psum", "int32", "1", "·", "·", "·", "·", "·", "5"]
    assert _row(out, "pbroadcast") == ["pbroadcast", "float32", "·", "·", "·", "·", "·", "1", "1"]
    assert _row(out, "total") == ["total", "2", "1", "0", "1", "1", "1", "18"]
    for suite in ("collectives", "layouts", "programs"):
        assert _row(out, suite) == [suite]
    assert "6 cases, 18 examples in 4.0 s: 4.5 examples/s, 25% of the time compiling" in out
    assert "1 case(s) unsupported on this platform (not counted as passes)" in out
    assert "warning: stale xfail entry named[a]" in out
    assert "DISAGREE: 1 failure(s), 0 error(s)" in out


def test_stale_entries_without_results_are_counted():
    rs = [CaseResult("named[a]", "layouts", "named", "float32", "xpass")]
    console, buf = _console()
    print_table(summarize(rs, wall_seconds=1.0, compile_seconds=0.0), console)
    out = buf.getvalue()
    assert "warning: 1 stale xfail entry (status xpass)" in out
    assert "AGREE" in out and "DISAGREE" not in out


def test_summary_line():
    s = {"cases": 3, "examples": 30, "wall_seconds": 12.0, "examples_per_second": 2.5, "compile_share": 0.4}
    assert summary_line(s) == "3 cases, 30 examples in 12.0 s: 2.5 examples/s, 40% of the time compiling"


def test_progress_counts_and_failure_lines():
    console, buf = _console(width=120)
    rep = ProgressReporter(6, console=console)
    rep.start({"platform": "cpu", "devices": 8})
    for r in _results():
        rep.case_finished(r)
    rep.finish({})
    out = buf.getvalue()
    assert rep.counts == {"pass": 2, "fail": 1, "error": 0, "timeout": 0, "xfail": 1, "xpass": 1, "unsupported": 1}
    assert rep.examples == 18  # 6+2+5+3 and 1 each by default
    assert "conformance run: platform cpu, devices 8" in out
    assert "FAIL psum[b]: device 3 differs (reproducer: /tmp/repro_psum.py)" in out
    assert "STALE XFAIL named[a]: in xfails/cpu.txt" in out
    assert "6/6" in out and "2 pass 1 fail" in out and "ex/s" in out


def test_progress_rejects_bad_total_and_early_cases():
    with pytest.raises(ValueError, match=r"total=-1; pass the number of planned cases"):
        ProgressReporter(-1)
    with pytest.raises(RuntimeError, match=r"before start\(plan\)"):
        ProgressReporter(1, console=_console()[0]).case_finished(_results()[0])
