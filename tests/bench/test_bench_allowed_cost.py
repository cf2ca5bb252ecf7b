"""bench.allowed_cost: one pass on one example in a child process, the records, the docs block and
the command line's errors. No timed assertions."""
from __future__ import annotations

import pytest

from bench import _common as C
from bench import allowed_cost


def test_one_pass_on_the_moe_step_gives_records_and_a_docs_block(capsys):
    recs = allowed_cost.run(1, ("moe",))
    by = {r["program"]: r for r in recs}
    assert set(by) == {"moe", "all"} and all(r["side"] == "this" for r in recs)
    moe = by["moe"]
    assert moe["refsim"]["median"] > 0 and moe["walk"]["median"] > 0 and moe["ratio"] > 1
    assert len(moe["digest"]) == 16 and len(moe["jaxpr_digest"]) == 16
    assert by["all"]["programs"] == ["moe"]
    block = allowed_cost.markdown(recs, C.machine(), "python -m bench.allowed_cost --programs moe")
    assert "| moe |" in block and "(refsim + walk) / refsim" in block
    allowed_cost.show(recs)
    assert "refsim + the allowed set's walk" in capsys.readouterr().out


def test_against_needs_a_checkout_with_the_bound_walk(tmp_path):
    with pytest.raises(SystemExit, match="not a checkout with refsim/bounds"):
        allowed_cost.main(["--against", str(tmp_path), "--passes", "1"])


def test_the_against_table_names_programs_drawn_differently():
    def rec(side, program, digest, jaxpr):
        st = {"median": 1.0, "min": 1.0, "max": 1.0, "spread": 0.0, "passes": 1}
        return {"side": side, "program": program, "digest": digest, "jaxpr_digest": jaxpr, "refsim": st,
                "with_walk": st, "walk": st, "ratio": 2.0, "ratio_range": [2.0, 2.0], "passes": 1}

    recs = [rec("this", "a", "d1", "j1"), rec("this", "b", "d2", "j2"), rec("this", "c", "d3", "j3"),
            rec("against", "a", "d1", "j1"), rec("against", "b", "dX", "j2"), rec("against", "c", "d3", "jY")]
    same = {row[0]: row[-1] for row in allowed_cost._against_rows(recs)}
    assert same == {"a": "yes", "b": "NO", "c": "other program drawn"}
