"""Smoke test of bench/model_step.py: the quick run produces its records (no timed assertions)."""
from __future__ import annotations

import pytest

from bench import model_step


def test_sizes_match_the_issue():
    d, layers, heads, seq, batch, vocab = model_step.SIZES["small"]
    assert (d, layers, seq, batch) == (256, 4, 128, 8)
    d, layers, heads, seq, batch, vocab = model_step.SIZES["medium"]
    assert (d, layers, seq) == (512, 6, 256)


@pytest.mark.slow
def test_quick_run_records(capsys):
    recs = model_step.main(["--quick"])
    (rec,) = [r for r in recs if r["bench"] == "model_step"]
    assert rec["size"] == "tiny" and 0.1e6 < rec["params"] < 0.15e6
    for mode in ("plain", "check"):
        for key in ("first_cpu", "first_wall", "cpu", "wall"):
            assert rec[mode][key]["median"] > 0
    assert rec["ratio_cpu"] > 0 and "refsim" in rec["check_phases"]
    assert "jitted step vs conformance.check" in capsys.readouterr().out
