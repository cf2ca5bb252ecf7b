"""sinh, cosh, tanh, asinh, acosh, atanh, logistic and cbrt on float64 arrays, host-independent.

Built on the double-double exp / expm1 / log / log1p of `explog`: sinh = (E + E/(1+E))/2 and
tanh = E/(E+2) with E = expm1 (no cancellation near 0), cosh = (e**|x| + e**-|x|)/2,
asinh / acosh / atanh as log1p of a double-double argument, logistic = 1/(1 + e**-x).
cbrt: Newton's iteration, then one correction with the cube carried exactly.
All are within about 0.5-1 ulp in float64.
"""
from __future__ import annotations

import numpy as np

from refsim.libm import _dd as D
from refsim.libm.explog import exp_dd, expm1_dd, log1p_dd, log_dd, scale

_BIG = 22.0  # above, e**-|x| is below half an ulp of e**|x|


def _finite(x, bound):
    return np.where(np.isfinite(x), np.minimum(np.abs(x), bound), 0.0)


def _sinh_small(a):
    eh, el = expm1_dd(a)
    qh, ql = D.dd_div(eh, el, *D.dd_add(1.0, 0.0, eh, el))
    sh, sl = D.dd_add(eh, el, qh, ql)
    return 0.5 * (sh + sl)


def _half_exp(a):
    """e**a / 2, scaled in one step (no early overflow)."""
    m, th, tail = exp_dd(a)
    return scale(m - 1, th + tail)


def sinh(x):
    a = _finite(x, 800.0)
    out = np.copysign(D.branches(a, [(a < _BIG, _sinh_small), (a >= _BIG, _half_exp)]), x)
    out = np.where(np.isinf(x), x, out)
    out = np.where(x == 0, x, out)
    return np.where(np.isnan(x), x, out)


def _cosh_small(a):
    m, th, tail = exp_dd(a)
    ph, pl = D.fast_two_sum(np.ldexp(th, m), np.ldexp(tail, m))  # e**|x| (<= e**22)
    ih, il = D.dd_div(np.ones_like(ph), np.zeros_like(ph), ph, pl)
    sh, sl = D.dd_add(ph, pl, ih, il)
    return 0.5 * (sh + sl)


def cosh(x):
    a = _finite(x, 800.0)
    out = D.branches(a, [(a < _BIG, _cosh_small), (a >= _BIG, _half_exp)])
    out = np.where(np.isinf(x), np.inf, out)
    return np.where(np.isnan(x), x, out)


def tanh(x):
    a = _finite(x, _BIG)
    eh, el = expm1_dd(2.0 * a)
    dh, dl = D.dd_add(2.0, 0.0, eh, el)
    qh, ql = D.dd_div(eh, el, dh, dl)
    out = np.copysign(np.where(a < _BIG, qh + ql, 1.0), x)
    out = np.where(np.isinf(x), np.sign(x), out)
    out = np.where(x == 0, x, out)
    return np.where(np.isnan(x), x, out)


def _asinh_mid(a):
    qh, ql = D.two_prod(a, a)
    s = D.dd_sqrt(*D.dd_add(1.0, 0.0, qh, ql))
    w = D.dd_add(a, 0.0, *D.dd_div(qh, ql, *D.dd_add(1.0, 0.0, *s)))
    h, l = log1p_dd(*w)
    return h + l


def _log_2a(a):
    """log(2a) = log(a) + ln2, for a above 2**28 (where 1/a is below half an ulp of 2a)."""
    h, l = log_dd(a)
    h, l = D.dd_add(h, l, *D.LN2)
    return h + l


def asinh(x):
    """asinh(|x|) = log1p(a + a^2 / (1 + sqrt(1 + a^2))); log(2a) for huge a."""
    a = _finite(x, np.inf)
    huge = a > 2.0 ** 28
    out = np.copysign(D.branches(a, [(~huge, _asinh_mid), (huge, _log_2a)]), x)
    out = np.where(np.isinf(x), x, out)
    out = np.where(x == 0, x, out)
    return np.where(np.isnan(x), x, out)


def _acosh_near(x):
    """x in [1, 2]: log1p(d + sqrt(d (2 + d))), d = x - 1 exact."""
    d = x - 1.0
    ph, pl = D.dd_mul_d(*D.two_sum(2.0, d), d)
    sh, sl = D.dd_sqrt(ph, pl)
    h, l = log1p_dd(*D.dd_add(d, 0.0, sh, sl))
    return h + l


def _acosh_mid(x):
    """x in (2, 2**28]: log(x + sqrt(x^2 - 1))."""
    qh, ql = D.two_prod(x, x)
    rh, rl = D.dd_sqrt(*D.dd_add(qh, ql, -1.0, 0.0))
    h, l = log_dd(*D.dd_add(x, 0.0, rh, rl))
    return h + l


def acosh(x):
    xs = np.where((x >= 1) & np.isfinite(x), x, 1.0)
    near, huge = xs <= 2.0, xs > 2.0 ** 28
    out = D.branches(xs, [(near, _acosh_near), (~near & ~huge, _acosh_mid), (huge, _log_2a)])
    out = np.where(x < 1, np.nan, out)
    out = np.where(x == np.inf, np.inf, out)
    return np.where(np.isnan(x), x, out)


def atanh(x):
    """atanh(|x|) = log1p(2a / (1 - a)) / 2, the quotient carried as a pair."""
    a = np.where(np.abs(x) < 1, np.abs(x), 0.0)
    dh, dl = D.two_sum(1.0, -a)
    qh, ql = D.dd_div(2.0 * a, np.zeros_like(a), dh, dl)
    h, l = log1p_dd(qh, ql)
    out = np.copysign(0.5 * (h + l), x)
    out = np.where(np.abs(x) == 1, np.copysign(np.inf, x), out)
    out = np.where(np.abs(x) > 1, np.nan, out)
    out = np.where(x == 0, x, out)
    return np.where(np.isnan(x), x, out)


def logistic(x):
    """1 / (1 + e**-x) for x >= 0, e**x / (1 + e**x) for x < 0 (no overflow, no cancellation)."""
    a = _finite(x, 800.0)
    m, th, tail = exp_dd(-a)
    eh, el = D.fast_two_sum(scale(m, th), scale(m, tail))  # e**-|x| in (0, 1]
    dh, dl = D.dd_add(1.0, 0.0, eh, el)
    nh, nl = np.where(x < 0, eh, 1.0), np.where(x < 0, el, 0.0)
    qh, ql = D.dd_div(nh, nl, dh, dl)
    out = qh + ql
    out = np.where(x == np.inf, 1.0, out)
    out = np.where(x == -np.inf, 0.0, out)
    return np.where(np.isnan(x), x, out)


def cbrt(x):
    """Cube root: y from a linear guess and Newton's iteration on the mantissa f in [1/8, 1),
    then y + (f - y^3) / (3 y^2) with y^3 exact as a pair (exact cubes come out exact)."""
    a = np.where(np.isfinite(x) & (x != 0), np.abs(x), 1.0)
    f, e = np.frexp(a)  # a = f 2**e, f in [0.5, 1)
    e = e.astype(np.int64)
    r = np.mod(e, 3)
    f = np.ldexp(f, r - 3)  # f 2**(r-3) in [1/16, 1): cbrt of it times 2**((e - r) / 3 + 1)
    q = (e - r) // 3 + 1
    y = 0.45 + 0.6 * f
    for _ in range(6):
        y = y - (y * y * y - f) / (3.0 * y * y)
    sh, sl = D.two_prod(y, y)
    ch, cl = D.dd_mul_d(sh, sl, y)
    resid = ((f - ch) - cl)
    y = y + resid / (3.0 * y * y)
    out = np.copysign(np.ldexp(y, q), x)
    out = np.where(np.isfinite(x) & (x != 0), out, x)
    return out

