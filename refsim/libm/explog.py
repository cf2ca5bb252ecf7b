"""exp, exp2, expm1, log, log2, log1p and pow on float64 arrays, host-independent.

Tang's table methods: exp(x) = 2**m * 2**(j/64) * exp(r) with |r| <= ln2/128 and a degree-6
Taylor polynomial (truncation ~2**-65); log(x) = e ln2 + log(c) + 2 atanh((f - c) / (f + c))
with c = 1 + j/64 near the mantissa f (|s| <= 2**-8, series to s**9). The leading terms are
carried as double-doubles, so exp, log and their kin are within about 0.5-1 ulp in float64
and pow within ~1 ulp (its log is carried to ~2**-70). Results below the smallest normal
are rounded twice (once in float64, once by the scaling), at most 1 ulp of the subnormal.
"""
from __future__ import annotations

import math

import numpy as np

from refsim.libm import _dd as D

_EXP_HI = D.EXP2_TABLE[:, 0]
_EXP_LO = D.EXP2_TABLE[:, 1]
# ln2/64 split so that k * _L1 is exact for |k| < 2**20: 32 leading bits, then the rest
_L1 = D.keep_bits(D.LN2[0] / 64, 32)
_L2 = (D.LN2[0] / 64 - _L1) + D.LN2[1] / 64
_INV_L = 64 / D.LN2[0]
_EXP_POLY = [1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720]  # exp(r) - 1 - r = r^2 (1/2 + r/6 + ...)

OVERFLOW = 709.782712893384    # exp(x) is inf above this (ln(max float64))
UNDERFLOW = -745.1332191019412  # exp(x) rounds to 0 below this


def exp_core(k, rh, rl):
    """exp(k ln2/64 + rh + rl) as (m, hi, tail): the value is 2**m * (hi + tail), hi a table
    entry in [1, 2), |tail| < 0.02 (|rh + rl| <= ln2/128)."""
    j = np.bitwise_and(k, 63)
    m = np.right_shift(k, 6)
    th, tl = _EXP_HI[j], _EXP_LO[j]
    r = rh + rl
    p = rh + (rl + r * r * D.horner(r, _EXP_POLY))  # exp(r) - 1
    return m, th, tl + (th + tl) * p


def _reduce(x):
    """k, rh, rl with x = k ln2/64 + rh + rl (|x| <= 746)."""
    k = np.rint(x * _INV_L)
    rh = x - k * _L1  # exact: k * _L1 has <= 53 bits and is within a factor 2 of x
    return k.astype(np.int64), rh, -k * _L2


def exp_dd(xh, xl=None):
    """exp(xh + xl) as (m, hi, tail), 2**m * (hi + tail); xh clipped to [-1100, 1100] (where
    2**m over- or underflows whatever hi + tail is)."""
    xh = np.clip(xh, -1100.0, 1100.0)
    k, rh, rl = _reduce(xh)
    if xl is not None:
        rl = rl + xl
    return exp_core(k, rh, rl)


def scale(m, v):
    """v * 2**m without spurious overflow (m may be 1024 with v < 1) or early underflow."""
    half = np.right_shift(m, 1)
    return np.ldexp(np.ldexp(v, half), m - half)


def exp(x):
    m, th, tail = exp_dd(x)
    out = scale(m, th + tail)
    out = np.where(x > OVERFLOW, np.inf, out)
    out = np.where(x < UNDERFLOW, 0.0, out)
    return np.where(np.isnan(x), x, out)


def exp2(x):
    """2**x: k = rint(64 x) is exact, r = (x - k/64) ln2 as a double-double."""
    xc = np.clip(x, -1080.0, 1030.0)
    k = np.rint(xc * 64)
    f = xc - k / 64  # exact
    rh, rl = D.dd_mul_d(D.LN2[0], D.LN2[1], f)
    m, th, tail = exp_core(k.astype(np.int64), rh, rl)
    out = scale(m, th + tail)
    out = np.where(x >= 1024, np.inf, out)
    out = np.where(x < -1075, 0.0, out)
    return np.where(np.isnan(x), x, out)


_EXPM1_SMALL = 0.0866  # below: a Taylor series (the table form cancels too much near 0)
_EXPM1_POLY = [1 / math.factorial(n) for n in range(2, 14)]


def _expm1_small(x):
    return D.fast_two_sum(x, x * x * D.horner(x, _EXPM1_POLY))


def _expm1_table(x):
    m, th, tail = exp_dd(x)
    # 2**m (th + tail) - 1: the subtraction is exact whenever it cancels (Sterbenz)
    big = np.minimum(m, 1023)
    yh, yl = np.ldexp(th, big), np.ldexp(tail, big)
    s, e = D.two_sum(yh, -1.0)
    return D.fast_two_sum(s, e + yl)


def expm1_dd(x):
    """expm1(x) as a normalized pair (x finite, clipped to [-1100, 1100])."""
    small = np.abs(x) < _EXPM1_SMALL
    return D.branches(x, [(small, _expm1_small), (~small, _expm1_table)])


def expm1(x):
    h, l = expm1_dd(x)
    out = h + l
    out = np.where(x > OVERFLOW, np.inf, out)
    out = np.where(x == 0, x, out)  # keeps -0
    return np.where(np.isnan(x), x, out)


# --- log ----------------------------------------------------------------------------------

_LOG_HI = D.LOG_TABLE[:, 0]
_LOG_LO = D.LOG_TABLE[:, 1]
_LN2_HI = D.keep_bits(D.LN2[0], 21)  # 21 bits: e * _LN2_HI is exact for |e| < 2**32
_LN2_LO = (D.LN2[0] - _LN2_HI) + D.LN2[1]
_ATANH_POLY = [2 / 3, 2 / 5, 2 / 7, 2 / 9]  # 2 atanh(s) - 2s = s^3 (2/3 + 2/5 s^2 + ...)


def log_dd(xh, xl=None):
    """log(xh + xl) for finite xh > 0 as a normalized pair (relative error ~2**-70)."""
    sub = xh < 2.2250738585072014e-308
    xs = np.where(sub, xh * 2.0 ** 54, xh)
    f, e = np.frexp(xs)  # xs = f 2**e, f in [0.5, 1)
    # f in [0.75, 1.5): near 1 (e = 0, j = 0) no table term cancels the result
    up = f < 0.75
    f = np.where(up, f * 2.0, f)
    e = (e - up).astype(np.float64) - np.where(sub, 54.0, 0.0)
    j = np.rint((f - 1.0) * 64).astype(np.int64)
    c = 1.0 + j / 64.0
    j = j + 16
    num = f - c  # exact
    den_h, den_l = D.two_sum(f, c)
    sh, sl = D.dd_div(num, np.zeros_like(num), den_h, den_l)
    s2 = sh * sh
    poly = sh * s2 * D.horner(s2, _ATANH_POLY)
    hi, lo = D.two_sum(e * _LN2_HI, _LOG_HI[j])
    hi2, lo2 = D.two_sum(hi, 2.0 * sh)
    tail = lo + lo2 + e * _LN2_LO + _LOG_LO[j] + 2.0 * sl + poly
    if xl is not None:  # log(xh + xl) = log(xh) + xl / xh (|xl / xh| <= 2**-53)
        tail = tail + xl / xh
    return D.fast_two_sum(hi2, tail)


def _log_specials(x, out):
    out = np.where(x == 0, -np.inf, out)
    out = np.where(x < 0, np.nan, out)
    out = np.where(x == np.inf, np.inf, out)
    return np.where(np.isnan(x), x, out)


def positive(x):
    return np.where((x > 0) & (x < np.inf), x, 1.0)


def log(x):
    h, l = log_dd(positive(x))
    return _log_specials(x, h + l)


def log2(x):
    h, l = log_dd(positive(x))
    h, l = D.dd_mul(h, l, *D.INV_LN2)
    return _log_specials(x, h + l)


def log1p_dd(ah, al):
    """log(1 + (ah + al)) for ah + al > -1 as a pair: 1 + a is formed exactly as a pair; for
    |a| < 2**-20 the series a - a^2/2 + a^3/3 (log(xh + xl) ~ log(xh) + xl/xh drops a^2/2)."""
    uh, ul = D.two_sum(1.0, ah)
    ul = ul + al
    uh, ul = D.fast_two_sum(uh, ul)
    h, l = log_dd(positive(uh), np.where(uh > 0, ul, 0.0))
    tiny = np.abs(ah) < 2.0 ** -20
    a = np.where(tiny, ah, 0.0)
    th, tl = D.fast_two_sum(a, al + a * a * (a / 3 - 0.5))
    return np.where(tiny, th, h), np.where(tiny, tl, l)


def log1p(x):
    xs = np.where((x > -1) & (x < np.inf), x, 0.0)
    h, l = log1p_dd(xs, np.zeros_like(xs))
    out = h + l
    out = np.where(x == -1, -np.inf, out)
    out = np.where(x < -1, np.nan, out)
    out = np.where(x == np.inf, np.inf, out)
    out = np.where(x == 0, x, out)  # keeps -0
    return np.where(np.isnan(x), x, out)


# --- pow ----------------------------------------------------------------------------------

def _is_odd_integer(y):
    with np.errstate(invalid="ignore"):
        return (np.abs(y) < 2.0 ** 53) & (np.fmod(y, 2.0) != 0) & (np.floor(y) == y)


def _pow_finite(x, y):
    """x**y for finite x != 0 and finite y, |x| != 1 or not: exp(y log|x|), with log and the
    product carried as double-doubles; the sign from an odd integer y, NaN for x < 0 and a
    non-integer y."""
    lh, ll = log_dd(np.abs(x))
    th = y * lh
    safe = np.abs(th) < 1000  # beyond, the result over- or underflows whatever the rounding
    ys = np.where(safe, y, 0.0)
    ph, pl = D.two_prod(ys, lh)
    ph, pl = D.fast_two_sum(ph, pl + ys * ll)
    m, eh, et = exp_dd(ph, pl)
    out = scale(m, eh + et)
    out = np.where(safe, out, np.where(th > 0, np.inf, 0.0))
    neg = x < 0
    if neg.any():
        out = np.where(neg & _is_odd_integer(y), -out, out)
        out = np.where(neg & (np.floor(y) != y), np.nan, out)
    return out


def _pow_special(x, y):
    """C99 / IEEE pow where x is 0, +-inf or NaN, or y is +-inf, NaN or 0, or x is 1."""
    ax = np.abs(x)
    odd = _is_odd_integer(y)
    out = np.full(x.shape, np.nan)
    inv_pos = np.where(y < 0, np.inf, 0.0)  # |x| = 0
    out = np.where(ax == 0, np.where(odd, np.copysign(inv_pos, x), inv_pos), out)
    big_pos = np.where(y < 0, 0.0, np.inf)  # |x| = inf
    out = np.where(ax == np.inf, np.where(odd, np.copysign(big_pos, x), big_pos), out)
    yinf = np.where(ax == 1, 1.0, np.where((ax < 1) == (y < 0), np.inf, 0.0))
    out = np.where(np.isinf(y), yinf, out)
    out = np.where(np.isnan(x) | np.isnan(y), np.nan, out)
    return np.where((y == 0) | (x == 1), 1.0, out)


def pow(x, y):
    """x**y with C99 / IEEE pow special cases (as XLA:CPU and NumPy)."""
    special = ~(np.isfinite(x) & np.isfinite(y) & (x != 0)) | (y == 0) | (x == 1)
    return D.branches(x, [(~special, _pow_finite), (special, _pow_special)], y)
