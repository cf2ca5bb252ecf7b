"""dot_general / conv through refsim's BLAS products against a naive loop over output elements.

The reference here is independent of refsim.interpreter.rules._products: a Python loop over
every output element and every contraction index, summing exact `Fraction`s (float32 and
narrower, complex64: the exact sum rounded once to nearest even), Python floats in ascending k
(float64: the stated order), Python ints (integers, wrapped to the result type) or `or` (bool).
"""
from __future__ import annotations

import itertools
import os
import pathlib
import subprocess
import sys
from fractions import Fraction

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import refsim
from refsim.interpreter.rules import _products
from rules_harness import refsim_eval, stacked_matches_loop

BF16 = np.dtype(ml_dtypes.bfloat16)
ROOT = pathlib.Path(__file__).resolve().parents[4]


# --- the naive reference ------------------------------------------------------------------------

def _round_to(q: Fraction, dtype) -> float:
    """`q` rounded to nearest (ties to even) in float32 (or float16 / bfloat16 via float32 first,
    as the rule rounds its float32 result once more)."""
    f32 = np.float32
    r = f32(float(q))
    cands = [np.nextafter(r, f32(-np.inf)), r, np.nextafter(r, f32(np.inf))]
    best = min(cands, key=lambda c: (abs(Fraction(float(c)) - q), int(np.float32(c).view(np.uint32)) & 1))
    return float(best)


def _naive(lhs, rhs, dn, out_dtype, summer=None):
    """The dot_general of `lhs` and `rhs` element by element (see the module docstring); `summer`
    maps one element's (lhs, rhs) pairs, in contraction order, to its value."""
    (lc, rc), (lb, rb) = dn
    lf = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
    rf = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
    out_shape = [lhs.shape[d] for d in lb] + [lhs.shape[d] for d in lf] + [rhs.shape[d] for d in rf]
    out = np.zeros(out_shape, out_dtype)
    ctr = [range(lhs.shape[d]) for d in lc]
    kind = np.dtype(out_dtype)
    for oi in itertools.product(*[range(n) for n in out_shape]):
        bi, li, ri = oi[:len(lb)], oi[len(lb):len(lb) + len(lf)], oi[len(lb) + len(lf):]
        terms = []
        for ci in itertools.product(*ctr):
            il, ir = [0] * lhs.ndim, [0] * rhs.ndim
            for d, v in zip(lb, bi):
                il[d] = v
            for d, v in zip(rb, bi):
                ir[d] = v
            for d, v in zip(lf, li):
                il[d] = v
            for d, v in zip(rf, ri):
                ir[d] = v
            for d, e, v in zip(lc, rc, ci):
                il[d], ir[e] = v, v
            terms.append((lhs[tuple(il)], rhs[tuple(ir)]))
        out[oi] = (summer or _naive_sum)(terms, kind)
    return out


def _naive_sum(terms, kind: np.dtype):
    if kind == bool:
        return any(bool(a) and bool(b) for a, b in terms)
    if kind.kind in "iu":
        total = sum(int(a) * int(b) for a, b in terms)
        return np.array(total % (1 << (8 * kind.itemsize))).astype(np.uint64).astype(kind)
    if kind == np.float64:
        return _ascending([float(a) * float(b) for a, b in terms])
    if kind == np.complex64:
        re = sum((Fraction(float(a.real)) * Fraction(float(b.real)) - Fraction(float(a.imag)) * Fraction(float(b.imag))
                  for a, b in terms), Fraction(0))
        im = sum((Fraction(float(a.real)) * Fraction(float(b.imag)) + Fraction(float(a.imag)) * Fraction(float(b.real))
                  for a, b in terms), Fraction(0))
        return complex(_round_to(re, np.float32), _round_to(im, np.float32))
    if len(terms) == 1:  # one product: exact in float64, rounded once, its sign kept
        return np.float32(float(terms[0][0]) * float(terms[0][1]))
    return _round_to(sum((Fraction(float(a)) * Fraction(float(b)) for a, b in terms), Fraction(0)), np.float32) + 0.0


def _ascending(prods: list) -> float:
    """((p0 + p1) + p2) + ... in Python floats (one IEEE double operation each); a zero sum of two
    or more products is +0, a single product keeps its sign."""
    if not prods:
        return 0.0
    acc = prods[0]
    for p in prods[1:]:
        acc = acc + p
    return acc + 0.0 if len(prods) > 1 else acc


def _c128_sum(terms, kind) -> complex:
    """complex128 as refsim states it: the real part sums xr*yr over k then -xi*yi over k, the
    imaginary part xr*yi then xi*yr, each in ascending order."""
    re = _ascending([a.real * b.real for a, b in terms] + [(-a.imag) * b.imag for a, b in terms])
    im = _ascending([a.real * b.imag for a, b in terms] + [a.imag * b.real for a, b in terms])
    return complex(re, im)


def _x64():
    return jax.enable_x64(True) if hasattr(jax, "enable_x64") else jax.experimental.enable_x64()


def _dot(x, y, dn, pref=None):
    with _x64():  # float64 / int64 operands stay themselves when JAX traces
        return refsim_eval(lambda a, b: lax.dot_general(a, b, dn, preferred_element_type=pref), x, y)[0]


def _same(got, want, call):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, f"{call}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    g, w = got.astype(np.complex128), want.astype(np.complex128)
    nan = np.isnan(g) & np.isnan(w)   # NaN positions compared, not their sign or payload
    same = nan | ((g == w) & (np.signbit(g.real) == np.signbit(w.real)))
    assert same.all(), f"{call}: at {np.argwhere(~same)[:5].tolist()} expected {want[~same][:5]}, got {got[~same][:5]}"


# --- cases ---------------------------------------------------------------------------------------

DOTS = [  # (lhs shape, rhs shape, ((lc, rc), (lb, rb)))
    ((3, 4), (4, 5), (((1,), (0,)), ((), ()))),                      # matmul
    ((2, 3, 4), (2, 4, 5), (((2,), (1,)), ((0,), (0,)))),            # batch dim
    ((4, 2, 3), (3, 2, 6), (((2,), (0,)), ((1,), (1,)))),            # batch dim in the middle
    ((2, 3, 4, 5), (5, 2, 4, 3), (((3, 2), (0, 2)), ((0,), (1,)))),  # two contracting dims, out of order
    ((3, 5, 2), (2, 5), (((1, 2), (1, 0)), ((), ()))),               # two contracting dims, no free rhs dim
    ((7,), (7,), (((0,), (0,)), ((), ()))),                          # dot product
    ((2, 3), (4,), (((), ()), ((), ()))),                            # outer product (one product each)
    ((3, 0), (0, 2), (((1,), (0,)), ((), ()))),                      # empty contraction: zeros
    ((2, 1, 3), (2, 3, 1), (((2,), (1,)), ((0,), (0,)))),            # M = N = 1
]


def _draw(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == bool:
        return rng.random(shape) < 0.4
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, int(info.max) + 1, shape, dtype=np.int64).astype(dtype)
    if dtype.kind == "c":
        return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype)
    return (rng.normal(size=shape) * rng.choice([1e-3, 1.0, 1e3], size=shape)).astype(dtype)


TYPES = [  # (operand dtype, preferred_element_type, result dtype)
    (np.float32, None, np.float32), (np.float64, None, np.float64), (BF16, None, BF16),
    (BF16, np.float32, np.float32), (np.float16, None, np.float16), (np.complex64, None, np.complex64),
    (np.complex128, None, np.complex128), (np.int8, None, np.int8), (np.int8, np.int32, np.int32),
    (np.int32, None, np.int32), (np.uint8, None, np.uint8), (np.int64, None, np.int64), (bool, None, bool),
]


@pytest.mark.parametrize("case", range(len(DOTS)))
@pytest.mark.parametrize("types", TYPES, ids=lambda t: f"{np.dtype(t[0]).name}-{t[1] and np.dtype(t[1]).name}")
def test_dot_general_equals_naive(case, types):
    ls, rs, dn = DOTS[case]
    dtype, pref, out = types
    rng = np.random.default_rng(case)
    x, y = _draw(rng, ls, dtype), _draw(rng, rs, dtype)
    if np.dtype(out) == np.complex128:
        want = _naive(x, y, dn, np.complex128, summer=_c128_sum)
    else:
        wide = np.float32 if np.dtype(out) in (BF16, np.dtype(np.float16)) else out
        xs, ys = (x.astype(np.float32), y.astype(np.float32)) if np.dtype(dtype) in (BF16, np.dtype(np.float16)) else (x, y)
        if pref is not None and np.dtype(pref).kind in "iu":
            xs, ys = x.astype(pref), y.astype(pref)
        want = _naive(xs, ys, dn, wide).astype(out)
    _same(_dot(x, y, dn, pref), want, f"dot_general {ls}x{rs} {dn} {types}")


def test_float32_ties_round_to_even_and_the_residual_decides():
    # exact sums on float32 midpoints: any float32 accumulation order would give different bits
    x = np.float32([[2.0 ** 24, 1.0, 0.0], [2.0 ** 24, 1.0, 2.0 ** -30], [2.0 ** 24 + 2, 1.0, 0.0],
                    [2.0 ** 24, 1.0, -2.0 ** -30], [3.0, 2.0 ** -24, 2.0 ** -60]])
    y = np.ones((3, 1), np.float32)
    got = _dot(x, y, (((1,), (0,)), ((), ())))[:, 0]
    want = [2.0 ** 24, 2.0 ** 24 + 2, 2.0 ** 24 + 4, 2.0 ** 24, 3.0]
    np.testing.assert_array_equal(got, np.float32(want))
    _same(got, _naive(x, y, (((1,), (0,)), ((), ())), np.float32)[:, 0], "ties")


def test_float32_undecided_elements_are_resummed(monkeypatch):
    # large cancelling sums: many elements near a rounding boundary; each must equal the naive value
    rng = np.random.default_rng(3)
    x = rng.integers(-2 ** 23, 2 ** 23, (40, 64)).astype(np.float32) * np.float32(2.0 ** 10)
    y = rng.integers(-2 ** 3, 2 ** 3, (64, 6)).astype(np.float32)
    x[:, 0] = 2.0 ** 40   # a huge first term: the rest decides roundings near ties
    y[0] = 1.0
    calls = {"dd": 0, "fsum": 0}
    dd, fsum = _products._round_dd, _products._round_f32
    monkeypatch.setattr(_products, "_round_dd", lambda p: calls.__setitem__("dd", calls["dd"] + len(p)) or dd(p))
    monkeypatch.setattr(_products, "_round_f32", lambda t: calls.__setitem__("fsum", calls["fsum"] + 1) or fsum(t))
    dn = (((1,), (0,)), ((), ()))
    _same(_dot(x, y, dn), _naive(x, y, dn, np.float32), "cancelling sums")
    assert calls["dd"] and calls["fsum"], f"the re-summation stages were not both reached: {calls}"


def test_double_double_rounding_is_correct_where_it_claims_to_be():
    """`_round_dd` on rows built to sit on, next to and far from float32 midpoints, with heavy
    cancellation: every row it calls decided is the exact sum correctly rounded."""
    rng = np.random.default_rng(12)
    rows = []
    for _ in range(300):
        k = int(rng.integers(2, 40))
        base = rng.normal(size=k) * 2.0 ** rng.integers(-30, 30, k)
        target = float(np.float32(rng.normal() * 2.0 ** rng.integers(-20, 20)))
        ulp = float(np.spacing(np.float32(target)))
        tweak = [0.0, ulp / 2, ulp / 2 + ulp * 2.0 ** -40, ulp / 2 - ulp * 2.0 ** -40, ulp * 0.3][rng.integers(0, 5)]
        row = list(base) + [-float(x) for x in base] + [target, tweak]  # cancels to target + tweak
        rng.shuffle(row)
        rows.append(row)
    width = max(len(r) for r in rows)
    p = np.zeros((len(rows), width))
    for i, r in enumerate(rows):
        p[i, :len(r)] = r
    got, ok = _products._round_dd(p)
    assert ok.mean() > 0.5, "the double-double stage decided too few rows to be tested"
    for i in np.flatnonzero(ok):
        want = _round_to(sum((Fraction(float(x)) for x in p[i]), Fraction(0)), np.float32)
        assert float(got[i]) == want, (i, p[i].tolist(), float(got[i]), want)
    for i in range(len(rows)):   # the fallback is exact everywhere
        want = _round_to(sum((Fraction(float(x)) for x in p[i]), Fraction(0)), np.float32)
        assert float(_products._round_f32(p[i].tolist())) == want, (i, p[i].tolist())


def test_float32_random_large_k_equals_naive():
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(6, 700)).astype(np.float32), rng.normal(size=(700, 5)).astype(np.float32)
    dn = (((1,), (0,)), ((), ()))
    _same(_dot(x, y, dn), _naive(x, y, dn, np.float32), "k=700")


@pytest.mark.parametrize("dtype", [np.float32, np.complex64, np.float64])
def test_non_finite_operands_follow_ieee(dtype):
    x = np.array([[np.inf, 1.0], [np.inf, 0.0], [np.inf, -np.inf], [np.nan, 1.0], [1.0, 2.0], [-np.inf, 3.0]],
                 dtype)
    y = np.array([[1.0, 0.0, -1.0], [1.0, 1.0, np.inf]], dtype)
    dn = (((1,), (0,)), ((), ()))
    want = np.empty((6, 3), dtype)
    with np.errstate(invalid="ignore"):
        for i, j in itertools.product(range(6), range(3)):
            want[i, j] = x[i, 0] * y[0, j] + x[i, 1] * y[1, j] + 0.0  # two terms: any order, IEEE
    got = _dot(x, y, dn)
    if np.dtype(dtype).kind == "c":
        assert np.array_equal(np.isnan(got.real), np.isnan(want.real)), (got, want)
        return
    _same(got, want, f"non-finite {dtype}")


def test_float32_products_beyond_float32_range_are_exact():
    # 1e30 * 1e30 overflows float32 but not the exact sum: (1e60 - 1e60) + 2 = 2
    x = np.float32([[1e30, -1e30, 1.0]])
    y = np.float32([[1e30], [1e30], [2.0]])
    np.testing.assert_array_equal(_dot(x, y, (((1,), (0,)), ((), ()))), np.float32([[2.0]]))


def test_signed_zeros():
    x = np.float32([[-0.0, -0.0], [-1.0, 0.0]])
    y = np.float32([[1.0], [1.0]])
    got = _dot(x, y, (((1,), (0,)), ((), ())))
    assert not np.signbit(got[0, 0]), "a zero sum of two products is +0"
    one = _dot(np.float32([[-0.0]]), np.float32([[1.0]]), (((1,), (0,)), ((), ())))
    assert np.signbit(one[0, 0]), "a single product keeps its sign"


def test_integer_products_beyond_2_53_use_integer_arithmetic():
    x = np.array([[2 ** 40, 3]], np.int64)
    y = np.array([[2 ** 20 + 1], [5]], np.int64)
    want = (2 ** 40 * (2 ** 20 + 1) + 15) % 2 ** 64
    want = want - 2 ** 64 if want >= 2 ** 63 else want
    assert _dot(x, y, (((1,), (0,)), ((), ())))[0, 0] == want


def test_mesh_dims_broadcast_without_copies():
    # an invariant operand (mesh dim of size 1) against a varying one: matmul broadcasts the view
    rng = np.random.default_rng(5)
    x = rng.normal(size=(1, 3, 4)).astype(np.float32)
    y = rng.normal(size=(4, 4, 2)).astype(np.float32)
    res = _products.contract(x, y, nlead=1, x_batch=(), y_batch=(), x_contract=(2,), y_contract=(1,),
                             dtype=np.float32)
    for d in range(4):
        _same(res[d], _naive(x[0], y[d], (((1,), (0,)), ((), ())), np.float32), f"device {d}")
    stacked = np.broadcast_to(x, (4, 3, 4))  # a stride-0 mesh dim gives the same
    _same(_products.contract(stacked, y, nlead=1, x_batch=(), y_batch=(), x_contract=(2,), y_contract=(1,),
                             dtype=np.float32), res, "stride-0 mesh dim")


def test_a_batch_dim_broadcast_in_both_operands_keeps_its_size():
    rng = np.random.default_rng(6)
    x = np.broadcast_to(rng.normal(size=(1, 3, 5)).astype(np.float32), (4, 3, 5))
    y = np.broadcast_to(rng.normal(size=(1, 5, 2)).astype(np.float32), (4, 5, 2))
    res = _products.contract(x, y, nlead=0, x_batch=(0,), y_batch=(0,), x_contract=(2,), y_contract=(1,),
                             dtype=np.float32)
    assert res.shape == (4, 3, 2)
    for i in range(4):
        _same(res[i], _naive(x[0], y[0], (((1,), (0,)), ((), ())), np.float32), f"batch {i}")


@pytest.mark.parametrize("m", [(2,), (2, 2)])
def test_stacked_dot_equals_per_device_loop(m):
    rng = np.random.default_rng(7)
    stacked_matches_loop(lambda a, b: [a @ b, lax.dot_general(a, a, (((1,), (1,)), ((), ())))],
                         [lambda pos: rng.normal(size=(3, 40)).astype(np.float32),
                          lambda pos: rng.normal(size=(40, 2)).astype(np.float32)], m, call="dot")


def _naive_conv_1d(x, w, stride, pad, rdil):
    """NCH x OIH, cross-correlation, exact sums rounded once (float32)."""
    n, c, h = x.shape
    o, _, k = w.shape
    xp = np.zeros((n, c, h + pad[0] + pad[1]), x.dtype)
    xp[:, :, pad[0]: pad[0] + h] = x
    span = (k - 1) * rdil + 1
    oh = (xp.shape[2] - span) // stride + 1
    out = np.zeros((n, o, oh), np.float32)
    for b, f, i in itertools.product(range(n), range(o), range(oh)):
        q = sum((Fraction(float(xp[b, ch, i * stride + t * rdil])) * Fraction(float(w[f, ch, t]))
                 for ch in range(c) for t in range(k)), Fraction(0))
        out[b, f, i] = _round_to(q, np.float32) + 0.0
    return out


def test_conv_float32_equals_naive():
    rng = np.random.default_rng(8)
    x, w = rng.normal(size=(2, 3, 11)).astype(np.float32), rng.normal(size=(4, 3, 3)).astype(np.float32)
    got = refsim_eval(lambda a, b: lax.conv_general_dilated(a, b, (2,), ((1, 2),), rhs_dilation=(2,)), x, w)[0]
    _same(got, _naive_conv_1d(x, w, 2, (1, 2), 2), "conv1d")


def test_set_blas_threads_validates_and_results_do_not_change():
    with pytest.raises(ValueError, match="must be an int >= 1"):
        refsim.set_blas_threads(0)
    rng = np.random.default_rng(9)
    x, y = rng.normal(size=(96, 300)).astype(np.float32), rng.normal(size=(300, 80)).astype(np.float32)
    dn = (((1,), (0,)), ((), ()))
    try:
        outs = []
        for n in (1, 2, 3):
            refsim.set_blas_threads(n)
            outs.append(_dot(x, y, dn))
    finally:
        refsim.set_blas_threads(None)
    for o in outs[1:]:
        _same(o, outs[0], "threads")


def test_blas_held_sets_the_thread_count_once_and_restores_it_with_the_same_products():
    from refsim import blas

    rng = np.random.default_rng(10)
    a, b = rng.normal(size=(3, 96, 128)), rng.normal(size=(128, 70))     # above the threads threshold
    libs = blas._blas_libs()
    before = [lib.get_num_threads() for lib in libs]
    try:
        refsim.set_blas_threads(1)
        alone = blas.matmul(a, b)
        with blas.held():
            assert [lib.get_num_threads() for lib in libs] == [1] * len(libs)
            inside = blas.matmul(a, b)
        assert [lib.get_num_threads() for lib in libs] == before
    finally:
        refsim.set_blas_threads(None)
    assert np.array_equal(alone, inside)
    for sa, sb in (((), ()), ((3,), (3,)), ((3, 1), (1, 4)), ((), (5, 2)), ((2, 1, 3), (4, 1))):
        assert blas._batch(sa, sb) == int(np.prod(np.broadcast_shapes(sa, sb)))


_CHILD = """
import sys, numpy as np
sys.path[:0] = [{root!r}, {tests!r}]
import jax
jax.config.update("jax_enable_x64", True)
from rules_harness import refsim_eval
from jax import lax
rng = np.random.default_rng(11)
outs = {{}}
for dt in ("float32", "float64", "complex64"):
    x = (rng.normal(size=(4, 64, 257)) * 10.0 ** rng.integers(-3, 4, (4, 64, 257))).astype(dt)
    y = rng.normal(size=(4, 257, 48)).astype(dt)
    outs[dt] = refsim_eval(lambda a, b: lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,)))), x, y)[0]
np.savez(sys.argv[1], **outs)
"""


@pytest.mark.slow
def test_products_are_the_same_bits_on_every_blas_variant(tmp_path):
    """Fresh processes with OpenBLAS on different kernels (OPENBLAS_CORETYPE) and thread counts give
    the same bytes: BLAS's summation order never shows in refsim's results."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(root=str(ROOT), tests=str(ROOT / "tests")))
    variants = [{}, {"OPENBLAS_NUM_THREADS": "1"}, {"OPENBLAS_NUM_THREADS": "2", "REFSIM_BLAS_THREADS": "2"},
                {"OPENBLAS_CORETYPE": "Haswell", "REFSIM_BLAS_THREADS": "1"},
                {"OPENBLAS_CORETYPE": "Sandybridge", "REFSIM_BLAS_THREADS": "1"},
                {"OPENBLAS_CORETYPE": "Prescott", "REFSIM_BLAS_THREADS": "1"}]
    results = []
    for i, extra in enumerate(variants):
        out = tmp_path / f"out{i}.npz"
        env = {**os.environ, **extra, "JAX_PLATFORMS": "cpu"}
        subprocess.run([sys.executable, str(script), str(out)], check=True, env=env, cwd=ROOT, timeout=600)
        results.append(dict(np.load(out)))
    for extra, r in zip(variants[1:], results[1:]):
        for k in r:
            assert r[k].tobytes() == results[0][k].tobytes(), f"{k} differs under {extra}"
