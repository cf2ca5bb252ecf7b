"""The share of each phase of a conformance run, and JAX's persistent compilation cache for reruns."""
import os
import subprocess
import sys

from conformance.engine import runner
from conformance.report import timing
from conformance.report.results import CaseResult

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the repository


def test_a_program_case_reports_its_phases():
    task = next(t for t in runner.plan_tasks("collectives", examples=1, seed=3) if t.family == "psum")
    res = runner.run_task(task, shrink_seconds=0)
    assert res.status == "pass", res.message
    ph = res.phases
    assert {"refsim", "xla_compile", "xla_run", "xla_trace_lower", "compare"} <= set(ph)
    assert all(v >= 0 for v in ph.values())
    assert ph["refsim"] > 0 and ph["compare"] > 0
    assert sum(ph.values()) <= res.seconds + 1e-3  # phases are parts of the case's time


def test_totals_and_line_add_up_cases_and_drawing():
    rs = [CaseResult("a", "s", "f", "d", "pass", phases={"refsim": 1.0, "xla_compile": 3.0}),
          CaseResult("b", "s", "f", "d", "pass", phases={"refsim": 1.0, "checks": 1.0, "unknown": 9.0})]
    tot = timing.totals(rs, drawing_seconds=2.0)
    assert tot["drawing"] == 2.0 and tot["refsim"] == 2.0 and tot["xla_compile"] == 3.0 and tot["checks"] == 1.0
    assert list(tot) == list(timing.PHASES)
    text = timing.line(tot, wall_seconds=5.0)
    # 8 s of work: drawing 25%, refsim 25%, XLA compile 38% (3/8 rounds to 38), other checks 12%
    assert text == ("time by phase (8.0 s of work in 5.0 s wall): drawing 25% · refsim 25% · XLA compile 38% · "
                    "other checks 12%")


_RUN_WITH_CACHE = """
import sys, jax
from xla_backend import platform
platform.configure("cpu", 4)
from conformance.engine import runner
events = []
jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
res = runner.run(suite="collectives", examples=1, devices=4, progress=False, shrink_seconds=0,
                 compile_cache=sys.argv[1])
print("hits", events.count("/jax/compilation_cache/cache_hits"), "ok", res.ok,
      "verified", res.summary["compile_cache_events"]["verified"])
"""


def test_rerun_reads_the_persistent_compilation_cache(tmp_path):
    cache = tmp_path / "cc"
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, "-c", _RUN_WITH_CACHE, str(cache)]
    first = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    (folder,) = [p for p in os.listdir(cache) if p.startswith("xla-")]   # the code identity's folder
    entries = [e for e in os.listdir(cache / folder) if e.endswith("-cache")]
    assert entries, "the first run kept no compiled executable"
    again = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    hits0, hits1 = int(first.stdout.split()[1]), int(again.stdout.split()[1])
    assert again.stdout.split()[3] == "True"
    # the rerun lowers every case to the same modules and reads every executable back; the first hit
    # of each family was compiled again and compared
    assert hits1 >= len(entries) > hits0, (hits0, hits1, len(entries))
    assert int(again.stdout.split()[5]) >= 1


def test_cli_prints_the_phase_shares(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    p = subprocess.run([sys.executable, "-m", "conformance", "run", "--suite", "errors", "--examples", "1",
                        "--no-progress", "--devices", "4", "--processes", "1", "--compile-cache", "off"],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "time by phase" in p.stdout and "drawing" in p.stdout
