"""sin, cos, tan, atan, atan2, asin and acos on float64 arrays, host-independent.

Argument reduction x = n pi/2 + r is exact to ~2**-150: Cody-Waite with pi/2 in 33-bit
pieces for |x| < 2**20 pi/2, Payne-Hanek with the bits of 2/pi (integer arithmetic on 24-bit
chunks) above. sin and cos of |r| <= pi/4 are Taylor polynomials (to r**21 / r**22), tan is
their double-double quotient; atan uses atan(j/64) from a table and the series of the small
rest; asin, acos and atan2 go through a double-double atan of a double-double ratio.
All are within about 0.5-1 ulp in float64.
"""
from __future__ import annotations

import math

import numpy as np

from refsim.libm import _dd as D

# pi/2 in pieces: _P1.._P3 have 33 bits (n * P exact for |n| < 2**20), _P4 the rest
_PIO2 = D.PI_2
_P1 = D.keep_bits(_PIO2[0], 33)
_r = (_PIO2[0] - _P1) + _PIO2[1]
_P2 = D.keep_bits(_r, 33)
_r2 = (_PIO2[0] - _P1 - _P2) + _PIO2[1]
_P3 = D.keep_bits(_r2, 33)
_P4 = ((_PIO2[0] - _P1 - _P2 - _P3) + _PIO2[1])
_INV_PIO2 = 2 / math.pi
_MEDIUM = 2.0 ** 20 * _PIO2[0]

_SIN_POLY = [(-1) ** k / math.factorial(2 * k + 1) for k in range(1, 11)]  # r^3 .. r^21
_COS_POLY = [(-1) ** k / math.factorial(2 * k) for k in range(2, 12)]      # r^4 .. r^22


def _reduce_medium(x):
    """n, rh, rl with x = n pi/2 + rh + rl for |x| < 2**20 pi/2."""
    n = np.rint(x * _INV_PIO2)
    rh, rl = D.two_sum(x - n * _P1, -n * _P2)  # x - n * _P1 is exact (Sterbenz)
    t, e = D.two_sum(rh, -n * _P3)
    rh, rl = D.fast_two_sum(t, e + rl - n * _P4)
    return n, rh, rl


_G = D.TWO_OVER_PI_CHUNKS.astype(np.float64)
# chunks of 2/pi multiplied per element: the columns read (up to 6 past the units) are complete,
# the error from the chunks left out is below 2**-160 (the closest a float64 comes to a
# multiple of pi/2 is ~2**-61: the reduced argument keeps ~100 correct bits)
_K = 12


def _reduce_large(x):
    """n mod 4, rh, rl for 2**20 pi/2 <= |x| < inf (Payne-Hanek): x = M 2**E exactly, and
    x 2/pi mod 4 is summed from the 24-bit chunks of 2/pi that matter, in integers."""
    ax = np.abs(x)
    f, e = np.frexp(ax)  # ax = f 2**e, f in [0.5, 1)
    big_e = e.astype(np.int64) - 53  # ax = M 2**big_e, M < 2**53 an integer
    t = np.floor_divide(big_e, 24)
    s = big_e - 24 * t  # 0..23: M' = M 2**s, ax = M' 2**(24 t)
    mp = np.ldexp(f, 53 + s)  # exact integer < 2**77
    m = np.empty(ax.shape + (4,))
    for a in range(3, -1, -1):  # M' in four 24-bit chunks, most significant first
        m[..., a] = np.fmod(mp, 2.0 ** 24)
        mp = np.floor(mp / 2.0 ** 24)
    i0 = np.maximum(t - 1, 0)  # earlier chunks of 2/pi give multiples of 2**24 (of 4)
    g = _G[i0[..., None] + np.arange(_K)]
    q = np.zeros(ax.shape + (_K + 3,))
    for a in range(4):
        q[..., a:a + _K] += m[..., a:a + 1] * g  # < 2**50 each column: exact
    qi = q.astype(np.int64)
    for c in range(_K + 2, 0, -1):  # carries, least significant chunk first
        qi[..., c - 1] += qi[..., c] >> 24
        qi[..., c] &= 0xFFFFFF
    u = 2 + t - i0  # the chunk holding the units of x 2/pi
    cols = u[..., None] + np.arange(1, 7)
    frac = np.take_along_axis(qi, cols, axis=-1).astype(np.float64)
    n = np.take_along_axis(qi, u[..., None], axis=-1)[..., 0] & 3
    fh = frac[..., 0] * 2.0 ** -24 + frac[..., 1] * 2.0 ** -48  # each sum exact (48 bits)
    fm = frac[..., 2] * 2.0 ** -72 + frac[..., 3] * 2.0 ** -96
    fl = frac[..., 4] * 2.0 ** -120 + frac[..., 5] * 2.0 ** -144
    up = fh >= 0.5
    n = np.where(up, n + 1, n)
    fh = np.where(up, fh - 1.0, fh)  # exact
    fh, fm = D.two_sum(fh, fm)
    fh, fl = D.fast_two_sum(fh, fm + fl)
    rh, rl = D.dd_mul(fh, fl, *_PIO2)
    sign = np.where(x < 0, -1.0, 1.0)
    return np.where(x < 0, -n, n).astype(np.float64), sign * rh, sign * rl


def reduce_pio2(x):
    """n (as float64), rh, rl with x = n pi/2 + rh + rl, |rh| <= ~pi/4, for finite x."""
    large = np.abs(x) >= _MEDIUM
    n, rh, rl = _reduce_medium(np.where(large, 0.0, x))
    if large.any():
        idx = np.nonzero(large)
        n2, h2, l2 = _reduce_large(x[idx])
        n[idx], rh[idx], rl[idx] = n2, h2, l2
    return n, rh, rl


def _sin_kernel(rh, rl):
    """sin(rh + rl) as a pair, |rh| <= pi/4."""
    z = rh * rh
    tail = rl * (1.0 - 0.5 * z) + rh * z * D.horner(z, _SIN_POLY)
    return D.fast_two_sum(rh, tail)


def _cos_kernel(rh, rl):
    """cos(rh + rl) as a pair, |rh| <= pi/4."""
    zh, zl = D.two_prod(rh, rh)
    hz = 0.5 * zh
    w = 1.0 - hz
    tail = (((1.0 - w) - hz) - 0.5 * zl) + (zh * zh * D.horner(zh, _COS_POLY) - rh * rl)
    return D.fast_two_sum(w, tail)


def _sincos(x):
    xs = np.where(np.isfinite(x), x, 0.0)
    n, rh, rl = reduce_pio2(xs)
    return np.bitwise_and(n.astype(np.int64), 3), _sin_kernel(rh, rl), _cos_kernel(rh, rl)


def _finish(x, out, odd):
    out = np.where(np.isfinite(x), out, np.nan)
    if odd:
        out = np.where(x == 0, x, out)  # keeps -0
    return np.where(np.isnan(x), x, out)


def sin(x):
    q, (sh, sl), (ch, cl) = _sincos(x)
    v = np.where(q & 1, ch + cl, sh + sl)
    return _finish(x, np.where(q & 2, -v, v), True)


def cos(x):
    q, (sh, sl), (ch, cl) = _sincos(x)
    v = np.where(q & 1, sh + sl, ch + cl)
    return _finish(x, np.where((q == 1) | (q == 2), -v, v), False)


def tan(x):
    q, (sh, sl), (ch, cl) = _sincos(x)
    odd = (q & 1).astype(bool)
    nh, nl = np.where(odd, ch, sh), np.where(odd, cl, sl)
    dh, dl = np.where(odd, -sh, ch), np.where(odd, -sl, cl)
    dh = np.where(dh == 0, 1.0, dh)  # defensive: no nonzero float is a multiple of pi/2
    th, tl = D.dd_div(nh, nl, dh, dl)
    return _finish(x, th + tl, True)


# --- inverse functions --------------------------------------------------------------------

_ATAN_HI = D.ATAN_TABLE[:, 0]
_ATAN_LO = D.ATAN_TABLE[:, 1]
_ATAN_POLY = [(-1) ** k / (2 * k + 1) for k in range(1, 6)]  # d^3 .. d^11


def atan_dd(th, tl):
    """atan(th + tl) for 0 <= th + tl <= 1, as a pair: atan(c) + atan((t - c) / (1 + t c))
    with c = j/64 nearest to t."""
    j = np.rint(th * 64).astype(np.int64)
    c = j / 64.0
    nh, nl = D.fast_two_sum(th - c, tl)  # th - c is exact
    ph, pl = D.two_prod(th, c)
    bh, bl = D.fast_two_sum(1.0, ph)
    bl = bl + pl + tl * c
    dh, dl = D.dd_div(nh, nl, bh, bl)
    d2 = dh * dh
    tail = dl + dh * d2 * D.horner(d2, _ATAN_POLY)
    h, l = D.two_sum(_ATAN_HI[j], dh)
    return D.fast_two_sum(h, l + _ATAN_LO[j] + tail)


def atan2_pos_dd(yh, yl, xh, xl):
    """atan2(y, x) for finite y, x >= 0 (not both 0), as a pair in [0, pi/2]."""
    swap = (yh + yl) > (xh + xl)
    nh, nl = np.where(swap, xh, yh), np.where(swap, xl, yl)
    dh, dl = np.where(swap, yh, xh), np.where(swap, yl, xl)
    dh = np.where(dh == 0, 1.0, dh)
    qh, ql = D.dd_div(nh, nl, dh, dl)
    qh, ql = np.minimum(qh, 1.0), np.where(qh >= 1.0, 0.0, ql)
    ah, al = atan_dd(qh, ql)
    sh, sl = D.dd_add(D.PI_2[0], D.PI_2[1], -ah, -al)
    return np.where(swap, sh, ah), np.where(swap, sl, al)


def atan(x):
    ax = np.abs(x)
    fin = np.where(np.isfinite(ax), np.minimum(ax, 2.0 ** 60), 1.0)  # atan(2**60) rounds to pi/2
    h, l = atan2_pos_dd(fin, 0.0 * fin, np.ones_like(fin), 0.0 * fin)
    out = np.copysign(h + l, x)
    out = np.where(np.isinf(x), np.copysign(D.PI_2[0], x), out)
    out = np.where(x == 0, x, out)
    return np.where(np.isnan(x), x, out)


def _scale_pair(y, x):
    """y, x scaled by one power of two so that max(|y|, |x|) is in [1, 2): the ratio's
    double-double needs no overflowing products."""
    m = np.maximum(np.abs(y), np.abs(x))
    _, e = np.frexp(np.where((m > 0) & np.isfinite(m), m, 1.0))
    return np.ldexp(y, 1 - e), np.ldexp(x, 1 - e)


def _atan2_finite(y, x):
    """atan2 for finite y, x, not both zero: a double-double atan of the scaled ratio."""
    ys, xs = _scale_pair(y, x)
    ay, ax = np.abs(ys), np.abs(xs)
    h, l = atan2_pos_dd(ay, 0.0 * ay, ax, 0.0 * ax)
    ph, pl = D.dd_add(D.PI[0], D.PI[1], -h, -l)  # x < 0: pi - atan2(|y|, |x|)
    return np.copysign(np.where(np.signbit(x), ph + pl, h + l), y)


def _atan2_special(y, x):
    """C99 / IEEE atan2 where an operand is zero, infinite or NaN."""
    neg_x = np.signbit(x)
    # zeros: atan2(+-0, x) is +-0 for x > 0 or x = +0, +-pi for x < 0 or x = -0
    out = np.copysign(np.where(neg_x, D.PI[0], 0.0), y)
    out = np.where((x == 0) & (y != 0), np.copysign(D.PI_2[0], y), out)
    inf_x = np.where(x > 0, 0.0, D.PI[0])
    out = np.where(np.isinf(x) & np.isfinite(y), np.copysign(inf_x, y), out)
    both = np.where(x > 0, D.PI_4[0], 3 * D.PI_4[0])
    out = np.where(np.isinf(y), np.copysign(np.where(np.isinf(x), both, D.PI_2[0]), y), out)
    return np.where(np.isnan(x) | np.isnan(y), np.nan, out)


def atan2(y, x):
    """atan2(y, x) with the C99 / IEEE special cases for zeros and infinities."""
    fin = np.isfinite(y) & np.isfinite(x) & ((y != 0) | (x != 0))
    special = ~fin | (y == 0) | (x == 0)
    return D.branches(y, [(~special, _atan2_finite), (special, _atan2_special)], x)


def _one_minus_square(a):
    """1 - a*a as a pair (0 <= a <= 1)."""
    ph, pl = D.two_prod(a, a)
    dh, dl = D.two_sum(1.0, -ph)
    return D.fast_two_sum(dh, dl - pl)


def asin(x):
    """asin(x) = atan2(x, sqrt(1 - x^2)), the square root carried as a pair."""
    ax = np.where(np.abs(x) <= 1, np.abs(x), 0.0)
    sh, sl = D.dd_sqrt(*_one_minus_square(ax))
    h, l = atan2_pos_dd(ax, 0.0 * ax, sh, sl)
    out = np.copysign(h + l, x)
    out = np.where(np.abs(x) > 1, np.nan, out)
    out = np.where(x == 0, x, out)
    return np.where(np.isnan(x), x, out)


def acos(x):
    """acos(x) = atan2(sqrt(1 - x^2), x); pi - acos(|x|) for x < 0."""
    ax = np.where(np.abs(x) <= 1, np.abs(x), 0.0)
    sh, sl = D.dd_sqrt(*_one_minus_square(ax))
    h, l = atan2_pos_dd(sh, sl, ax, 0.0 * ax)
    ph, pl = D.dd_add(D.PI[0], D.PI[1], -h, -l)
    out = np.where(x < 0, ph + pl, h + l)
    out = np.where(np.abs(x) > 1, np.nan, out)
    return np.where(np.isnan(x), x, out)
