"""scripts/export_matrix.py: the matrix table, the notes and the doc block it rewrites."""
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("export_matrix", ROOT / "scripts" / "export_matrix.py")
em = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(em)


def _cell(programs, agree, disagree=0, error=0, outside=0, why=(), ran=None, findings=()):
    return {"counts": {"programs": programs, "agree": agree, "disagree": disagree, "error": error,
                       "outside-window": outside, "rejected": 0},
            "findings": list(findings), "outside": list(why),
            "ran_outside": ran or {"agree": 0, "disagree": 0, "error": 0}}


RESULT = {"versions": ["0.10.2", "0.12.0.1"], "venvs": {"0.10.2": ".venv", "0.12.0.1": ".venv312"},
          "programs": 3, "seed": 0,
          "exports": {"0.10.2": {"ok": True, "own_failures": [["p003", "error", "call raised E: no"]]},
                      "0.12.0.1": {"ok": True}},
          "cells": {"0.10.2 -> 0.10.2": _cell(3, 3), "0.10.2 -> 0.12.0.1": _cell(3, 2, disagree=1, findings=[
                        {"stage": "cross-version:mismatch", "op": "sin", "error": "value", "count": 1}]),
                    "0.12.0.1 -> 0.10.2": _cell(3, 0, outside=3, why=["StableHLO artifact v1.18.0 is newer"],
                                                ran={"agree": 2, "disagree": 0, "error": 1}),
                    "0.12.0.1 -> 0.12.0.1": _cell(3, 3)}}


def test_the_table_has_exporters_as_rows_and_runners_as_columns():
    lines = em.table(RESULT).splitlines()
    assert lines[2] == "| exported by ↓ · run by → | jax 0.10.2 | jax 0.12.0.1 |"
    assert lines[0].endswith("Cross-version findings (inside the window, the exporter's own round trip agreeing): 1.")
    assert lines[4] == "| jax 0.10.2 | 3 / 3 / 0 / 0 / 0 | 3 / 2 / 1 / 0 / 0 |"
    assert lines[5] == "| jax 0.12.0.1 | 3 / 0 / 0 / 0 / 3 | 3 / 3 / 0 / 0 / 0 |"


def test_a_cell_says_how_many_failures_are_the_exporters_own():
    cell = _cell(20, 19, error=1)
    cell["counts"]["exporters-own"] = 1
    assert em._cell(cell) == "20 / 19 / 0 / 1 / 0 (1 own)"


def test_the_notes_say_why_outside_and_list_findings():
    text = em.notes(RESULT)
    assert "0.12.0.1 -> 0.10.2: outside the window: StableHLO artifact v1.18.0 is newer. Run anyway: 2 agreed, " \
           "0 disagreed, 1 raised." in text
    assert "0.10.2 -> 0.12.0.1: finding [cross-version:mismatch] sin: value (1 program(s))" in text
    assert "* jax 0.10.2's own round trip of its p003: error: call raised E: no" in text


def test_the_doc_block_is_rewritten_in_place_only(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(f"# title\nbefore\n{em.BEGIN}\nold\n{em.END}\nafter\n")
    em.write_doc(str(page), f"{em.BEGIN}\nnew\n{em.END}")
    assert page.read_text() == f"# title\nbefore\n{em.BEGIN}\nnew\n{em.END}\nafter\n"
    (tmp_path / "q.md").write_text("no block")
    with pytest.raises(SystemExit, match="no <!-- export-matrix:begin -->"):
        em.write_doc(str(tmp_path / "q.md"), "x")
