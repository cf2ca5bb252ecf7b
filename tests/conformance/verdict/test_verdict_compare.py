"""conformance.verdict.compare: hand-computed cases of the comparison policy (docs/comparison.md)."""

import ml_dtypes
import numpy as np
import pytest

from conformance.cases import Program
from conformance.verdict.compare import EXACT, Exact, SumBound, compare, gamma, unit_roundoff
from refsim.layouts.mesh import Mesh
from refsim.layouts.partition_spec import PartitionSpec as P
from fake_arrays import Arr, Sh

U32 = 2.0 ** -24


def one(values, dtype=np.float32, device=0, index=None):
    a = np.asarray(values, dtype=dtype)
    return Arr(a.shape, a.dtype, [Sh(device, index or tuple(slice(None) for _ in a.shape), a)])


def two_devices(v0, v1, dtype=np.int32, ids=(0, 1)):
    a0, a1 = np.asarray(v0, dtype), np.asarray(v1, dtype)
    n = a0.shape[0]
    return Arr((2 * n,), a0.dtype, [Sh(ids[0], (slice(0, n),), a0), Sh(ids[1], (slice(n, 2 * n),), a1)])


def test_unit_roundoff_and_gamma_by_hand():
    assert unit_roundoff(np.float32) == 2.0 ** -24
    assert unit_roundoff(np.float16) == 2.0 ** -11
    assert unit_roundoff(ml_dtypes.bfloat16) == 2.0 ** -8
    assert unit_roundoff(np.complex64) == 2.0 ** -24
    assert gamma(3, 0.5 ** 4) == pytest.approx(3 / 16 / (1 - 3 / 16))
    with pytest.raises(ValueError, match="k\\*u must be < 1"):
        gamma(300, 2.0 ** -8)


def _psum_bound(terms):
    """Device 0 sums `terms` (n of them) in float32."""
    return SumBound.from_terms({0: np.asarray(terms, np.float32).reshape(len(terms), 1)})


def test_sum_bound_from_terms_by_hand():
    # 2**-30 and 2 are 31 binades apart: float32's 24 bits cannot hold 1 + 2**-30, so the sum rounds
    b = _psum_bound([1.0, 2.0 ** -30, -2.0])
    ex, bound = b.reference_and_bound(0, np.float32)
    assert ex[0] == -1 + 2.0 ** -30
    # ((1+u)^2 - 1) * (1 + 2**-30 + 2) with u = 2**-24, plus float64's own gamma(2) and the underflow term
    expected = ((2 * U32 + U32 ** 2) + 2 * 2.0 ** -53 / (1 - 2 * 2.0 ** -53)) * (3 + 2.0 ** -30)
    assert bound[0] == pytest.approx(expected, rel=1e-9)
    # terms that are multiples of 2**-1 summing to less than 2**23: no order rounds, bound 0
    ex, bound = _psum_bound([1.0, -2.0, 0.5]).reference_and_bound(0, np.float32)
    assert (ex[0], bound[0]) == (-0.5, 0.0)


def test_one_rounding_inside_the_bound_passes_and_one_ulp_more_fails():
    # exact sum 1 + 3u; summing left to right in float32 gives 1.0 (each 1 + u ties to even),
    # an error of 3u, inside gamma(3) * (1 + 3u) ~= 3u (1 + 6u). 1 - u (one ulp below 1) is 4u off.
    tol = _psum_bound([1.0, U32, U32, U32])
    refsim = one([1.0 + 2 * U32 * 2])   # 1 + 2**-22: the correctly rounded exact sum
    assert compare(refsim, one([1.0]), tolerances=tol).ok
    r = compare(refsim, one([np.nextafter(np.float32(1), np.float32(0))]), tolerances=tol)
    assert not r.ok
    (m,) = r.mismatches
    assert m.kind == "bound" and m.side == "xla" and m.device_id == 0
    assert "outside sum of n=4" in m.message


def test_sum_bound_also_checks_refsim_side():
    tol = _psum_bound([1.0, 1.0])
    r = compare(one([2.5]), one([2.0]), tolerances=tol)
    assert [m.side for m in r.mismatches] == ["refsim"]


def test_mean_bound_by_hand():
    # pmean over 3 devices of 1, 1, 2: exact 4/3; float32(4/3) is one rounding away, passes;
    # a result one ulp further off fails (bound ~ (2u*4 + u*4) / 3 = 4u, ulp(4/3) = 2**-23 = 2u).
    tol = SumBound.from_terms({0: np.array([[1.0], [1.0], [2.0]], np.float32)}, mean=True)
    good = np.float32(4) / np.float32(3)
    assert compare(one([good]), one([good]), tolerances=tol).ok
    bad = np.nextafter(np.nextafter(np.nextafter(good, np.float32(2)), np.float32(2)), np.float32(2))
    assert not compare(one([good]), one([bad]), tolerances=tol).ok


def test_integer_mean_bound_only_allows_the_final_division():
    tol = SumBound.from_terms({0: np.array([[1], [1], [2]], np.int32)}, mean=True)
    good = np.float32(4) / np.float32(3)
    assert compare(one([good]), one([good]), tolerances=tol).ok
    assert not compare(one([good]), one([np.nextafter(good, np.float32(2))]), tolerances=tol).ok


def test_integer_mean_over_one_device_allows_the_conversion_rounding():
    # pmean over a size-1 axis of int32 2**24 + 1: float32 cannot hold it; 2**24 is one rounding off.
    tol = SumBound.from_terms({0: np.array([[2 ** 24 + 1]], np.int32)}, mean=True)
    assert compare(one([2.0 ** 24]), one([2.0 ** 24]), tolerances=tol).ok
    r = compare(one([2.0 ** 24]), one([2.0 ** 24 + 4]), tolerances=tol)
    assert not r.ok and "exact 16777217.0, xla 16777220.0" in r.report()


def test_nan_equals_nan_and_not_a_number():
    assert compare(one([np.nan, 1.0]), one([np.nan, 1.0])).ok
    r = compare(one([np.nan, 1.0]), one([1.0, 1.0]))
    assert not r.ok and r.mismatches[0].elements[0][0] == (0,)


def test_nan_in_a_sum_must_stay_nan():
    tol = _psum_bound([np.nan, 1.0])
    assert compare(one([np.nan]), one([np.nan]), tolerances=tol).ok
    assert not compare(one([np.nan]), one([1.0]), tolerances=tol).ok


def test_complex_sum_with_a_nan_part_keeps_the_other_part():
    # psum of complex values adds real and imaginary parts separately: one term nan-1.5j sums to
    # nan-1.5j (and with +1j to nan-0.5j), and another imaginary part is wrong; NumPy's complex
    # division by n would make the reference nan+nanj and reject the right answer
    for terms, want in (([complex(np.nan, -1.5)], complex(np.nan, -1.5)),
                        ([complex(np.nan, -1.5), 1j], complex(np.nan, -0.5))):
        tol = SumBound.from_terms({0: np.asarray(terms, np.complex64).reshape(len(terms), 1)})
        for mean in (False, True):
            t = tol if not mean else SumBound.from_terms({0: np.asarray(terms, np.complex64).reshape(len(terms), 1)}, mean=True)
            w = want if not mean else complex(np.nan, want.imag / len(terms))
            assert compare(one([w], np.complex64), one([w], np.complex64), tolerances=t).ok
            assert not compare(one([w], np.complex64), one([complex(np.nan, 2.0)], np.complex64), tolerances=t).ok


def test_complex_sum_that_rounds_with_a_nan_real_part_keeps_a_finite_bound_on_the_imaginary_part():
    # imaginary parts 0.1, 0.2, 0.3 (float32) round when added, so the gamma bound applies; the NaN real
    # part must not make that bound NaN (which rejected the right answer: jax 0.10.2's psum suite)
    im = np.float32([0.1, 0.2, 0.3])
    terms = np.array([complex(np.nan, im[0]), complex(1, im[1]), complex(2, im[2])], np.complex64).reshape(3, 1)
    tol = SumBound.from_terms({0: terms})
    left_to_right = np.float32(np.float32(im[0] + im[1]) + im[2])
    got = complex(np.nan, float(left_to_right))
    assert compare(one([got], np.complex64), one([got], np.complex64), tolerances=tol).ok
    assert not compare(one([got], np.complex64), one([complex(np.nan, 0.7)], np.complex64), tolerances=tol).ok


def test_signed_zero_rules():
    assert not compare(one([0.0]), one([-0.0])).ok                       # data movement: sign is data
    assert not compare(one([0.0]), one([-0.0]), tolerances=Exact()).ok   # max/min: IEEE 754-2019 orders -0 < +0
    assert compare(one([0.0]), one([-0.0]), tolerances=Exact(signed_zero=False)).ok  # reduce sums: sign open
    assert compare(one([0.0]), one([-0.0]), tolerances=_psum_bound([0.0, -0.0])).ok  # sums: numeric


def test_integer_off_by_one_fails_and_names_the_element():
    r = compare(two_devices([1, 2], [3, 4]), two_devices([1, 2], [3, 5]))
    assert not r.ok
    (m,) = r.mismatches
    assert (m.kind, m.device_id, m.count, m.size) == ("values", 1, 1, 2)
    assert m.elements[0][:4] == ((1,), (3,), 4, 5)       # local (1,), global (3,), refsim 4, xla 5


def test_wrong_device_id_fails():
    r = compare(two_devices([1], [2], ids=(0, 1)), two_devices([1], [2], ids=(0, 2)))
    assert [m.kind for m in r.mismatches] == ["devices"]
    assert "missing on xla: [1], extra on xla: [2]" in r.mismatches[0].message


def test_wrong_index_fails():
    a = two_devices([1], [2])
    b = two_devices([1], [2])
    b.shards[0], b.shards[1] = Sh(0, (slice(1, 2),), b.shards[0].data), Sh(1, (slice(0, 1),), b.shards[1].data)
    kinds = [m.kind for m in compare(a, b).mismatches]
    assert kinds == ["index", "index"]


def test_slice_none_equals_full_slice():
    a = one([1.0, 2.0], index=(slice(None),))
    b = one([1.0, 2.0], index=(slice(0, 2),))
    assert compare(a, b).ok


def test_dtype_and_shape_mismatches_fail():
    assert [m.kind for m in compare(one([1, 2], np.int32), one([1, 2], np.int64)).mismatches] == ["dtype"]
    assert [m.kind for m in compare(one([1, 2]), one([1, 2, 3])).mismatches] == ["shape"]
    a = one([1.0, 2.0])
    b = one([1.0, 2.0])
    b.shards[0] = Sh(0, (slice(None),), np.array([1.0, 2.0], np.float64))
    assert [m.kind for m in compare(a, b).mismatches] == ["shard dtype"]


def test_output_count_mismatch():
    r = compare([one([1.0]), one([2.0])], [one([1.0])])
    assert r.mismatches[0].kind == "outputs"


def test_bfloat16_and_complex_exact():
    x = np.array([1.5, -2.0], ml_dtypes.bfloat16)
    assert compare(one(x, ml_dtypes.bfloat16), one(x, ml_dtypes.bfloat16)).ok
    y = x.copy()
    y[1] = -2.5
    assert not compare(one(x, ml_dtypes.bfloat16), one(y, ml_dtypes.bfloat16)).ok
    assert not compare(one([1 + 2j], np.complex64), one([1 + 3j], np.complex64)).ok


def test_tolerance_count_must_match_outputs():
    with pytest.raises(ValueError, match="one per output"):
        compare([one([1.0])], [one([1.0])], tolerances=[EXACT, EXACT])


def test_report_names_program_mesh_order_specs_dtype_device_index_and_elements():
    mesh = Mesh((2,), ("x",), device_ids=np.array([1, 0]))
    case = Program(family="psum", source="def f(a):\n    return jax.lax.psum(a, 'x')\n", entry="shard_map",
                   mesh=mesh, args=(np.arange(4, dtype=np.int32),), in_specs=(P("x"),), out_specs=P("x"),
                   labels=(("axes", "'x'"),))
    r = compare(two_devices([1, 2], [3, 4], ids=(1, 0)), two_devices([1, 2], [3, 9], ids=(1, 0)), case=case)
    text = r.report()
    assert text.splitlines()[0] == "MISMATCH (1 found): psum[axes='x',dtype=int32,mesh=2:reversed]"
    for needle in ("device order reversed, ids [1, 0]", "in_specs:     (P('x',),)", "out_specs:    P('x',)",
                   "arg 0:        int32[4]", "output 0, device 0, index [2:4]: values differ in 1 of 2 elements",
                   "element (1,) (global (3,)): refsim 4, xla 9", "jax.lax.psum(a, 'x')"):
        assert needle in text, (needle, text)
    assert "MATCH: psum" in compare(two_devices([1], [2]), two_devices([1], [2]), case=case).report()
    with pytest.raises(AssertionError, match="refsim 4, xla 9"):
        r.raise_if_mismatch()


def test_sum_bound_of_another_shard_shape_is_refused():
    # terms of shape (n, 3) give an exact value of shape (3,); a (1, 3) shard (a pmap output
    # keeps its mapped axis) must not be compared by broadcasting against it.
    tol = SumBound.from_terms({0: np.array([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]], np.float32)})
    with pytest.raises(ValueError, match=r"exact value of shape \(3,\), but its shard has shape \(1, 3\)"):
        compare(one([[2.0, 3.0, 4.0]]), one([[2.0, 3.0, 4.0]]), tolerances=tol)


# -- exact where no order rounds, overflow, float8, ulp, element classes ---------------------
def test_exact_friendly_sum_is_held_bit_exact_a_few_ulps_fail():
    # 1 + 2 + 0.25 = 3.25 in any order (multiples of 2**-2, far below 2**22): 4 ulps off must fail,
    # although gamma(2) * 3.25 would allow it.
    tol = _psum_bound([1.0, 2.0, 0.25])
    off = np.float32(3.25)
    for _ in range(4):
        off = np.nextafter(off, np.float32(4))
    r = compare(one([3.25]), one([off]), tolerances=tol)
    assert not r.ok
    (m,) = r.mismatches
    assert m.kind == "bound" and "exact sum" in m.policy and "no order of additions rounds" in m.policy
    assert "exact in 1 of 1 element(s)" in r.report()


def test_overflow_to_the_same_infinity_agrees():
    big = float(np.finfo(np.float32).max)
    tol = _psum_bound([big, big])
    assert compare(one([np.inf]), one([np.inf]), tolerances=tol).ok
    assert not compare(one([np.inf]), one([-np.inf]), tolerances=tol).ok
    assert not compare(one([np.inf]), one([big]), tolerances=tol).ok      # 2*max is not near max
    # max + max - max: left to right overflows, (max - max) + max does not: both are right
    tol3 = _psum_bound([big, big, -big])
    for got in (np.inf, big, np.nan):
        assert compare(one([got]), one([got]), tolerances=tol3).ok, got


def test_non_finite_terms_give_the_ieee_result_in_any_order():
    assert compare(one([np.inf]), one([np.inf]), tolerances=_psum_bound([np.inf, 1.0])).ok
    assert not compare(one([np.inf]), one([1.0]), tolerances=_psum_bound([np.inf, 1.0])).ok
    assert compare(one([np.nan]), one([np.nan]), tolerances=_psum_bound([np.inf, -np.inf])).ok
    assert not compare(one([np.nan]), one([np.inf]), tolerances=_psum_bound([np.inf, -np.inf])).ok


def test_a_zero_sum_may_have_either_sign():
    tol = _psum_bound([-0.0, -0.0])
    assert compare(one([-0.0]), one([0.0]), tolerances=tol).ok


def test_float8_sums_over_many_devices_are_compared():
    f8 = ml_dtypes.float8_e5m2                        # u = 2**-3: gamma(15) is undefined
    terms = np.array([[1.0]] * 4 + [[0.0]] * 12, f8)   # partial sums 0..4 fit e5m2's 3 bits: exact
    tol = SumBound.from_terms({0: terms})
    assert compare(one([4.0], f8), one([4.0], f8), tolerances=tol).ok
    assert not compare(one([4.0], f8), one([5.0], f8), tolerances=tol).ok
    # sixteen ones do round (8 + 1 ties back to 8): the bound ((1 + 2**-3)**15 - 1) * 16 admits 8
    tol16 = SumBound.from_terms({0: np.array([[1.0]] * 16, f8)})
    assert compare(one([16.0], f8), one([8.0], f8), tolerances=tol16).ok
    for dt in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3b11fnuz):
        x = np.array([1.5, -2.0], dt)
        assert compare(one(x, dt), one(x, dt)).ok


def test_ulp_policy_by_hand():
    x = np.float32(1.0)
    two = np.nextafter(np.nextafter(x, np.float32(2)), np.float32(2))
    three = np.nextafter(two, np.float32(2))
    assert compare(one([x]), one([two]), ulp=2).ok
    r = compare(one([x]), one([three]), ulp=2)
    assert not r.ok and r.mismatches[0].kind == "ulp" and "within 2 ulp" in r.mismatches[0].policy
    assert compare(one([np.nan]), one([np.nan]), ulp=1).ok
    assert not compare(one([np.inf]), one([np.finfo(np.float32).max]), ulp=1).ok
    assert compare(one([0.0]), one([-0.0]), ulp=0).ok
    assert compare(one([3], np.int32), one([3], np.int32), ulp=1).ok
    assert not compare(one([3], np.int32), one([4], np.int32), ulp=1).ok        # integers stay exact
    from conformance.verdict.compare import Ulp

    assert "within 1 ulp (erf: documented)" in compare(one([x]), one([three]),
                                                       tolerances=Ulp(1, "erf: documented")).report()
    with pytest.raises(ValueError, match="either tolerances= or ulp="):
        compare(one([x]), one([x]), ulp=1, tolerances=EXACT)


def test_mismatch_classes_name_how_elements_differ():
    tiny = np.float32(1e-40)
    r = compare(one([np.nan, 1.0, tiny, 0.0, 1.0]), one([7.0, np.nan, 0.0, -0.0, np.nextafter(np.float32(1), np.float32(2))]))
    assert r.classes == ("1-ulp", "nan-dropped", "nan-introduced", "signed-zero", "subnormal-flushed")
    assert compare(one([np.nan, 5.0]), one([7.0, 5.0])).classes == ("nan-dropped",)


def test_complex_sum_nan_and_overflow_are_tracked_part_by_part():
    # a NaN term in the real part makes the real part of the sum NaN, never the imaginary part:
    # (nan+1j) + (2+3j) is nan+4j by hand, and nan+nanj is a wrong answer
    terms = np.asarray([[complex(np.nan, 1.0)], [complex(2.0, 3.0)]], np.complex64)
    tol = SumBound.from_terms({0: terms})
    want = complex(np.nan, 4.0)
    assert compare(one([want], np.complex64), one([want], np.complex64), tolerances=tol).ok
    assert not compare(one([want], np.complex64), one([complex(np.nan, np.nan)], np.complex64), tolerances=tol).ok
    # pmean, though, divides the sum by n as a complex number, (a+bi)/(n+0i), where nan*0 makes
    # the other part NaN too: JAX gives nan+nanj (checked on XLA:CPU, jax 0.10.2 and 0.12), and
    # a finite wrong imaginary part is still wrong
    mean = SumBound.from_terms({0: terms}, mean=True)
    assert compare(one([complex(np.nan, 2.0)], np.complex64), one([complex(np.nan, np.nan)], np.complex64),
                   tolerances=mean).ok
    assert not compare(one([complex(np.nan, 2.0)], np.complex64), one([complex(np.nan, 5.0)], np.complex64),
                       tolerances=mean).ok
    # real parts 3e38 + 3e38 overflow float32 (some order gives inf); imaginary parts 1 + 2 = 3 do not
    big = np.asarray([[complex(3e38, 1.0)], [complex(3e38, 2.0)]], np.complex64)
    tol = SumBound.from_terms({0: big})
    assert compare(one([complex(np.inf, 3.0)], np.complex64), one([complex(np.inf, 3.0)], np.complex64), tolerances=tol).ok
    assert not compare(one([complex(np.inf, 3.0)], np.complex64), one([complex(np.inf, np.inf)], np.complex64),
                       tolerances=tol).ok
    pinf, ninf, nan = tol.allowed_nonfinite(0, np.complex64)
    assert pinf.shape == (2, 1) and pinf[:, 0].tolist() == [True, False] and not nan.any()


def test_sum_bound_checked_in_row_blocks_finds_the_same_elements(monkeypatch):
    # A large shard is checked in blocks of leading-axis rows; with 2-element blocks these
    # small cases cross block edges. Complex sums carry per-part masks (a leading axis of 2).
    import conformance.verdict.compare as cmp

    monkeypatch.setattr(cmp, "_ROWS_ELEMENTS", 2)
    terms = np.zeros((2, 5, 2), np.complex64)
    terms[0] = np.arange(10).reshape(5, 2) + 1j
    terms[1] = 1 + 2j
    terms[0, 3, 1] = complex(np.nan, 1.0)                  # row 3, col 1: real part NaN, imaginary 3
    tol = SumBound.from_terms({0: terms})
    want = terms.sum(axis=0)                                # every sum of small integers is exact
    want[3, 1] = complex(np.nan, 3.0)
    got = want.copy()
    got[4, 0] += 1                                          # a wrong real part in the last block
    got[3, 1] = complex(np.nan, np.nan)                     # NaN only allowed in the real part
    res = compare(one(want, np.complex64), one(got, np.complex64), tolerances=tol)
    (m,) = res.mismatches
    assert m.count == 2 and sorted(e[0] for e in m.elements) == [(3, 1), (4, 0)], m
    assert compare(one(want, np.complex64), one(want, np.complex64), tolerances=tol).ok
