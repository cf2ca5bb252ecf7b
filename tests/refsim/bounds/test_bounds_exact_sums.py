"""A sum of exact terms is exact where no order of additions can round: `lowest_bit_exponent` read
off the bit pattern and `sum_no_order_rounds` (the per-row decision of reduce_sum) give what the
frexp-based exponent and `no_order_rounds` on its row minimum give, on edge values."""
import itertools
import math

import ml_dtypes
import numpy as np
import pytest

from refsim.bounds.rules.reductions import lowest_bit_exponent, no_order_rounds, sum_no_order_rounds

F32_MAX = float(np.finfo(np.float32).max)
SUB64 = 5e-324
EDGES = np.array([0.0, -0.0, SUB64, -SUB64, 3 * SUB64, 2.0 ** -1022, -(2.0 ** -1022) * 3, 2.0 ** -1023,
                  float(np.finfo(np.float32).smallest_subnormal), float(np.finfo(np.float32).tiny),
                  1.0, -1.0, 2.0, 0.5, 3.0, -7.0, 2.0 ** 52 + 1, 2.0 ** 53 - 1, 2.0 ** 1023,
                  float(np.finfo(np.float64).max), F32_MAX, -F32_MAX, 0.1, -1 / 3,
                  np.inf, -np.inf, np.nan])
DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn]


def lbe_frexp(x):
    """The exponent as the walk computed it before (frexp, the significand as an int64, log2)."""
    x = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m, e = np.frexp(x)
        fin = np.isfinite(x) & (x != 0)
        mi = np.where(fin, np.abs(m) * 2.0 ** 53, 1.0).astype(np.int64)
        low = mi & -mi
        q = e.astype(np.float64) - 53 + np.log2(low.astype(np.float64))
    return np.where(fin, q, np.inf)


def lbe_naive(x):
    """One element at a time: x = m * 2**e (math.frexp), the odd integer m * 2**53 halved while even."""
    out = []
    for v in np.asarray(x, np.float64).ravel().tolist():
        if v == 0 or not math.isfinite(v):
            out.append(math.inf)
            continue
        m, e = math.frexp(v)
        k, q = int(abs(m) * 2 ** 53), e - 53
        while k % 2 == 0:
            k //= 2
            q += 1
        out.append(float(q))
    return np.array(out).reshape(np.shape(x))


def _rows(rng, n_rows, n):
    """Rows that straddle the decision: integer multiples of one power of two whose magnitudes add
    up near 2**p, beside random, tiny, huge and non-finite ones."""
    rows = []
    for _ in range(n_rows):
        kind = rng.integers(6)
        scale = 2.0 ** int(rng.choice([-1074, -1060, -149, -140, -30, 0, 5, 60, 100, 900, 960]))
        if kind == 0:      # integers adding up to about 2**p for p in 3..53
            top = 2 ** int(rng.integers(2, 54))
            k = rng.integers(0, max(top // n, 1) * 2, n).astype(np.float64)
            k[0] = float(top - k[1:].sum()) + float(rng.integers(-2, 3))
            row = k * rng.choice([-1.0, 1.0], n) * scale
        elif kind == 1:    # random float32 values
            row = rng.standard_normal(n).astype(np.float32).astype(np.float64)
        elif kind == 2:    # small integers, some zeros
            row = rng.integers(-3, 4, n).astype(np.float64) * scale
        elif kind == 3:    # edge values
            row = rng.choice(EDGES, n)
        elif kind == 4:    # a large multiple and a tiny term (the scaled tiny term underflows)
            row = np.zeros(n)
            row[0], row[-1] = 2.0 ** 100, SUB64 * int(rng.integers(1, 4))
        else:              # powers of two of one sign
            row = 2.0 ** rng.integers(-60, 60, n).astype(np.float64) * scale
        with np.errstate(over="ignore", invalid="ignore"):
            rows.append(row)
    return np.array(rows)


def test_lowest_bit_exponent_matches_frexp_and_naive_on_edge_values():
    rng = np.random.default_rng(0)
    rand = np.concatenate([rng.standard_normal(500), rng.standard_normal(500).astype(np.float32),
                           rng.integers(-2 ** 40, 2 ** 40, 200) * 2.0 ** rng.integers(-1100, 900, 200),
                           (rng.integers(1, 2 ** 52, 100) * SUB64)])
    for x in (EDGES, rand, rand.reshape(50, -1)[:, ::3], np.float64(3.0), np.zeros((0, 3))):
        got = lowest_bit_exponent(x)
        assert np.array_equal(got, lbe_frexp(x)), (x, got, lbe_frexp(x))
        assert np.array_equal(got, lbe_naive(x)), (x, got, lbe_naive(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_sum_no_order_rounds_matches_the_row_minimum_decision(dtype):
    rng = np.random.default_rng(1)
    for shape, axes in [((64, 8), (1,)), ((64, 8), (0,)), ((4, 16, 6), (0, 2)), ((5, 7, 3), (0, 1, 2)),
                        ((3, 0), (1,)), ((0, 4), (0,))]:
        for _ in range(6):
            size = math.prod(shape)
            if size:
                moved = _rows(rng, size // shape[axes[-1]], shape[axes[-1]])
                x = np.moveaxis(moved.reshape(shape[:axes[-1]] + shape[axes[-1] + 1:] + (shape[axes[-1]],)),
                                -1, axes[-1])
                x = np.ascontiguousarray(x)
            else:
                x = np.zeros(shape)
            with np.errstate(over="ignore", invalid="ignore"):
                c, ac = np.sum(x, axis=axes), np.sum(np.abs(x), axis=axes)
                want = no_order_rounds(np.min(lbe_frexp(x), axis=axes, initial=np.inf), ac, dtype)
            got = sum_no_order_rounds(x, ac, axes, dtype)
            assert np.shape(got) == np.shape(want)
            assert np.array_equal(got, want), (dtype, shape, axes, x, got, want)


@pytest.mark.parametrize("row, dtype, exact", [
    ([2.0 ** 23, 2.0 ** 23 - 1], np.float32, True),          # 2**24 - 1: every partial sum a float32
    ([2.0 ** 23, 2.0 ** 23 - 1, 1.0], np.float32, False),    # 2**24 + ... : 2**24 + 1 is none
    ([0.5, 0.5, -0.5, -0.5, 2.0 ** 23], np.float32, False),  # both sums multiples of 2**0, 0.5 none
    ([2.0 ** 100, SUB64], np.float32, False),                # the tiny term underflows when scaled
    ([SUB64, SUB64], np.float64, True),                      # multiples of float64's smallest subnormal
    ([SUB64, SUB64], np.float32, False),                     # below float32's smallest subnormal
    ([0.0, -0.0], np.float32, True),
    ([1.0, np.inf], np.float32, False),
    ([1.0, np.nan], np.float32, False),
    ([F32_MAX, -F32_MAX], np.float32, False),                # 2 * max is no float32
    ([2.0 ** 127, -(2.0 ** 127)], np.float32, True),
    ([2.0 ** 127, 2.0 ** 127], np.float32, True),            # the magnitudes' sum is past float32's max
    ([2.0 ** 127, 2.0 ** 127], ml_dtypes.bfloat16, True),
    ([2.0 ** 15, 2.0 ** 15], np.float16, True),
    ([2.0 ** 15, 2.0 ** 15, 2.0 ** 4], np.float16, False),
    ([F32_MAX, 0.5], np.float32, False),
    ([1e308, 1e308], np.float64, False),                     # the magnitudes' sum overflows
])
def test_sum_no_order_rounds_on_named_rows(row, dtype, exact):
    x = np.array([row])
    with np.errstate(over="ignore", invalid="ignore"):
        c, ac = np.sum(x, axis=1), np.sum(np.abs(x), axis=1)
        want = no_order_rounds(np.min(lbe_frexp(x), axis=1, initial=np.inf), ac, dtype)
    assert list(sum_no_order_rounds(x, ac, (1,), dtype)) == [exact] == list(want)


@pytest.mark.parametrize("layout", ["C", "F", "transposed", "strided"])
def test_sum_no_order_rounds_keeps_the_mask_layout(layout):
    """The mask selects in np.where, whose result follows its operands' memory layout: the same
    layout as the long form's mask (a later reduction's order of additions follows it)."""
    rng = np.random.default_rng(2)
    ints = rng.integers(-3, 4, (6, 8, 10)).astype(np.float64)
    ints[1] += 0.1                                 # one inexact slab
    rand = rng.standard_normal((6, 8, 10)).astype(np.float32).astype(np.float64)   # no exact row
    for x, axes in itertools.product((ints, rand), ((0,), (1,), (2,), (0, 2))):
        x = {"C": x, "F": np.asfortranarray(x), "transposed": x.transpose(2, 0, 1), "strided": x[:, ::2]}[layout]
        c, ac = np.add.reduce(x, axis=axes), np.add.reduce(np.abs(x), axis=axes)
        want = no_order_rounds(np.min(lbe_frexp(x), axis=axes, initial=np.inf), ac, np.float32)
        got = sum_no_order_rounds(x, ac, axes, np.float32)
        assert np.array_equal(got, want) and got.strides == want.strides, (axes, got.strides, want.strides)
        assert np.where(got, c, c).strides == np.where(want, c, c).strides
