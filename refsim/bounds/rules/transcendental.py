"""Transcendental functions: the platform's accuracy (`refsim.bounds.platform`), propagated
over the operand's interval.

For a monotone function the deviation over [c - b, c + b] is the larger of |f(c -+ b) - f(c)|
(exact interval propagation); convex ones (cosh) add the interior extremum; sin and cos use
|f'(c)| b + b**2 / 2 (|f''| <= 1), at most b. Outside its domain (log of an interval
reaching 0, tan across a pole) the result is undecidable. The latitude is the table's ulps of
the compute type at the result's magnitude (plus half an ulp of a narrower output type).
"""
from __future__ import annotations

import numpy as np
import scipy.special as sp

from refsim.bounds import platform as PL
from refsim.bounds import values as V
from refsim.bounds.registry import register
from refsim.bounds.rules._common import result
from refsim.bounds.values import dtype_of


def _logistic(x):
    return sp.expit(x)


def _rsqrt(x):
    return 1.0 / np.sqrt(x)


# name: (function in float64, domain lower, domain upper, inclusive?, shape, nonneg)
# shape: "monotone", "convex_even" (minimum at 0), "trig"
_FUNCS = {
    "exp": (np.exp, -np.inf, np.inf, True, "monotone", True),
    "exp2": (np.exp2, -np.inf, np.inf, True, "monotone", True),
    "expm1": (np.expm1, -np.inf, np.inf, True, "monotone", False),
    "log": (np.log, 0.0, np.inf, False, "monotone", False),
    "log1p": (np.log1p, -1.0, np.inf, False, "monotone", False),
    "tanh": (np.tanh, -np.inf, np.inf, True, "monotone", False),
    "logistic": (_logistic, -np.inf, np.inf, True, "monotone", True),
    "erf": (sp.erf, -np.inf, np.inf, True, "monotone", False),
    "erfc": (sp.erfc, -np.inf, np.inf, True, "monotone", True),
    "erf_inv": (sp.erfinv, -1.0, 1.0, False, "monotone", False),
    "atan": (np.arctan, -np.inf, np.inf, True, "monotone", False),
    "asin": (np.arcsin, -1.0, 1.0, True, "monotone", False),
    "acos": (np.arccos, -1.0, 1.0, True, "monotone", True),
    "sinh": (np.sinh, -np.inf, np.inf, True, "monotone", False),
    "asinh": (np.arcsinh, -np.inf, np.inf, True, "monotone", False),
    "acosh": (np.arccosh, 1.0, np.inf, True, "monotone", True),
    "atanh": (np.arctanh, -1.0, 1.0, False, "monotone", False),
    "cbrt": (np.cbrt, -np.inf, np.inf, True, "monotone", False),
    "rsqrt": (_rsqrt, 0.0, np.inf, False, "monotone", True),
    "cosh": (np.cosh, -np.inf, np.inf, True, "convex_even", True),
    "sin": (np.sin, -np.inf, np.inf, True, "trig", False),
    "cos": (np.cos, -np.inf, np.inf, True, "trig", False),
    "tan": (np.tan, -np.inf, np.inf, True, "tan", False),
}


def _latitude(k, a, c, compute, dt):
    """k ulps of the compute type at magnitude `a` (``2 k`` half-ulps, `values.half_ulp`: at least
    k smallest subnormals) plus half an ulp of a narrower result type, plus the float64 center's
    own error (NumPy's float64 functions: 2 REF_U)."""
    local = 2 * k * V.half_ulp(a, compute) + 2 * V.REF_U * np.abs(c)
    if dt != compute:
        local = local + V.half_ulp(a, dt)
    return local


def _outside(v, lo, hi, inclusive):
    if inclusive:
        return (v < lo) | (v > hi)
    return (v <= lo) | (v >= hi)


def _unary(bctx, eqn, ins):
    name = eqn.primitive.name
    f, lo, hi, inclusive, shape, nonneg = _FUNCS[name]
    (x,) = ins
    dt = dtype_of(eqn.outvars[0])
    compute = np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)
    k = PL.transcendental_ulps(name, compute)
    c0 = x.center
    with V.quiet():
        c = f(c0)
        und = None
        bp = None
        if x.bound is not None:
            b = x.bound
            vlo, vhi = c0 - b, c0 + b
            und = (_outside(vlo, lo, hi, inclusive) | _outside(vhi, lo, hi, inclusive)) & (b > 0) & np.isfinite(c0)
            if shape == "monotone":
                bp = np.fmax(np.abs(f(vlo) - c), np.abs(f(vhi) - c))
            elif shape == "convex_even":
                bp = np.fmax(np.abs(f(vlo) - c), np.abs(f(vhi) - c))
                bp = np.where((vlo <= 0) & (vhi >= 0), np.fmax(bp, np.abs(c - f(0.0))), bp)
            elif shape == "trig":
                deriv = np.abs(np.cos(c0) if name == "sin" else np.sin(c0))
                bp = np.fmin(2.0, np.fmin(b, deriv * b + b * b / 2))
            else:  # tan: monotone between poles
                pole = np.floor(vlo / np.pi + 0.5) != np.floor(vhi / np.pi + 0.5)
                und = und | pole
                bp = np.fmax(np.abs(f(vlo) - c), np.abs(f(vhi) - c))
            bp = np.where((b == 0) | und, 0.0, bp)
        if shape in ("trig", "tan"):
            far = np.abs(c0) > PL.TRIG_DOMAIN
            und = far if und is None else und | far
        a = np.abs(c) if bp is None else np.abs(c) + bp
        local = _latitude(k, a, c, compute, dt)
    out = result(bctx, eqn, c, dt, local, [(bp, x)], nonneg=nonneg)
    if und is not None and V.any_of(und):
        out.bound = np.where(und, np.inf, out.bound)
    return [out]


for _name in _FUNCS:
    register(_name)(_unary)


@register("pow")
def _pow(bctx, eqn, ins):
    """x ** y for x > 0 over the operands' box: pow is monotone in each operand there, so the
    deviation is the largest at a corner; undecidable where x's interval reaches 0 or below
    (unless both operands are exact)."""
    x, y = ins
    dt = dtype_of(eqn.outvars[0])
    compute = np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)
    k = PL.transcendental_ulps("pow", compute)
    with V.quiet():
        c = np.power(x.center, y.center)
        und, bp = None, None
        if x.bound is not None or y.bound is not None:
            bx, by = x.bound_or_zero(), y.bound_or_zero()
            und = (x.center - bx <= 0) & ((bx > 0) | (by > 0))
            corners = [np.abs(np.power(x.center + sx * bx, y.center + sy * by) - c)
                       for sx in (-1, 1) for sy in (-1, 1)]
            bp = np.where(und, 0.0, np.fmax(np.fmax(corners[0], corners[1]), np.fmax(corners[2], corners[3])))
            bp = np.where((bx == 0) & (by == 0), 0.0, bp)
        a = np.abs(c) if bp is None else np.abs(c) + bp
        local = _latitude(k, a, c, compute, dt)
    terms = [(bp, x if x.bound is not None else y)]
    out = result(bctx, eqn, c, dt, local, terms, nonneg=x.nonneg)
    if und is not None and V.any_of(und):
        out.bound = np.where(und, np.inf, out.bound)
    return [out]


def _compute(dt):
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


@register("atan2")
def _atan2(bctx, eqn, ins):
    """atan2(a, b), the angle of (b, a): over the operands' box the angle is extreme at a corner
    while the box holds neither the origin nor a point of the branch cut (b <= 0, a = 0); a box
    that does is undecidable (the sign of a decides between near pi and near -pi). The platform's
    accuracy is measured on [-1e3, 1e3] per operand; beyond it the result is unbounded."""
    a, b = ins
    dt = dtype_of(eqn.outvars[0])
    compute = _compute(dt)
    k = PL.transcendental_ulps("atan2", compute)
    with V.quiet():
        c = np.arctan2(a.center, b.center)
        ba, bb = a.bound_or_zero(), b.bound_or_zero()
        far = (np.abs(a.center) + ba > 1e3) | (np.abs(b.center) + bb > 1e3)
        und, bp = None, None
        if a.bound is not None or b.bound is not None:
            moves = (ba > 0) | (bb > 0)
            a_zero = (a.center - ba <= 0) & (a.center + ba >= 0)
            # b reaching 0 counts: a zero b's sign (atan2(0, -0) is pi) is not tracked
            cut = a_zero & (b.center - bb <= 0) & moves
            und = cut | np.isnan(ba) | np.isnan(bb)
            corners = [np.abs(np.arctan2(a.center + sa * ba, b.center + sb * bb) - c)
                       for sa in (-1, 1) for sb in (-1, 1)]
            bp = np.fmax(np.fmax(corners[0], corners[1]), np.fmax(corners[2], corners[3]))
            bp = np.where(moves & ~und, bp, 0.0)
        mag = np.abs(c) if bp is None else np.abs(c) + bp
        local = _latitude(k, mag, c, compute, dt)
        terms = [(bp, a if a.bound is not None else b)]
    out = result(bctx, eqn, c, dt, local, terms)
    if V.any_of(far & np.isfinite(c)):
        out.bound = np.where(far & np.isfinite(c), np.inf, out.bound_or_zero())
    if und is not None and V.any_of(und):
        out.bound = np.where(und, np.nan, out.bound_or_zero())
    return [out]


# lgamma is convex on (0, inf) with its minimum here; digamma increases there
_LGAMMA_ARGMIN = 1.4616321449683622


def _special(bctx, eqn, ins, f, convex_min):
    """lgamma / digamma on the platform's measured domain [1e-3, 1e3] (beyond, or at x <= 0,
    unbounded): XLA:CPU holds only a mixed bound there, ``mixed * eps * max(1, |f|)`` (near the
    zeros of the function no ulp bound holds; `refsim.interpreter.accuracy`), allowed as
    ``2 * mixed + 1`` of it like the ulp table; the float64 center (SciPy's kernels) within 16
    float64 ulps of the same scale; propagation over the interval (endpoints, and lgamma's
    minimum where the interval holds it)."""
    (x,) = ins
    from refsim.interpreter.accuracy import mixed_bound

    dt = dtype_of(eqn.outvars[0])
    compute = _compute(dt)
    mixed = 2 * mixed_bound(eqn.primitive.name) + 1
    b = x.bound_or_zero()
    with V.quiet():
        c = f(x.center)
        lo, hi = x.center - b, x.center + b
        outside = ((lo < 1e-3) | (hi > 1e3)) & np.isfinite(x.center)
        bp = None
        if x.bound is not None:
            bp = np.fmax(np.abs(f(lo) - c), np.abs(f(hi) - c))
            if convex_min is not None:
                inside = (lo <= convex_min) & (hi >= convex_min)
                bp = np.where(inside, np.fmax(bp, np.abs(c - f(convex_min))), bp)
            bp = np.where((b == 0) | outside, 0.0, bp)
        scale = np.maximum(1.0, np.abs(c) if bp is None else np.abs(c) + bp)
        local = mixed * float(V.finfo(compute).eps) * scale + 16 * V.REF_U * scale
        if dt != compute:
            local = local + V.half_ulp(scale, dt)
    out = result(bctx, eqn, c, dt, local, [(bp, x)])
    if V.any_of(outside):
        out.bound = np.where(outside, np.inf, out.bound_or_zero())
    if x.bound is not None and np.isnan(x.bound).any():
        out.bound = np.where(np.isnan(np.broadcast_to(x.bound, np.shape(c))), np.nan, out.bound)
    return [out]


@register("lgamma")
def _lgamma(bctx, eqn, ins):
    return _special(bctx, eqn, ins, sp.gammaln, _LGAMMA_ARGMIN)


@register("digamma")
def _digamma(bctx, eqn, ins):
    return _special(bctx, eqn, ins, sp.psi, None)
