"""refsim.libm's fast path (refsim/libm/fast.py) gives the exact path's bits: on random inputs
over every range, on special values, on the inputs whose value lies closest to a rounding
boundary (found by search), and under a simulated host whose float64 functions are off by up to
HOST_BOUND -- the argument that makes it host-independent."""
from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest

from refsim import libm
from refsim.libm import fast

NAMES = sorted(fast.KERNELS)
DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(_UINT[a.dtype.itemsize])


def _assert_same_bits(name, x, got, want):
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape, want.shape)
    diff = _bits(got) != _bits(want)
    if diff.any():
        i = np.flatnonzero(diff.reshape(-1))[:5]
        xs, g, w = x.reshape(-1)[i], got.reshape(-1)[i], want.reshape(-1)[i]
        raise AssertionError(
            f"{name} on {x.dtype}: the fast path differs from the exact path at {int(diff.sum())} of {diff.size} "
            f"elements, e.g. x={xs.tolist()} ({_bits(xs).tolist()}): fast {g.tolist()} ({_bits(g).tolist()}), "
            f"exact {w.tolist()} ({_bits(w).tolist()}). Reproduce: refsim.libm.evaluate({name!r}, x) vs "
            f"refsim.libm.evaluate_exact({name!r}, x)")


def _specials(dtype) -> np.ndarray:
    f = ml_dtypes.finfo(dtype)
    v = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 0.5, 2.0, 4.0, 0.25, float(f.max), -float(f.max),
         float(f.tiny), -float(f.tiny), float(f.smallest_subnormal), -float(f.smallest_subnormal), 1e-8, -1e-8,
         88.72, 88.7228391, 88.72284, -87.33, -87.3365, -103.97, -103.972, -104.0, -150.0, 128.0, -126.0, -149.0,
         -150.0, 709.0, -745.0, 20.0, -20.0, 9.01, -9.01, 1e6, -1e6, 2.0 ** 20, -(2.0 ** 20), 1e30, -1e30,
         np.pi, -np.pi, 3.0, 355.0, 103993.0, 1e-40, -1e-40]
    one = [float(np.float32(1) + k * np.float32(f.eps)) for k in range(-6, 7)]
    near = np.array(v + one + [-x for x in one], dtype=np.float64)
    with np.errstate(over="ignore"):
        x = near.astype(dtype)
    # neighbours of each: the next values up and down in the type
    b = x.view(_UINT[x.dtype.itemsize])
    return np.concatenate([x, (b + 1).view(x.dtype), (b - 1).view(x.dtype)])


def _random(dtype, n, seed) -> np.ndarray:
    """Log-uniform magnitudes over the whole range of the type, both signs, plus bulk data."""
    rng = np.random.default_rng(seed)
    f = ml_dtypes.finfo(dtype)
    lo, hi = int(np.log2(float(f.smallest_subnormal))), int(np.log2(float(f.max)))
    mags = np.ldexp(rng.uniform(1.0, 2.0, n), rng.integers(lo, hi + 1, n))
    wide = mags * rng.choice([-1.0, 1.0], n)
    bulk = np.concatenate([rng.normal(0.0, 3.0, n), rng.uniform(-110.0, 110.0, n)])
    with np.errstate(over="ignore"):
        return np.concatenate([wide, bulk]).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", NAMES)
def test_fast_path_equals_exact_path(name, dtype):
    x = np.concatenate([_specials(dtype), _random(dtype, 40000, seed=NAMES.index(name))])
    _assert_same_bits(name, x, libm.evaluate(name, x), libm.evaluate_exact(name, x))


@functools.lru_cache(maxsize=None)
def _near_midpoints(name: str, n: int = 1_500_000, keep: int = 4000) -> np.ndarray:
    """The `keep` float32 inputs, of n drawn, whose exact value (refsim's float64 before
    rounding) lies closest to a float32 rounding boundary, closest first."""
    x = _random(np.float32, n // 3, seed=17 + NAMES.index(name))
    with np.errstate(all="ignore"):
        v = libm.FUNCTIONS[name](x.astype(np.float64))
    f = np.finfo(np.float32)
    ok = np.isfinite(v) & (np.abs(v) >= float(f.tiny)) & (np.abs(v) <= float(f.max))
    x, v = x[ok], v[ok]
    low = v.view(np.int64) & ((1 << 29) - 1)  # the 29 bits a float32 drops: 2**28 is a midpoint
    return x[np.argsort(np.abs(low - (1 << 28)), kind="stable")[:keep]]


@pytest.mark.parametrize("name", NAMES)
def test_hard_cases_near_rounding_boundaries(name):
    """The inputs whose value is closest to a midpoint (within ~2**-38 relative of one, found
    by search) come out as the exact path's, whether the fast path decides them or not."""
    hard = _near_midpoints(name)
    _assert_same_bits(name, hard, libm.evaluate(name, hard), libm.evaluate_exact(name, hard))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_decision_leaves_every_value_near_a_boundary(dtype):
    """decide() flags every y within DELTA - HOST_BOUND (relative) of a rounding boundary of the
    type, and keeps values a little further off, rounded as the type rounds them."""
    rng = np.random.default_rng(2)
    f = ml_dtypes.finfo(dtype)
    lo = rng.uniform(1.0, 2.0, 20000).astype(dtype)  # a value and its successor: the midpoint is exact
    lo = lo[np.isfinite(lo.astype(np.float64))]
    hi = (lo.view(_UINT[lo.dtype.itemsize]) + 1).view(lo.dtype)
    mid = (lo.astype(np.float64) + hi.astype(np.float64)) / 2
    scale = np.ldexp(1.0, rng.integers(int(np.log2(float(f.tiny))), int(np.log2(float(f.max))), mid.size))
    mid = mid * scale  # exact: a power of two, inside the normal range of the type
    u = rng.uniform(-1.0, 1.0, mid.size)
    near = mid * (1.0 + u * (fast.DELTA - fast.HOST_BOUND))
    far = mid * (1.0 + np.sign(u) * 4 * fast.DELTA)
    for y, flagged in ((near, True), (far, False)):
        out, scratch, bad = np.empty(y.size, dtype), np.empty(y.size, dtype), np.empty(y.size, bool)
        fast.decide(y, out, scratch, bad, libm.round_once)
        assert (bad == flagged).all(), (np.dtype(dtype).name, flagged, y[bad != flagged][:3])
    assert _bits(out).tolist() == _bits(libm.round_once(far, dtype)).tolist()


@pytest.mark.parametrize("name", NAMES)
def test_host_within_host_bound_changes_nothing(name, monkeypatch):
    """A host whose float64 functions are off by up to HOST_BOUND (relative) gives the same bits:
    the kernel's output is perturbed by random factors in [1 - HOST_BOUND, 1 + HOST_BOUND]."""
    kernel = fast.KERNELS[name]
    rng = np.random.default_rng(3)

    def sloppy(x, y, t):
        outside = kernel(x, y, t)
        y *= 1.0 + fast.HOST_BOUND * rng.uniform(-1.0, 1.0, y.shape)
        return outside

    x = np.concatenate([_near_midpoints(name), _specials(np.float32), _random(np.float32, 20000, seed=5)])
    want = libm.evaluate_exact(name, x)
    monkeypatch.setitem(fast.KERNELS, name, sloppy)
    _assert_same_bits(name, x, libm.evaluate(name, x), want)


def test_sin_beyond_its_limit_takes_the_exact_path():
    x = np.array([1e6, 2.0 ** 20, 2.0 ** 21, -3e7, 1e30, 1.5], np.float32)
    assert list(fast.undecided("sin", x, libm.round_once)) == [False, False, True, True, True, False]
    _assert_same_bits("sin", x, libm.evaluate("sin", x), libm.evaluate_exact("sin", x))


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float4_e2m1fn],
                         ids=lambda d: np.dtype(d).name)
def test_tiny_types_without_nan_or_inf(dtype):
    """float8 / float4 types turn NaN, inf and overflow into numbers of their own: the fast path
    leaves those to the exact path, whose conversion sees the same NaN."""
    x = np.random.default_rng(0).normal(0.0, 3.0, 5000).astype(dtype)
    for name in NAMES:
        _assert_same_bits(name, x, libm.evaluate(name, x), libm.evaluate_exact(name, x))


def test_nan_payloads_and_signed_zeros_are_the_exact_paths():
    payloads = np.array([0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7F800001, 0xFFFFFFFF], np.uint32).view(np.float32)
    x = np.concatenate([payloads, np.array([0.0, -0.0], np.float32)])
    for name in NAMES:
        _assert_same_bits(name, x, libm.evaluate(name, x), libm.evaluate_exact(name, x))


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (4, 3), (fast.CHUNK + 17,), (2, fast.CHUNK // 2 + 3)])
def test_shapes_and_layouts(shape):
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 2.0, shape).astype(np.float32)
    got = libm.evaluate("exp", x)
    assert got.shape == x.shape and got.dtype == np.float32
    _assert_same_bits("exp", x, got, libm.evaluate_exact("exp", x))
    if x.ndim == 2:  # a transposed view and a broadcast view
        _assert_same_bits("tanh", x.T, libm.evaluate("tanh", x.T), libm.evaluate_exact("tanh", x.T))
        b = np.broadcast_to(x[:1], x.shape)
        _assert_same_bits("log", b, libm.evaluate("log", b), libm.evaluate_exact("log", b))


def test_which_operands_take_the_fast_path():
    f32, f64 = np.ones(2, np.float32), np.ones(2)
    assert fast.applies("exp", [f32]) and fast.applies("exp", [np.ones(2, ml_dtypes.bfloat16)])
    assert fast.applies("sin", [np.ones(2, np.float16)]) and fast.applies("exp", [np.ones(2, ml_dtypes.float8_e4m3fn)])
    assert not fast.applies("exp", [f64])  # float64 results: the exact path (not correctly rounded)
    assert not fast.applies("exp", [np.ones(2, np.complex64)])
    assert not fast.applies("cos", [f32]) and not fast.applies("erf", [f32])
    assert not fast.applies("pow", [f32, f32])
    assert set(fast.KERNELS) <= set(libm.FUNCTIONS)
