"""Double-double arithmetic on float64 arrays and the constants refsim's libm is built from.

Every function here uses only IEEE-754 `+ - * /`, `sqrt`, comparisons and exact scaling
(`ldexp`, `frexp`, `rint`): each is correctly rounded by definition, so the results are the
same bits on every host, whatever SIMD kernels NumPy dispatches to (Dekker's and Knuth's
error-free transformations need no fused multiply-add).

The constants (pi, ln 2, the tables of 2**(j/64), log(1 + j/64), atan(j/64) and the bits of
2/pi) are computed at import from Python's `decimal` module (exact integer arithmetic and
correctly rounded `exp` / `ln` / `sqrt` at 60+ digits), then split into a float64 pair
(hi, lo) with hi + lo = the value to ~2**-106: no literal table to mistype.
"""
from __future__ import annotations

import decimal
from decimal import Decimal

import numpy as np

_SPLITTER = 134217729.0  # 2**27 + 1 (Veltkamp): splits a double into two 26-bit halves


def two_sum(a, b):
    """s + e == a + b exactly, s = fl(a + b) (Knuth)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def fast_two_sum(a, b):
    """s + e == a + b exactly when |a| >= |b| (or a == 0) (Dekker)."""
    s = a + b
    return s, b - (s - a)


def split(a):
    """a == hi + lo with hi, lo of at most 26 significant bits (|a| < 2**996)."""
    c = _SPLITTER * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a, b):
    """p + e == a * b exactly, p = fl(a * b) (Dekker; |a|, |b| < 2**996, no underflow)."""
    p = a * b
    ah, al = split(a)
    bh, bl = split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def dd_add(ah, al, bh, bl):
    """(ah + al) + (bh + bl) as a normalized pair."""
    s, e = two_sum(ah, bh)
    return fast_two_sum(s, e + (al + bl))


def dd_mul(ah, al, bh, bl):
    """(ah + al) * (bh + bl) as a normalized pair (relative error ~2**-104)."""
    p, e = two_prod(ah, bh)
    return fast_two_sum(p, e + (ah * bl + al * bh))


def dd_mul_d(ah, al, b):
    """(ah + al) * b for a double b."""
    p, e = two_prod(ah, b)
    return fast_two_sum(p, e + al * b)


def dd_div(ah, al, bh, bl):
    """(ah + al) / (bh + bl) as a normalized pair (one correction step of the quotient)."""
    q = ah / bh
    p, e = two_prod(q, bh)
    r = (((ah - p) - e) + al) - q * bl
    return fast_two_sum(q, r / bh)


def dd_sqrt(ah, al):
    """sqrt(ah + al) for ah + al >= 0, as a normalized pair (0 stays 0)."""
    s = np.sqrt(ah)
    p, e = two_prod(s, s)
    safe = np.where(s == 0, 1.0, s)
    corr = np.where(s == 0, 0.0, (((ah - p) - e) + al) / (2.0 * safe))
    return fast_two_sum(s, corr)


def keep_bits(v: float, n: int) -> float:
    """v with only its n leading significand bits (the rest zeroed): k * v is exact for
    integers |k| < 2**(53 - n)."""
    bits = np.array(v, dtype=np.float64).view(np.int64) & ~np.int64((1 << (53 - n)) - 1)
    return float(bits.view(np.float64))


def branches(x, cases, *extra):
    """Piecewise evaluation, each piece on its own elements only: cases is a list of
    (mask, fn) whose masks partition x; fn(x[mask], *extra[mask]) returns an array or a tuple
    of arrays (a pair). A mask that covers everything is evaluated without indexing."""
    for mask, fn in cases:
        if mask.all():
            return fn(x, *extra)
    outs = None
    for mask, fn in cases:
        if not mask.any():
            continue
        got = fn(x[mask], *(e[mask] for e in extra))
        tup = isinstance(got, tuple)
        got = got if tup else (got,)
        if outs is None:
            outs = [np.zeros(x.shape) for _ in got]
        for o, g in zip(outs, got):
            o[mask] = g
    return tuple(outs) if tup else outs[0]


def horner(x, coeffs):
    """coeffs[0] + coeffs[1] x + ... evaluated by Horner's rule in float64."""
    acc = np.full_like(x, coeffs[-1])
    for c in coeffs[-2::-1]:
        acc = acc * x + c
    return acc


# --- constants, from exact / correctly rounded decimal arithmetic ------------------------

_CTX = decimal.Context(prec=80)


def _pair(d: Decimal) -> tuple[float, float]:
    hi = float(d)
    return hi, float(_CTX.subtract(d, Decimal(hi)))


def _atan_small(y: Decimal, ctx: decimal.Context) -> Decimal:
    """atan(y) for |y| <= 1 by argument halving, then the Taylor series."""
    with decimal.localcontext(ctx):
        for _ in range(3):  # atan(y) = 2 atan(y / (1 + sqrt(1 + y^2)))
            y = y / (1 + (1 + y * y).sqrt())
        term, total, k, y2 = y, y, 1, y * y
        eps = Decimal(10) ** (-ctx.prec - 2)
        while abs(term) > eps:
            term = -term * y2
            total += term / (2 * k + 1)
            k += 1
        return total * 8


def _pi(ctx: decimal.Context) -> Decimal:
    """pi by Machin's formula, 16 atan(1/5) - 4 atan(1/239), in ctx's precision."""
    with decimal.localcontext(ctx):
        def acot(n):
            term = total = Decimal(1) / n
            k, eps = 1, Decimal(10) ** (-ctx.prec - 2)
            while term > eps:
                term /= n * n
                total += (-term if k % 2 else term) / (2 * k + 1)
                k += 1
            return total
        return 4 * (4 * acot(5) - acot(239))


PI_D = _pi(_CTX)
LN2_D = _CTX.ln(Decimal(2))
PI = _pair(PI_D)
PI_2 = _pair(_CTX.divide(PI_D, 2))
PI_4 = _pair(_CTX.divide(PI_D, 4))
LN2 = _pair(LN2_D)
INV_LN2 = _pair(_CTX.divide(1, LN2_D))

N_EXP = 64  # exp's table: 2**(j/64), j = 0..63
EXP2_TABLE = np.array([_pair(_CTX.power(Decimal(2), _CTX.divide(j, N_EXP))) for j in range(N_EXP)])
# log's table: log(1 + j/64) for j = -16..32 (row j + 16)
LOG_TABLE = np.array([_pair(_CTX.ln(_CTX.add(1, _CTX.divide(j, 64)))) for j in range(-16, 33)])
# atan's table: atan(j/64) for j = 0..64
ATAN_TABLE = np.array([_pair(_atan_small(_CTX.divide(j, 64), _CTX)) for j in range(65)])


def _two_over_pi_chunks(nchunks: int) -> np.ndarray:
    """The first 24 * nchunks bits after the binary point of 2/pi, as 24-bit integers."""
    bits = 24 * nchunks
    ctx = decimal.Context(prec=int(bits * 0.302) + 40)
    q = ctx.divide(Decimal(2 ** (bits + 1)), _pi(ctx))
    g = int(q.to_integral_value(rounding=decimal.ROUND_FLOOR, context=ctx))
    return np.array([(g >> (24 * (nchunks - 1 - i))) & 0xFFFFFF for i in range(nchunks)], dtype=np.int64)


TWO_OVER_PI_CHUNKS = _two_over_pi_chunks(56)  # 1344 bits: enough for any float64 argument
