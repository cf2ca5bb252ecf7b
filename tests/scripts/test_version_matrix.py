"""scripts/version_matrix.py: what it reads from pytest and from the default run, and its table."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "version_matrix.py"


@pytest.fixture(scope="module")
def vm():
    spec = importlib.util.spec_from_file_location("version_matrix", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # its dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("output, counts", [
    ("....F\n=== 3 passed, 1 failed, 2 skipped, 1 error in 4.50s ===\n",
     {"passed": 3, "failed": 1, "skipped": 2, "errors": 1}),
    ("1219 passed, 9 skipped, 52 warnings in 925.99s (0:15:25)\n", {"passed": 1219, "skipped": 9}),
    ("5 passed in 1.0s\nlater text\n2 passed, 1 xfailed in 2.0s\n", {"passed": 2, "xfailed": 1}),   # the last one
    ("collecting ... interrupted\n", {}),
])
def test_pytest_counts_reads_the_last_summary_line(vm, output, counts):
    assert vm.pytest_counts(output) == counts


def test_the_run_verdict_is_its_exit_status(vm):
    assert [vm.verdict(c) for c in (0, 1, 2, 3, 7, -9)] == ["AGREE", "DISAGREE", "BAD-ARGS", "INCOMPLETE",
                                                            "EXIT 7", "KILLED(9)"]


def test_table_has_a_row_per_environment_and_dashes_for_what_was_not_run(vm):
    rows = [vm.Row(".venv", "0.10.2", "0.10.2", "3.11.7", "AGREE", 363.4, {"passed": 5, "skipped": 1}, 40.0, 0),
            vm.Row(".venv-jax0.9", "0.9.2", "0.9.2", "3.11.7")]
    lines = vm.table(rows).splitlines()
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|") == 10
    assert lines[2] == "| 0.10.2 / 0.10.2 | 3.11.7 | AGREE | 363 | 5 | 0 | 0 | 1 | 40 |"
    assert lines[3] == "| 0.9.2 / 0.9.2 | 3.11.7 | — | — | — | — | — | — | — |"


def test_a_missing_environment_is_refused_with_the_fix(vm, capsys):
    with pytest.raises(SystemExit) as e:
        vm.main(["--venvs", ".venv-no-such-jax", "--no-run", "--no-tests"])
    assert e.value.code == 2 and "create it" in capsys.readouterr().err
