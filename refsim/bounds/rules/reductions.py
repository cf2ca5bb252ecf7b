"""Reductions: sums in any order and tree (Higham), max / min (exact, non-expansive),
argmax / argmin (decided where one candidate stands out), cumulative sums and maxima.

A sum of n allowed terms x~_i (each within b_i of c_i), added in any order and tree with
rounding to the result type, is within ``sum b_i + ((1 + u)**(n - 1) - 1) * sum(|c_i| + b_i)``
of ``sum c_i`` (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., Thm 4.3 /
section 4.3: any order; accumulating in a wider type only makes it smaller), plus half a
subnormal per addition and the float64 center's own ``gamma(n)`` rounding.
"""
from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np

from refsim.bounds import values as V
from refsim.bounds.registry import register
from refsim.bounds.rules._common import decided, int_rule, unreduced
from refsim.bounds.values import BVal, dtype_of
from refsim.interpreter.registry import RULES


def _dtype(eqn):
    return dtype_of(eqn.outvars[0])


def sum_latitude(n, abs_sum, center_abs_sum, dtype):
    """The latitude of summing n allowed terms whose magnitudes add to at most `abs_sum`
    (`center_abs_sum`: the centers' magnitudes, for the float64 center's own rounding)."""
    if isinstance(n, (int, np.integer)) and n > 1:
        own, tiny, ref = _sum_factors(int(n), np.dtype(dtype))
        with V.quiet():
            # the same products and sums as below (the same memory layout too), the factors
            # computed once per (n, dtype)
            return own * abs_sum + tiny + ref * center_abs_sum
    u = V.unit_roundoff(dtype)
    adds = np.maximum(np.asarray(n) - 1, 0)
    with V.quiet():
        # no addition, no latitude: an unbounded term (inf) stays unbounded, never 0 * inf = NaN
        # (which would read as undecidable)
        own = np.where(adds == 0, 0.0, V.growth(adds, u) * abs_sum)
        return own + adds * V.half_subnormal(dtype) + V.growth(n, 2.0 ** -53) * center_abs_sum


@functools.lru_cache(maxsize=1024)
def _sum_factors(n: int, dtype: np.dtype) -> tuple:
    """`sum_latitude`'s factors for a count n > 1: growth(n - 1, u), the additions' half
    subnormals, growth(n, 2**-53), as its array path computes them."""
    adds = np.maximum(np.asarray(n) - 1, 0)
    return V.growth(adds, V.unit_roundoff(dtype)), adds * V.half_subnormal(dtype), V.growth(n, 2.0 ** -53)


def lowest_bit_exponent(x) -> np.ndarray:
    """q with x = odd * 2**q per element (float64 values); +inf for zeros and non-finite values.

    Read off the float64 bit pattern: the lowest set bit of |x|'s pattern is 2**k with k < 52 the
    significand's lowest bit, or k >= 52 (a power of two, in the exponent field: its implicit bit,
    k = 52); a biased exponent E (1 for subnormals) puts bit k at 2**(E - 1075 + k)."""
    x = np.asarray(x, np.float64)
    b = x.view(np.int64) & np.int64(0x7FFF_FFFF_FFFF_FFFF)
    e = b >> 52
    low = b & -b
    k = (low.astype(np.float64).view(np.int64) >> 52) - 1023     # low is a power of two: exact
    q = (np.maximum(e, 1) - 1075 + np.minimum(k, 52)).astype(np.float64)
    return np.where((b != 0) & (e < 2047), q, np.inf)


def no_order_rounds(q_min, abs_sum, dtype) -> np.ndarray:
    """Where every partial sum of terms that are multiples of 2**q_min, with magnitudes adding to
    abs_sum, is representable in `dtype` in any order: abs_sum < 2**(q_min + p) and q_min at or
    above the dtype's smallest subnormal exponent (docs/comparison.md, SumBound's exact case)."""
    fi = V.finfo(dtype)
    p = int(fi.nmant) + 1
    q_floor = np.log2(float(fi.smallest_subnormal))
    with V.quiet():
        return np.isfinite(q_min) & (q_min >= q_floor) & (abs_sum < np.exp2(q_min + p)) | (abs_sum == 0)


@functools.lru_cache(maxsize=None)
def _exponents(dtype) -> tuple[int, int]:
    """(p, q_floor): `dtype`'s significand bits and its smallest subnormal's exponent."""
    fi = V.finfo(dtype)
    return int(fi.nmant) + 1, math.frexp(float(fi.smallest_subnormal))[1] - 1


@functools.lru_cache(maxsize=None)
def _float_max(dtype) -> float:
    return float(V.finfo(dtype).max)


#: IEEE formats whose values are exactly the k * 2**q with |k| < 2**p, q >= q_floor, up to max
_IEEE = frozenset(np.dtype(d) for d in (np.float16, np.float32, ml_dtypes.bfloat16))


def sum_no_order_rounds(terms, abs_total, axes, dtype) -> np.ndarray:
    """``no_order_rounds(min of lowest_bit_exponent(terms) over axes, abs_total, dtype)`` for a sum of
    `terms` (float64) over `axes` whose magnitudes add up to `abs_total` (float64, np.sum's), in
    fewer passes. With ``abs_total = m * 2**e`` (frexp) and ``t = max(e - p, q_floor)``, a row with
    0 < abs_total < inf passes exactly where every term is a multiple of 2**t (abs_total <
    2**(q_min + p) iff q_min >= e - p): where each term / 2**t is an integer. Such terms add up
    exactly in float64 in any order (every partial sum is a multiple of 2**t below 2**(t + p)), so
    abs_total is k * 2**t with k < 2**p: a value of `dtype` unless past its max. Where no row's
    abs_total is (float16, bfloat16, float32), the per-term test is skipped."""
    p, q_floor = _exponents(dtype)
    ac = np.asarray(abs_total, np.float64)
    zero = ac == 0
    dt = np.dtype(dtype)
    with V.quiet():
        # no nonzero magnitude sum is a value of dt (the zero ones all are) and none is past its max
        if (dt in _IEEE and np.count_nonzero(ac.astype(dt) == ac) == np.count_nonzero(zero)
                and not np.maximum.reduce(ac, axis=None, initial=0.0) > _float_max(dt)):
            return zero
        t = np.maximum(np.frexp(ac)[1] - p, q_floor)
        live = np.isfinite(ac) & ~zero
        t = np.expand_dims(np.where(live, t, 0), axes)     # 0 elsewhere: the cheap branches below
        if np.min(t, initial=0) >= -1023:
            y = terms * np.ldexp(1.0, -t)                  # exact where terms is a multiple of 2**t
        else:
            y = np.ldexp(terms, -t)                        # 2**-t is no float64
        ok = y == np.trunc(y)
        if np.max(t, initial=0) >= 1:
            # a nonzero |term| below 2**(t - 1074) (no multiple of 2**t) scales to 0: not a multiple
            ok &= (y != 0) | (terms == 0)
        return zero | (live & np.logical_and.reduce(ok, axis=axes))


def _dominant_reduced(bctx, eqn, x, axes, total_prop, local):
    """explain mode: per result element, this op where its latitude is the larger part, else the
    dominating op of the operand element with the largest bound."""
    if not bctx.explain:
        return None
    full = np.nan_to_num(x.full_bound(), nan=np.inf)
    dom = np.broadcast_to(x.dom if x.dom is not None else np.int32(-1), full.shape)
    moved = np.moveaxis(full, axes, range(-len(axes), 0))       # the reduced axes last, the kept ones in order
    moved = moved.reshape(moved.shape[:moved.ndim - len(axes)] + (-1,))
    dmoved = np.moveaxis(dom, axes, range(-len(axes), 0)).reshape(moved.shape)
    pick = np.take_along_axis(dmoved, np.argmax(moved, axis=-1)[..., None], axis=-1)[..., 0]
    me = bctx.op_id(eqn)
    return np.where(np.nan_to_num(local, nan=np.inf) >= np.nan_to_num(total_prop, nan=np.inf), me, pick).astype(np.int32)


def _sum(a, axes):
    """np.sum(a, axis=axes): for an ndarray, np.add.reduce without np.sum's wrapper."""
    return np.add.reduce(a, axis=axes) if type(a) is np.ndarray else np.sum(a, axis=axes)


@register("reduce_sum")
def _reduce_sum(bctx, eqn, ins):
    (x,) = ins
    dt = _dtype(eqn)
    axes = tuple(bctx.nm + a for a in eqn.params["axes"])
    if not V.is_float(dt):
        out = RULES["reduce_sum"](bctx.rule_context(), x.center, **eqn.params)
        b = None if x.bound is None else np.sum(x.full_bound(), axis=axes)
        return [BVal(out, b, dt)]
    n = math.prod(np.shape(x.center)[a] for a in axes)
    with V.quiet():
        c = _sum(x.center, axes)
        ac = _sum(np.abs(x.center), axes)
        prop = None if x.bound is None else _sum(x.full_bound(), axes)
        local = sum_latitude(n, ac if prop is None else ac + prop, ac, dt)
        if prop is None:
            # exact terms that no order of additions can round: the exact sum, bound 0
            exact = sum_no_order_rounds(x.center, ac, axes, dt)
            if V.any_of(exact):
                c = np.where(exact, c, c)
                local = np.where(exact, 0.0, local)
        bound = local if prop is None else prop + local
    dom = _dominant_reduced(bctx, eqn, x, axes, prop if prop is not None else 0.0, local)
    out = BVal(c, bound, dt, x.nonneg, dom)
    if unreduced(eqn.outvars[0]):
        # the devices' partial sums are added later, maybe after `add` / `sub` with another
        # unreduced sum (arith's rule): the terms it stands for, kept for that
        out.partial_terms = (n, ac if prop is None else ac + prop, ac, 0.0 if prop is None else prop)
    return [out]


@register("reduce_max", "reduce_min")
def _reduce_maxmin(bctx, eqn, ins):
    (x,) = ins
    dt = _dtype(eqn)
    c = RULES[eqn.primitive.name](bctx.rule_context(), x.center, **eqn.params)
    axes = tuple(bctx.nm + a for a in eqn.params["axes"])
    tag = (x.root(), axes)
    if x.bound is None:
        return [BVal(c, None, dt, x.nonneg, extreme=tag)]
    full = x.full_bound()
    if full.size == 0:
        return [BVal(c, None, dt, x.nonneg)]
    with V.quiet():
        b = np.max(full, axis=axes)     # NaN propagates: undecidable
    dom = _dominant_reduced(bctx, eqn, x, axes, b, np.zeros_like(b)) if bctx.explain else None
    return [BVal(c, b, dt, x.nonneg, dom, extreme=tag)]


@register("reduce_and", "reduce_or", "reduce_xor")
def _reduce_bits(bctx, eqn, ins):
    (x,) = ins
    c = RULES[eqn.primitive.name](bctx.rule_context(), x.center, **eqn.params)
    if x.bound is None:
        return [BVal(c, None, _dtype(eqn))]
    axes = tuple(bctx.nm + a for a in eqn.params["axes"])
    return [BVal(c, np.max(x.full_bound(), axis=axes) if x.full_bound().size else None, _dtype(eqn))]


@register("argmax", "argmin")
def _arg(bctx, eqn, ins):
    """Decided where exactly one element can be the extremum (or the candidates are exact ties,
    of which the first wins): the extremum's lower end clears every other upper end."""
    (x,) = ins
    dt = _dtype(eqn)
    c = RULES[eqn.primitive.name](bctx.rule_context(), x.center, **eqn.params)
    if x.bound is None:
        return [BVal(c, None, dt)]
    ax = bctx.nm + eqn.params["axes"][0]
    sgn = 1.0 if eqn.primitive.name == "argmax" else -1.0
    with V.quiet():
        v = sgn * x.center
        b = x.full_bound()
        lower = np.max(v - b, axis=ax, keepdims=True)
        cand = (v + b >= lower)
        count = np.sum(cand, axis=ax)
        exact_tie = np.all(~cand | ((b == 0) & (v == np.max(np.where(cand, v, -np.inf), axis=ax, keepdims=True))),
                           axis=ax)
        und = ((count > 1) & ~exact_tie) | np.any(np.isnan(b), axis=ax)
    return [BVal(c, decided(und, np.shape(c)), dt)]


@register("cumsum")
def _cumsum(bctx, eqn, ins):
    (x,) = ins
    dt = _dtype(eqn)
    if not V.is_float(dt):
        return [int_rule(bctx, eqn, ins)]
    ax = bctx.nm + eqn.params["axis"]
    rev = eqn.params["reverse"]

    def scan(a):
        a = np.flip(a, ax) if rev else a
        out = np.cumsum(a, axis=ax)
        return np.flip(out, ax) if rev else out

    shape = np.shape(x.center)
    n = np.arange(1, shape[ax] + 1, dtype=np.float64)
    if rev:
        n = n[::-1]
    n = n.reshape((-1,) + (1,) * (len(shape) - ax - 1))
    with V.quiet():
        c = scan(x.center)
        ac = scan(np.abs(x.center))
        prop = None if x.bound is None else scan(x.full_bound())
        local = sum_latitude(n, ac if prop is None else ac + prop, ac, dt)
    return [BVal(c, local if prop is None else prop + local, dt, x.nonneg)]


@register("cummax", "cummin")
def _cummax(bctx, eqn, ins):
    (x,) = ins
    dt = _dtype(eqn)
    c = RULES[eqn.primitive.name](bctx.rule_context(), x.center, **eqn.params)
    if x.bound is None:
        return [BVal(c, None, dt, x.nonneg)]
    ax = bctx.nm + eqn.params["axis"]
    rev = eqn.params["reverse"]
    b = x.full_bound()
    b = np.flip(b, ax) if rev else b
    with V.quiet():
        b = np.fmax.accumulate(b, axis=ax) + np.where(np.logical_or.accumulate(np.isnan(b), axis=ax), np.nan, 0.0)
    return [BVal(c, np.flip(b, ax) if rev else b, dt, x.nonneg)]


# -- products: reduce_prod, cumprod (scatter-mul in `scatters`) ------------------------------------
def product_latitude(bctx, n, center, mag, mag_one, dtype):
    """The bound of a product of n allowed factors in any order and tree, each x~_i within b_i of
    c_i: ``mag = prod(|c_i| + b_i)``, ``mag_one = prod(max(1, |c_i| + b_i))``, `center` the float64
    product of the c_i. The factors' latitude ``prod(|c_i| + b_i) - prod |c_i|`` (exact interval
    product), ``(1 + u)**(n - 1) - 1`` of `mag` for the n - 1 roundings in any tree (each
    multiplies the product by (1 + d), |d| <= u), and per multiplication an absolute error of half a
    subnormal (of the flush threshold where subnormals may be flushed) times at most the product of
    the other factors (<= mag_one); the float64 products' own rounding (gamma(n) of 2**-53). An
    intermediate that may overflow (mag_one past the overflow threshold) is unbounded."""
    u = V.unit_roundoff(dtype)
    g = V.growth(np.asarray(n, np.float64), 2.0 ** -53)
    mults = np.maximum(np.asarray(n, np.float64) - 1, 0)
    tiny = V.half_subnormal(dtype)
    if bctx.allows("xla-cpu-ftz"):
        tiny = V.flush_threshold(dtype)
        bctx.widened()
    with V.quiet():
        ac = np.abs(center)
        prop = np.maximum(mag - ac, 0.0) + g * (mag + ac)
        local = (np.where(mults == 0, 0.0, V.growth(mults, u) * mag * (1 + g))
                 + mults * tiny * mag_one * (1 + V.growth(mults + 1, u)) + g * ac)
        out = prop + local
        return np.where(np.isfinite(mag_one) & (mag_one < V.overflow_threshold(dtype)), out, np.inf)


@register("reduce_prod")
def _reduce_prod(bctx, eqn, ins):
    (x,) = ins
    dt = _dtype(eqn)
    if not V.is_float(dt):
        return [int_rule(bctx, eqn, ins)]
    axes = tuple(bctx.nm + a for a in eqn.params["axes"])
    n = math.prod(np.shape(x.center)[a] for a in axes)
    with V.quiet():
        m = np.abs(x.center) + x.bound_or_zero()
        c = np.prod(x.center, axis=axes)
        mag = np.prod(np.broadcast_to(m, np.shape(x.center)), axis=axes)
        mag_one = np.prod(np.broadcast_to(np.maximum(m, 1.0), np.shape(x.center)), axis=axes)
        b = product_latitude(bctx, n, c, mag, mag_one, dt)
        if x.bound is not None:
            b = np.where(np.any(np.isnan(x.full_bound()), axis=axes), np.nan, b)
    return [BVal(c, b, dt, x.nonneg)]


def _scan_along(a, ax, rev, fn):
    a = np.flip(a, ax) if rev else a
    out = fn(a, axis=ax)
    return np.flip(out, ax) if rev else out


def _counts(shape, ax, rev):
    n = np.arange(1, shape[ax] + 1, dtype=np.float64)
    if rev:
        n = n[::-1]
    return n.reshape((-1,) + (1,) * (len(shape) - ax - 1))


@register("cumprod")
def _cumprod(bctx, eqn, ins):
    """Each prefix is a product of its factors in any tree (`product_latitude`)."""
    (x,) = ins
    dt = _dtype(eqn)
    if not V.is_float(dt):
        return [int_rule(bctx, eqn, ins)]
    ax, rev = bctx.nm + eqn.params["axis"], eqn.params["reverse"]
    shape = np.shape(x.center)
    with V.quiet():
        m = np.abs(x.center) + x.full_bound()
        c = _scan_along(x.center, ax, rev, np.cumprod)
        mag = _scan_along(m, ax, rev, np.cumprod)
        mag_one = _scan_along(np.maximum(m, 1.0), ax, rev, np.cumprod)
        b = product_latitude(bctx, _counts(shape, ax, rev), c, mag, mag_one, dt)
        if x.bound is not None:
            b = np.where(_scan_along(np.isnan(x.full_bound()), ax, rev, np.logical_or.accumulate), np.nan, b)
    return [BVal(c, b, dt, x.nonneg)]


@register("cumlogsumexp")
def _cumlogsumexp(bctx, eqn, ins):
    """JAX lowers cumlogsumexp to a reduce_window of `logaddexp` (jax._src.lax.other: ``max(x, y) +
    log1p(exp(-|x - y|))``), a tree of m - 1 combines for a prefix of m. Exact logaddexp is
    1-Lipschitz in the max norm, so a node's error is at most its children's largest plus its own:
    the prefix's largest operand bound plus m times one combine's latitude (the -inf init is one). One combine,
    with every partial result within A = max |x_i| + b_i + log m: the rounded difference (half
    an ulp at 2A, through a derivative below 1), exp of a value <= 0 (the platform's ulps at 1 and
    a rounding to the result type), log1p of a value <= 1 (its ulps at log 2, a rounding), the
    final add (half an ulp at A), and a flushed exp (the flush threshold)."""
    from refsim.bounds import platform as PL

    (x,) = ins
    dt = _dtype(eqn)
    ax, rev = bctx.nm + eqn.params["axis"], eqn.params["reverse"]
    shape = np.shape(x.center)
    compute = np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)
    k_exp, k_log1p = PL.transcendental_ulps("exp", compute), PL.transcendental_ulps("log1p", compute)
    m = _counts(shape, ax, rev)
    with V.quiet():
        c = _scan_along(x.center, ax, rev, np.logaddexp.accumulate)
        fb = x.full_bound()
        prop = _scan_along(fb, ax, rev, np.fmax.accumulate)
        nan = _scan_along(np.isnan(fb), ax, rev, np.logical_or.accumulate)
        big = _scan_along(np.where(np.isfinite(x.center), np.abs(x.center), 0.0) + np.nan_to_num(fb, nan=0.0),
                          ax, rev, np.fmax.accumulate) + np.log(m)
        narrow = 0.0 if dt == compute else 1.0
        step = (V.half_ulp(2 * big, dt)
                + 2 * k_exp * V.half_ulp(1.0, compute) + narrow * V.half_ulp(1.0, dt)
                + 2 * k_log1p * V.half_ulp(np.log(2.0), compute) + narrow * V.half_ulp(np.log(2.0), dt)
                + V.half_ulp(big, dt) + V.flush_threshold(dt))
        local = m * step + 4 * m * V.REF_U * big     # m combines: the window's -inf init is one more
        b = np.where(nan, np.nan, prop + local)
    return [BVal(c, b, dt)]
