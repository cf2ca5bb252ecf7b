"""refsim's stated accuracy for transcendentals (refsim/interpreter/accuracy.py, docs/primitives.md)
holds on fresh samples: refsim's float32 results are within the stated ulps of the correctly
rounded result (the float64 result rounded once) and of XLA:CPU."""
from __future__ import annotations

import numpy as np
import pytest

from bench.accuracy import measure
from refsim.interpreter.accuracy import ACCURACY, mixed_bound, ulp_bound


@pytest.fixture(scope="module")
def rows():
    return {r["op"]: r for r in measure(samples=4000, seed=1, dtypes=(np.float32,))}


def test_every_op_is_measured(rows):
    assert set(rows) == set(ACCURACY)


@pytest.mark.parametrize("op", sorted(ACCURACY))
def test_refsim_within_its_stated_distance_from_correct_rounding(rows, op):
    assert rows[op]["refsim_vs_correct_ulp"] <= ACCURACY[op].refsim_vs_correct, rows[op]


@pytest.mark.parametrize("op", sorted(ACCURACY))
def test_refsim_within_the_comparison_bound_of_xla(rows, op):
    r = rows[op]
    if mixed_bound(op) is not None:
        assert r["refsim_vs_xla_mixed"] <= mixed_bound(op), r
    else:
        assert r["refsim_vs_xla_ulp"] <= ulp_bound(op), r


def test_bounds_are_what_comparisons_use():
    assert ulp_bound("sqrt") == 0 and ulp_bound("add") == 0  # exact ops stay exact
    assert ulp_bound("exp2") == 63 and ulp_bound("tanh", np.float64) == 7
