"""A corpus program's stated tolerance as a per-element policy (conformance.verdict.stated) and
the allowed set that holds each element to the tighter of the two (issue 39, point 4)."""
import numpy as np
import pytest

import refsim
from conformance.verdict import allowed, compare
from conformance.verdict.stated import StatedBound


def _one(values, dtype=np.float32):
    sh = refsim.NamedSharding(refsim.Mesh((1,), ("x",)), refsim.P())
    return refsim.device_put(np.asarray(values, dtype), sh)


def test_a_stated_tol_is_numpy_isclose_per_element():
    ref = _one([1.0, -2.0, np.nan])
    pol = StatedBound.of(ref, tol=1e-3)
    # tol + tol * |refsim|: 2e-3 at 1, 3e-3 at -2; NaN must stay NaN
    assert np.allclose(pol.abs_sum[0][:2], [2e-3, 3e-3])
    assert compare.compare(ref, _one([1.0019, -2.0029, np.nan]), tolerances=pol).ok
    assert not compare.compare(ref, _one([1.0, -2.0032, np.nan]), tolerances=pol).ok
    assert not compare.compare(ref, _one([1.0, -2.0, 0.0]), tolerances=pol).ok


def test_stated_ulps_are_the_spacing_of_refsims_value():
    ref = _one([1.0, 1024.0])
    pol = StatedBound.of(ref, ulps=2)
    assert pol.abs_sum[0].tolist() == [2 * 2.0 ** -23, 2 * 2.0 ** -13]      # float32 spacing at 1 and at 1024
    ok = np.float32([1.0 + 2 * 2.0 ** -23, 1024.0 - 2 * 2.0 ** -13])
    assert compare.compare(ref, _one(ok), tolerances=pol).ok
    assert not compare.compare(ref, _one([1.0 + 3 * 2.0 ** -23, 1024.0]), tolerances=pol).ok


def test_state_exactly_one_rule():
    with pytest.raises(ValueError, match="exactly one"):
        StatedBound.of(_one([1.0]), tol=1e-3, ulps=2)
    with pytest.raises(ValueError, match="exactly one"):
        StatedBound.of(_one([1.0]))


def test_an_allowed_set_with_a_per_element_fallback_takes_the_tighter_rule_per_element():
    center, bound = np.array([1.0, 100.0, 5.0]), np.array([1e-6, 1.0, np.nan])
    refv = np.float32([1.0, 100.0, 7.0])
    pol = allowed.AllowedSet(n=1, exact={0: center}, abs_sum={0: bound}, fallback_ref={0: refv},
                             fallback_allowed={0: np.array([1e-3, 1e-2, 1e-1])}, judge_undecidable=True)
    assert pol.governed(0).tolist() == [True, False, False]
    ref, b = pol.reference_and_bound(0, np.float32)
    assert ref.tolist() == [1.0, 100.0, 7.0]
    assert b[1:].tolist() == [1e-2, 1e-1] and b[0] == pytest.approx(1e-6)
    assert pol.allowed(np.float32) == pytest.approx(1e-1)
    r = _one(refv)
    assert compare.compare(r, _one([1.0, 100.009, 7.09]), tolerances=pol).ok
    assert not compare.compare(r, _one([1.00001, 100.0, 7.0]), tolerances=pol).ok     # beyond the allowed set
    assert not compare.compare(r, _one([1.0, 100.0, 7.2]), tolerances=pol).ok        # undecidable: fallback judges
