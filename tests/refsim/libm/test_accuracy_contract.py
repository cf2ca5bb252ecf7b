"""refsim's stated accuracy for transcendentals (refsim/interpreter/accuracy.py, docs/primitives.md)
holds on fresh samples: refsim's float32 results are within the stated ulps of the correctly
rounded result (the long double or float64 result rounded once) and of XLA:CPU, and its
float64 results within the stated fraction of an ulp of the long double result."""
from __future__ import annotations

import types

import numpy as np
import pytest

from bench.accuracy import _samples, long_double_is_wide, reference_f64, ulp_error, measure
from refsim.interpreter.accuracy import ACCURACY, mixed_bound, ulp_bound
from refsim.interpreter.registry import RULES, load_rules


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


@pytest.mark.skipif(not long_double_is_wide(), reason="np.longdouble is no wider than float64 here: "
                    "no reference for float64 results")
@pytest.mark.parametrize("op", sorted(op for op, a in ACCURACY.items() if a.refsim_vs_correct_f64 is not None))
def test_float64_within_its_stated_fraction_of_an_ulp(op):
    load_rules()
    rng = np.random.default_rng(1)
    args = [_samples(lo, hi, 4000, np.float64, rng) for lo, hi in ACCURACY[op].domains]
    n = min(len(a) for a in args)
    args = [a[:n] for a in args]
    with np.errstate(all="ignore"):
        ours = np.asarray(RULES[op](types.SimpleNamespace(nm=0), *args))  # the rule, float64 as given
    assert ours.dtype == np.float64
    err = ulp_error(ours, reference_f64(op, args))
    assert err <= ACCURACY[op].refsim_vs_correct_f64, (op, err)


def test_bounds_are_what_comparisons_use():
    assert ulp_bound("sqrt") == 0 and ulp_bound("add") == 0  # exact ops stay exact
    assert ulp_bound("exp2") == 63 and ulp_bound("tanh", np.float64) == 7
