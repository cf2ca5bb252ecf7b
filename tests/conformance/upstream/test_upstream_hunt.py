"""A short, repeatable hunt writes upstream-ready findings, and every plain-JAX script it wrote fails
as its UPSTREAM.md says, run alone: a fresh Python, an empty working folder, no JAX or XLA settings
inherited, and the project's packages unimportable.

The hunt is deterministic: ``--seed 22 --programs 7 --ops slice`` draws the same seven programs every
time, and the seventh returns a wrong element on jax 0.10.2 and 0.12.0.1 (docs/found-bugs.md 1, a
strided slice of a sharded dimension); the empty xfails file lets the known bug through.
"""
import ast
import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HUNT = ["--programs", "7", "--seed", "22", "--ops", "slice", "--shrink-seconds", "0", "--processes", "1",
        "--progress-every", "2"]
ALLOWED = {"os", "sys", "importlib", "numpy", "jax"}

# A runner independent of conformance.upstream.runs: the script as __main__, this project unimportable.
_ALONE = r"""
import runpy, sys
class NoProject:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("refsim", "xla_backend", "conformance", "hypothesis", "bench"):
            raise ImportError("a plain-JAX reproducer imported " + name)
sys.meta_path.insert(0, NoProject())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _alone(script: Path, partitioner: str, cwd: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "PYTHON", "CONFORMANCE_"))}
    return subprocess.run([sys.executable, "-I", "-c", _ALONE, str(script), partitioner], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_every_upstream_script_of_a_hunt_fails_alone_as_its_issue_says(tmp_path):
    rep, empty, alone = tmp_path / "hunt", tmp_path / "no-xfails.txt", tmp_path / "alone"
    empty.write_text("")
    alone.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), CONFORMANCE_COMPILE_CACHE="off")
    p = subprocess.run([sys.executable, "-m", "conformance", "hunt", *HUNT, "--xfails", str(empty), "--report",
                        str(rep)], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert p.returncode == 1, p.stdout + p.stderr[-3000:]
    assert re.search(r"^hunt \d+:\d\d \| 7 programs \(", p.stderr, re.M), p.stderr[-2000:]   # the progress line
    summary = json.loads((rep / "hunt.json").read_text())
    assert summary["seed"] == 22 and summary["programs"] == 7 and summary["findings"]
    assert summary["known"] >= 1 and summary["causes"] and (rep / "findings" / "CAUSES.md").exists()

    scripts = sorted(rep.glob("findings/*/upstream.py"))
    assert len(scripts) == len(summary["findings"])
    for script in scripts:
        record = json.loads((script.parent / "finding.json").read_text())
        issue = (script.parent / "UPSTREAM.md").read_text()
        text = script.read_text()
        tops = {(a.name if isinstance(n, ast.Import) else n.module).split(".")[0]
                for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in (n.names if isinstance(n, ast.Import) else [n.names[0]])}
        assert tops <= ALLOWED, tops
        assert text.index("xla_force_host_platform_device_count") < text.index("import jax")
        assert text.strip() in issue and "## Versions" in issue and f"jax {version('jax')}" in issue
        assert "| Shardy" in issue and "| GSPMD" in issue and "## Expected" in issue
        outcomes = record["upstream"]["outcomes"]
        assert record["upstream"]["failing"], f"{script} does not reproduce its finding"
        for partitioner, said in outcomes.items():
            r = _alone(script, partitioner, alone)
            assert r.stdout.startswith(version("jax")), r.stdout + r.stderr[-2000:]
            if said["kind"] == "passes":
                assert r.returncode == 0, r.stderr[-2000:]
            elif said["kind"] == "wrong-values":
                assert r.returncode == 1 and "AssertionError: wrong values under " + partitioner in r.stderr
            elif said["kind"] == "aborts":
                assert r.returncode < 0 and said["fatal_line"].split("] ", 1)[-1] in r.stderr
            else:
                assert r.returncode != 0 and said["cls"] in r.stderr
    slice_finding = next(f for f in summary["findings"] if f["known"] == 1)
    issue = Path(slice_finding["upstream"]["issue"]).read_text()
    assert "known: found-bugs 1" in issue.splitlines()[0] and "# Slice: wrong values when sharded over" in issue
    assert "one-device" in slice_finding["upstream"]["expected"] and "agrees with refsim" in \
        slice_finding["upstream"]["expected"]
