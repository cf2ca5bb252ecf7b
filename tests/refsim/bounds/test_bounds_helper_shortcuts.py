"""The walk's cheaper helpers give what their long forms give, bit for bit: half_ulp as
ldexp(u / 2, e) without errstate, growth of one count from a cache, sum_latitude's factors per
(n, dtype), finish's finiteness test in Python floats, and `quiet` inside `quietly`."""
import warnings

import ml_dtypes
import numpy as np
import pytest

from refsim.bounds import values as V
from refsim.bounds import walk
from refsim.bounds.rules.reductions import sum_latitude

DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]
EDGES = np.array([0.0, -0.0, 5e-324, 2.0 ** -1022, 1e-45, 1.1754944e-38, 0.5, 1.0, 3.0, 2.0 ** 52 + 1,
                  float(np.finfo(np.float32).max), 1.7976931348623157e308, np.inf, -np.inf, np.nan, -7.25])


def half_ulp_long(a, dtype):
    """half_ulp as it was: ldexp(u, e - 1) under errstate."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        _, e = np.frexp(np.asarray(a, np.float64))
        return np.maximum(np.ldexp(V.unit_roundoff(dtype), e - 1), V.half_subnormal(dtype))


def growth_long(k, u):
    k = np.asarray(k, np.float64)
    return np.expm1(k * np.log1p(u))


def sum_latitude_long(n, abs_sum, center_abs_sum, dtype):
    """sum_latitude's array path, for a count given as an int."""
    u = V.unit_roundoff(dtype)
    adds = np.maximum(np.asarray(n) - 1, 0)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        own = np.where(adds == 0, 0.0, growth_long(adds, u) * abs_sum)
        return own + adds * V.half_subnormal(dtype) + growth_long(n, 2.0 ** -53) * center_abs_sum


def same(a, b) -> bool:
    """Equal bits, equal shape, equal kind (NumPy scalar or array), the same memory layout (a
    later reduction's order of additions follows it)."""
    return (type(a) is type(b) and np.shape(a) == np.shape(b)
            and np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
            and np.array_equal(np.signbit(a), np.signbit(b))
            and np.asarray(a).strides == np.asarray(b).strides)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_half_ulp_matches_the_long_form(dtype):
    rng = np.random.default_rng(0)
    x = np.concatenate([EDGES, rng.standard_normal(300) * 10.0 ** rng.integers(-320, 308, 300)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # and raises no floating-point warning
        got = V.half_ulp(x, dtype)
    assert same(got, half_ulp_long(x, dtype))
    assert same(V.half_ulp(np.float64(3.0), dtype), half_ulp_long(np.float64(3.0), dtype))


@pytest.mark.parametrize("k", [0, 1, 2, 7, 64, 65, 4096, 10 ** 6, np.int64(33), 3.0, np.float64(5.0), True])
@pytest.mark.parametrize("u", [2.0 ** -24, 2.0 ** -53, 2.0 ** -8])
def test_growth_of_one_count_matches_the_array_form(k, u):
    with np.errstate(over="ignore"):               # (1 + 2**-8)**1e6 is no float64
        assert same(V.growth(k, u), growth_long(k, u))
        assert same(V.growth(np.array([k, k]), u), growth_long(np.array([k, k]), u))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [0, 1, 2, 64, 1000, np.int64(3)])
def test_sum_latitude_of_a_count_matches_its_array_path(dtype, n):
    rng = np.random.default_rng(1)
    a = np.abs(np.concatenate([EDGES, rng.standard_normal(50)]))
    b = a + np.abs(rng.standard_normal(a.size)) * 1e-3
    b[3] = np.inf
    b2, a2 = b[:60].reshape(3, 4, 5), a[:60].reshape(3, 4, 5)
    for abs_sum, cas in ((b, a), (b[4], a[4]), (b.reshape(2, -1), a.reshape(2, -1)), (np.zeros((0, 3)), np.zeros((0, 3))),
                         (np.asfortranarray(b2), np.asfortranarray(a2)), (b2.transpose(2, 0, 1), a2.transpose(2, 0, 1)),
                         (b2[:, ::2], a2[:, ::2]), (np.asarray(b[4]), np.asarray(a[4]))):
        assert same(sum_latitude(n, abs_sum, cas, dtype), sum_latitude_long(n, abs_sum, cas, dtype))
    arr = np.array([0, 1, 5])
    assert same(sum_latitude(arr, b[:3], a[:3], dtype), sum_latitude_long(arr, b[:3], a[:3], dtype))


def test_finite_below_matches_numpy_scalars():
    def long(a, b, thr):
        with np.errstate(invalid="ignore", over="ignore"):
            amax = np.maximum.reduce(a, axis=None)
            bmax = 0.0 if b is None else np.maximum.reduce(b, axis=None)
            return bool(np.isfinite(amax) and np.isfinite(bmax) and amax + bmax < thr)

    thr = V.overflow_threshold(np.float32)
    cases = [(np.array([1.0, 2.0]), None), (np.array([np.nan, 1.0]), None), (np.array([np.inf]), None),
             (np.array([3e38]), np.array([4e36])), (np.array([3e38]), np.array([1e30])),
             (np.array([1.0]), np.array([np.nan])), (np.array([1e308]), np.array([1e308])),
             (np.array([thr]), None), (np.array([1.0]), np.array([np.inf]))]
    for a, b in cases:
        assert walk._finite_below(a, b, thr) == long(a, b, thr), (a, b)


def test_quiet_enters_errstate_outside_a_walk_and_nothing_inside():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with V.quiet():
            np.array([1e308]) * 10.0               # no overflow warning
        with V.quietly():
            assert V.quiet() is V.quiet()          # the shared no-op
            with V.quiet():
                np.array([0.0]) / 0.0              # still silent: quietly holds the errstate
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        np.array([1e308]) * 10.0                   # quietly left NumPy's state as it was
    assert not isinstance(V.quiet(), type(V._ENTERED))
