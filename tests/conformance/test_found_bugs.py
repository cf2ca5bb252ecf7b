"""docs/found-bugs.md: every reproducer is plain JAX + NumPy of at most 15 lines, and runs.

Each block runs in a fresh Python (it sets its own device count before JAX starts) and must end
in one of the ways the page allows: it reproduces the bug (an AssertionError on the wrong values,
the documented exception, or XLA aborting the process) or, on a JAX where the bug is fixed,
prints its result and exits 0. Anything else (a NameError, an import of this project) fails.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "found-bugs.md"
BLOCKS = re.findall(r"<!-- reproducer: (\w+) -->\n```text\n(.*?)\n```", PAGE.read_text(), re.S)
ALLOWED = ("AssertionError", "ValueError", "JaxRuntimeError", "ShardingTypeError", "Check failed")


def test_page_has_reproducers():
    assert len(BLOCKS) >= 3, [n for n, _ in BLOCKS]


@pytest.mark.parametrize("name, code", BLOCKS, ids=[n for n, _ in BLOCKS])
def test_reproducer_is_short_plain_and_runs(name, code, tmp_path):
    lines = code.splitlines()
    assert len(lines) <= 15, f"{name}: {len(lines)} lines"
    assert not re.search(r"^\s*(import|from)\s+(refsim|conformance|xla_backend)", code, re.M), name
    assert "np." in code and "want" in code, f"{name}: the correct answer must be computed with NumPy"
    path = tmp_path / f"{name}.py"
    path.write_text(code + "\n")
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    if r.returncode == 0:
        assert re.search(r"^\d+\.\d+", r.stdout, re.M), f"{name} exited 0 without printing its result:\n{out}"
    else:
        assert any(a in out for a in ALLOWED), f"{name} failed in an undocumented way:\n{out[-3000:]}"
