"""conformance.suites.mpmd_checks hands a worker process's outcomes back as data (JSON and .npz):
they round-trip exactly, and nothing read back is unpickled."""
from __future__ import annotations

import os

import numpy as np
import pytest

from conformance.suites import mpmd_checks


def _same(a, b) -> bool:
    """Same shape, dtype, sharding and, device by device, the same index, replica and bits."""
    if (a.shape, a.dtype, a.sharding) != (b.shape, b.dtype, b.sharding) or len(a.shards) != len(b.shards):
        return False
    return all((x.device_id, x.index, x.replica_id) == (y.device_id, y.index, y.replica_id)
               and x.data.dtype == y.data.dtype and x.data.tobytes() == y.data.tobytes()
               for x, y in zip(a.shards, b.shards))


def test_outcomes_round_trip_through_json_and_npz(tmp_path):
    cases = mpmd_checks.draw_cases(4, 3)
    ids, outcomes = mpmd_checks.in_process_runner(cases)
    outcomes["mpmd-failed"] = "RuntimeError: planted"
    stem = str(tmp_path / "process_0")
    mpmd_checks.outcome_files(stem, ids, outcomes)
    assert sorted(os.listdir(tmp_path)) == ["process_0.json", "process_0.npz"]
    back = mpmd_checks.read_outcome_files(stem)
    assert back["device_ids"] == [int(i) for i in ids] and back["outcomes"]["mpmd-failed"] == "RuntimeError: planted"
    for case in cases:
        want, got = outcomes[case.case_id], back["outcomes"][case.case_id]
        assert isinstance(want, dict), want
        assert got["consumed"] == want["consumed"] and got["mpmd_idxs"] == [tuple(i) for i in want["mpmd_idxs"]]
        assert all(_same(a, b) for a, b in zip(want["final"], got["final"]))
        for gw, gg in zip(want["groups"], got["groups"]):
            assert sorted(gw) == sorted(gg) and all(_same(gw[k], gg[k]) for k in gw)
        assert mpmd_checks.compare_case(case, ids, mpmd_checks.run_refsim(case, ids), got) == ""


class _Payload:
    """Unpickling it would create a file: what a planted pickle does."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_planted_pickle_in_the_arrays_file_is_refused_not_run(tmp_path):
    stem = str(tmp_path / "process_0")
    mpmd_checks.outcome_files(stem, [0, 1], {})
    ran = tmp_path / "payload-ran"
    arr = np.empty(1, dtype=object)
    arr[0] = _Payload(str(ran))
    np.savez(stem + ".npz", k0=arr)   # NumPy pickles an object array
    with pytest.raises(ValueError, match="allow_pickle=False"):
        mpmd_checks.read_outcome_files(stem)
    assert not ran.exists()
