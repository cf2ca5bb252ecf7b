"""bench.data_sets: the warm per-data-set loop runs and its records add up (no timed assertions)."""
from __future__ import annotations

import json

import pytest

from bench import data_sets


def test_every_program_data_set_is_measured_once_per_pass(tmp_path, capsys):
    out = tmp_path / "figures.jsonl"
    assert data_sets.main(["--suite", "programs", "--examples", "1", "--data-per-program", "2",
                           "--passes", "2", "--families", "--json", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["bench"] for r in recs] == ["machine", "data_sets"]
    rec = recs[1]
    planned = data_sets.data_sets("programs", 1, 2)
    assert all(len(g) >= 2 for g in planned)   # --data-per-program 2: every structure has 2 or more
    # every data set after a structure's first is timed, unless its structure was left out
    assert rec["data_sets"] + rec["structures"] + rec["left_out"] == sum(len(g) for g in planned)
    assert rec["data_sets"] >= rec["structures"] >= len(rec["families"])
    assert sum(f["data_sets"] for f in rec["families"].values()) == rec["data_sets"]
    for side in data_sets.SIDES:
        assert len(rec["each"][side]) == 2 and rec["ms"][side] > 0
    assert "ms per data set" in capsys.readouterr().out


def test_rejects_no_passes():
    with pytest.raises(SystemExit):
        data_sets.main(["--passes", "0"])
