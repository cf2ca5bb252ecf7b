"""scripts/oracle_on_suites.py's tables and doc blocks, from hand-written run summaries (the
suites themselves, JAX's and flax's test files, are never run or kept here)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "oracle_on_suites.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("oracle_on_suites", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(name, checked, seen, missed=0, changed=()):
    return {"file": name, "tests": 10, "passed_plain": 9, "changed": list(changed), "checked": checked,
            "disagreed": 0, "not_checkable": {"host callback": seen - checked} if seen > checked else {},
            "seen": seen, "not_intercepted": {"ahead-of-time compiled call": missed} if missed else {},
            "seconds_plain": 2.0, "seconds_oracle": 3.0}


def _summary(jax_version, suites, note=""):
    return {"jax": jax_version, "python": "3.11.7", "flax": "0.12.8", "note": note, "suites": suites}


def test_table_shares_by_hand(script):
    text = script.table([_row("a_test.py", 18, 19, 1), _row("b_test.py", 0, 0)])
    # 18 checked of 19 seen + 1 not intercepted: 90.0%; a file with nothing seen: "-"
    assert "| a_test.py | 9 of 10 | 0 | 18 | 0 | 1: host callback x1 | 19 | 1 | 90.0% | 2 s / 3 s |" in text
    assert "| b_test.py | 9 of 10 | 0 | 0 | 0 | 0 | 0 | 0 | - | 2 s / 3 s |" in text
    assert "| **all** | 18 of 20 | 0 | 18 | 0 | 1 | 19 | 1 | 90.0% | 4 s / 6 s |" in text


def test_doc_blocks_of_one_version_keep_the_others(script, tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# page\n\n{script.BEGIN}\nold text without blocks\n{script.END}\n\nafter\n")
    old = _summary("0.10.2", {"jax": [_row("a_test.py", 1, 1)], "flax": [_row("nnx/spmd_test.py", 2, 2)]})
    script.write_doc(str(page), script.doc_blocks(old))
    new = _summary("0.12.0.1", {"jax": [_row("a_test.py", 3, 4)]}, note="main at cec06d1")
    script.write_doc(str(page), script.doc_blocks(new))
    again = _summary("0.10.2", {"jax": [_row("a_test.py", 5, 5)]})
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(again))
    assert script.main(["--summary", str(path), "--doc", str(page)]) == 0
    text = page.read_text()
    assert "old text" not in text and text.startswith("# page") and text.endswith("\n\nafter\n")
    keys = [line for line in text.splitlines() if line.startswith("<!-- oracle-on-suites:block")]
    assert keys == ["<!-- oracle-on-suites:block JAX tests, jax 0.10.2 -->",
                    "<!-- oracle-on-suites:block JAX tests, jax 0.12.0.1 -->",
                    "<!-- oracle-on-suites:block flax tests, jax 0.10.2 -->"]
    assert "| a_test.py | 9 of 10 | 0 | 5 |" in text            # 0.10.2's JAX block rewritten
    assert "| nnx/spmd_test.py |" in text                      # its flax block kept
    assert "8 virtual CPU devices (main at cec06d1):" in text


def test_suites_location_is_required(script, capsys):
    with pytest.raises(SystemExit):
        script.main([])
    assert "JAX_SRC" in capsys.readouterr().err
