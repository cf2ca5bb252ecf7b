"""IEEE-exact arithmetic, comparisons, selection, conversions (StableHLO: add, subtract,
multiply, divide, sqrt and convert are IEEE 754's correctly rounded operations).

Each rule computes the center in float64 and the bound from the operands' bounds by the
operation's local derivatives, with the second-order terms (a*b's ``ba*bb``, division's
shrinking denominator) kept so the bound is an interval bound, plus the operation's own
latitude: half an ulp of the result dtype (`_common.rounding`). max, min, neg, abs, clamp
and select are exact and non-expansive: the bound of the result is the largest operand bound.
Comparisons, sign and rounding to integers are decided where the operands' allowed sets do
not straddle the decision, else undecidable (NaN bound).
"""
from __future__ import annotations

import numpy as np

from refsim.bounds import platform as PL
from refsim.bounds import values as V
from refsim.bounds.registry import register
from refsim.bounds.rules._common import decided, int_rule, result, rounded, rounding, unreduced
from refsim.bounds.values import BVal, dtype_of
from refsim.interpreter.registry import RULES


def _out_dtype(eqn, k=0):
    return dtype_of(eqn.outvars[k])


def sp(x, y):
    """x * y with 0 wherever either is 0 (an infinite center times a zero bound is 0, not NaN);
    None when either is None."""
    if x is None or y is None:
        return None
    with V.quiet():
        r = x * y
        if not V.nan_sum(r):                # no 0 * inf in it (and no NaN): the product as it is
            return r
        return np.where((x == 0) | (y == 0), 0.0, r)


def _same_var(eqn) -> bool:
    a, b = eqn.invars[0], eqn.invars[1]
    return a is b and not hasattr(a, "val")


@register("add", "add_any", "sub")
def _add(bctx, eqn, ins):
    a, b = ins
    dt = _out_dtype(eqn)
    if not V.is_float(dt):
        return [int_rule(bctx, eqn, ins)]
    with V.quiet():
        c = a.center - b.center if eqn.primitive.name == "sub" else a.center + b.center
    nonneg = eqn.primitive.name != "sub" and a.nonneg and b.nonneg
    if unreduced(eqn.outvars[0]):
        return [_unreduced_sum(bctx, eqn, a, b, c, dt, nonneg)]
    folded = None
    # a scatter-add into zeros is known by its terms, not its origin: one made of constants only is
    # marked "constant" by the walk (XLA may fold it into one), yet XLA may fold the add into it instead
    if eqn.primitive.name != "sub" and (a.scatter_terms is not None or b.scatter_terms is not None) \
            and bctx.allows("xla-scatter-add-folding"):
        folded = _folded_scatter(bctx, eqn, a, b, dt)
    if a.bound is None and b.bound is None and folded is None:
        return [BVal(rounded(c, dt), None, dt, nonneg)]
    bp = V.add_bounds(a.bound, b.bound)
    local = V.add_bounds(rounding(c, bp, dt), folded)
    return [result(bctx, eqn, c, dt, local, [(a.bound, a), (b.bound, b)], nonneg=nonneg)]


def _unreduced_sum(bctx, eqn, a, b, c, dt, nonneg):
    """`a ± b` of unreduced values: each device adds (subtracts) its own partial values, and the
    later reduction adds the devices' results, so the value is one sum of both operands' terms
    (negated for `sub`) in an order of additions no rule fixes: Higham's latitude for all of them,
    not the two sums' latitudes and a rounding (too tight: the devices round their partial
    results, jax 0.12's unreduced `sub` under vjp on a 3-device mesh). Undecidable where an operand
    is an unreduced value whose terms the walk does not know (one no unreduced `reduce_sum` made)."""
    from refsim.bounds.rules.reductions import sum_latitude

    parts = [x.partial_terms for x in (a, b)]
    if any(t is None for t in parts):
        return BVal(c, np.full(np.shape(c), np.nan), dt, nonneg)
    (na, aa, ca, pa), (nb, ab, cb, pb) = parts
    n = na + nb
    with V.quiet():
        absum, cabs, prop = aa + ab, ca + cb, pa + pb
        bound = prop + sum_latitude(n, absum, cabs, dt)
    out = BVal(c, np.broadcast_to(bound, np.shape(c)), dt, nonneg,
               np.broadcast_to(np.int32(bctx.op_id(eqn)), np.shape(c)) if bctx.explain else None)
    out.partial_terms = (n, absum, cabs, prop)
    return out


def _folded_scatter(bctx, eqn, a, b, dt):
    """xla-scatter-add-folding: where one addend is a scatter-add into zeros, XLA may compute the
    sum as the scatter-add into the other addend, so an element's 1 + k terms (the other addend
    and its k updates) are summed in another order: Higham's latitude for them (None elsewhere)."""
    from refsim.bounds.rules.reductions import sum_latitude

    extra = None
    for s, other in ((a, b), (b, a)):
        if s.scatter_terms is None:
            continue
        count, mags = s.scatter_terms
        if not V.any_of(count > 0):
            continue
        with V.quiet():
            oabs = np.abs(other.center) + other.bound_or_zero()
            lat = np.where(count > 0, sum_latitude(count + 1.0, oabs + mags, np.abs(other.center) + mags, dt), 0.0)
        extra = V.add_bounds(extra, lat)
        bctx.note("xla-scatter-add-folding", eqn)
    return extra


@register("mul")
def _mul(bctx, eqn, ins):
    a, b = ins
    dt = _out_dtype(eqn)
    if not V.is_float(dt):
        return [int_rule(bctx, eqn, ins)]
    ca, cb = a.center, b.center
    if a.bound is None and b.bound is None:
        nonneg = (a.nonneg and b.nonneg) or _same_var(eqn)
        with V.quiet():
            c = rounded(ca * cb, dt)
            fused = None
            if bctx.allows("xla-cpu-fma") and np.dtype(dt) in (np.dtype(np.float32), np.dtype(np.float64)):
                # contracted into a fused multiply-add, the product reaches the addition unrounded
                exact = np.dtype(dt) == np.dtype(np.float32)
                fused = np.abs(c - ca * cb) if exact else V.half_ulp(np.abs(c), dt)
                fused = np.where(np.isfinite(c), fused, 0.0)
                if not V.any_of(fused > 0):
                    fused = None
                else:
                    bctx.note("xla-cpu-fma", eqn)
        return [BVal(c, fused, dt, nonneg)]
    with V.quiet():
        c = ca * cb
        ta = sp(np.abs(cb), a.bound)
        tb = V.add_bounds(sp(np.abs(ca), b.bound), sp(a.bound, b.bound))
        bp = V.add_bounds(ta, tb)
        local = rounding(c, bp, dt)
        # an infinity times a zero that may not be zero: NaN or an infinity (the center is NaN there)
        und = None
        nan_center = V.nan_sum(c)
        if nan_center and b.bound is not None:
            und = np.isinf(ca) & (cb == 0) & (b.bound > 0)
        if nan_center and a.bound is not None:
            m = np.isinf(cb) & (ca == 0) & (a.bound > 0)
            und = m if und is None else und | m
    out = result(bctx, eqn, c, dt, local, [(ta, a), (tb, b)],
                 nonneg=(a.nonneg and b.nonneg) or _same_var(eqn))
    if und is not None and V.any_of(und):
        out.bound = np.where(und, np.inf, out.bound)
    return [out]


def _power_of_two(x) -> np.ndarray:
    with V.quiet():
        m, _ = np.frexp(x)
    return np.abs(m) == 0.5


@register("div")
def _div(bctx, eqn, ins):
    a, b = ins
    dt = _out_dtype(eqn)
    if not V.is_float(dt):
        return [int_rule(bctx, eqn, ins)]
    ca, cb = a.center, b.center
    with V.quiet():
        c = ca / cb
        acb = np.abs(cb)
        und = None
        if b.bound is None:
            ta, tb = (None if a.bound is None else np.where(a.bound == 0, 0.0, a.bound / acb)), None
        else:
            denom = acb - b.bound
            und = denom <= 0
            denom = np.where(und, np.inf, denom)
            ta = None if a.bound is None else np.where(a.bound == 0, 0.0, a.bound / denom)
            tb = sp(np.abs(c), b.bound) / denom
        if a.bound is not None:
            m = (cb == 0) & (a.bound > 0)
            und = m if und is None else und | m
        bp = V.add_bounds(ta, tb)
        local = rounding(c, bp, dt)
        if a.bound is None and b.bound is None:
            c, local = rounded(c, dt), None        # exact operands: one correctly rounded quotient
        extra = None
        # a divisor of fewer elements than the quotient is broadcast too: JAX's div takes operands
        # that differ in size-1 dimensions (jnp's a / b of shapes (..., 5) and (..., 1)), which XLA
        # lowers as a broadcast_in_dim of the divisor, and then rewrites A / Broadcast(B)
        broadcast = b.origin in ("constant", "broadcast") or np.size(cb) < np.size(c)
        if broadcast and bctx.allows("xla-reciprocal-division"):
            inexact = ~_power_of_two(cb)
            if V.any_of(inexact & np.isfinite(c)):
                # x * fl(1/k): the reciprocal's rounding (u relative) and a product that may round
                # in the next binade up: u * a + half an ulp at a
                mag = np.abs(c) if bp is None else np.abs(c) + bp
                extra = np.where(inexact, V.unit_roundoff(dt) * mag + V.half_ulp(mag, dt), 0.0)
                bctx.note("xla-reciprocal-division", eqn)
        elif b.origin == "sqrt" and bctx.allows("xla-rsqrt-division"):
            k = PL.transcendental_ulps("rsqrt", np.float64 if np.dtype(dt) == np.float64 else np.float32) or 0
            extra = 2 * k * V.unit_roundoff(np.float64 if np.dtype(dt) == np.float64 else np.float32) * (
                np.abs(c) if bp is None else np.abs(c) + bp)
            bctx.note("xla-rsqrt-division", eqn)
        if "div" in (a.origin, b.origin) and bctx.allows("xla-division-reassociation") \
                and V.any_of(np.isfinite(c) & (c != 0)):
            # (A / B) / C as A / fl(B * C), A / (B / C) as fl(A * C) / B: the inner quotient this walk
            # rounded (u relative) is exact there, the product rounds (u relative), and the one
            # quotient rounds to a value other than this walk's last rounding (half an ulp)
            mag = np.abs(c) if bp is None else np.abs(c) + bp
            extra = V.add_bounds(extra, np.where(np.isfinite(c) & (c != 0),
                                                 2 * V.unit_roundoff(dt) * mag + V.half_ulp(mag, dt), 0.0))
            bctx.note("xla-division-reassociation", eqn)
        local = V.add_bounds(local, extra)
    out = result(bctx, eqn, c, dt, local, [(ta, a), (tb, b)], nonneg=a.nonneg and b.nonneg, origin="div")
    if und is not None and V.any_of(und):
        out.bound = np.where(und, np.inf, out.bound)
    return [out]


@register("neg")
def _neg(bctx, eqn, ins):
    (x,) = ins
    if not V.is_float(x.dtype):
        return [int_rule(bctx, eqn, ins)]
    return [BVal(-x.center, x.bound, x.dtype, False, x.dom, x.origin)]


@register("abs")
def _abs(bctx, eqn, ins):
    (x,) = ins
    if not V.is_float(x.dtype):
        return [int_rule(bctx, eqn, ins)]
    return [BVal(np.abs(x.center), x.bound, x.dtype, True, x.dom, x.origin)]


def _max_of(bctx, eqn, center, dtype, operands, nonneg=False):
    """A non-expansive result: its bound is the largest operand bound, elementwise."""
    bound = V.max_bounds(*[x.bound for x in operands])
    dom = None
    if bctx.explain and bound is not None:
        shape = np.shape(center)
        bs = np.stack([np.broadcast_to(np.nan_to_num(x.bound_or_zero(), nan=np.inf), shape) for x in operands])
        ds = [np.broadcast_to(x.dom if x.dom is not None else np.int32(-1), shape) for x in operands]
        dom = np.choose(np.argmax(bs, axis=0), [np.asarray(d, np.int32) for d in ds])
    if bound is not None:
        bound = np.broadcast_to(bound, np.shape(center))
    return BVal(center, bound, np.dtype(dtype), nonneg, dom)


@register("max", "min")
def _maxmin(bctx, eqn, ins):
    dt = _out_dtype(eqn)
    if not V.is_float(dt):
        return [int_rule(bctx, eqn, ins)]
    c = RULES[eqn.primitive.name](bctx.rule_context(), *[x.center for x in ins])
    a, b = ins
    ident = -np.inf if eqn.primitive.name == "max" else np.inf
    for x, y in ((a, b), (b, a)):
        # max(-inf, y) is y, min(+inf, y) is y, bit for bit: a copy of y (its comparisons with y decided)
        if x.bound is None and np.all(x.center == ident) and np.shape(c) == np.shape(y.center):
            return [BVal(y.center, y.bound, y.dtype, y.nonneg, y.dom, y.origin, y.extreme, y.root())]
    nonneg = (a.nonneg or b.nonneg) if eqn.primitive.name == "max" else (a.nonneg and b.nonneg)
    return [_max_of(bctx, eqn, c, dt, ins, nonneg)]


@register("clamp")
def _clamp(bctx, eqn, ins):
    dt = _out_dtype(eqn)
    if not V.is_float(dt):
        return [int_rule(bctx, eqn, ins)]
    c = RULES["clamp"](bctx.rule_context(), *[x.center for x in ins])
    return [_max_of(bctx, eqn, c, dt, ins, ins[0].nonneg or ins[1].nonneg)]


@register("sign")
def _sign(bctx, eqn, ins):
    (x,) = ins
    if not V.is_float(x.dtype):
        return [int_rule(bctx, eqn, ins)]
    c = np.sign(x.center)
    b = x.bound
    if b is None:
        return [BVal(c, None, x.dtype)]
    with V.quiet():
        und = ~(np.abs(x.center) > b) & ~((x.center == 0) & (b == 0))
    und |= np.isnan(b)
    return [BVal(c, decided(und & ~np.isnan(x.center), np.shape(c)), x.dtype)]


def _to_integer(bctx, eqn, ins, fn):
    """floor / ceil / round: decided where every allowed operand rounds to the same integer."""
    (x,) = ins
    if not V.is_float(x.dtype):
        return [int_rule(bctx, eqn, ins)]
    c = RULES[eqn.primitive.name](bctx.rule_context(), x.center, **eqn.params)
    if x.bound is None:
        return [BVal(c, None, x.dtype)]
    with V.quiet():
        lo, hi = fn(x.center - x.bound), fn(x.center + x.bound)
        und = (lo != hi) & np.isfinite(x.center)
    und |= np.isnan(x.bound)
    return [BVal(c, decided(und, np.shape(c)), x.dtype)]


@register("floor")
def _floor(bctx, eqn, ins):
    return _to_integer(bctx, eqn, ins, np.floor)


@register("ceil")
def _ceil(bctx, eqn, ins):
    return _to_integer(bctx, eqn, ins, np.ceil)


@register("round")
def _round(bctx, eqn, ins):
    method = int(eqn.params.get("rounding_method", 0))
    fn = np.rint if method == 1 else (lambda v: np.trunc(v + np.copysign(0.5, v)))
    return _to_integer(bctx, eqn, ins, fn)


@register("is_finite")
def _is_finite(bctx, eqn, ins):
    (x,) = ins
    c = np.isfinite(x.center)
    return [BVal(c, decided(V.undecidable(x.bound), np.shape(c)) if x.bound is not None else None, np.dtype(bool))]


@register("eq", "ne", "lt", "le", "gt", "ge")
def _compare(bctx, eqn, ins):
    a, b = ins
    c = RULES[eqn.primitive.name](bctx.rule_context(), a.center, b.center)
    if not V.is_float(a.dtype):
        return [int_rule(bctx, eqn, ins, dtype=bool)]
    if a.bound is None and b.bound is None:
        return [BVal(c, None, np.dtype(bool))]
    if _same_var(eqn) or _same_value(a, b):
        und = V.undecidable(a.bound) | V.undecidable(b.bound)
    elif _extreme_pair(a, b) is not None:
        und = _extreme_undecided(*_extreme_pair(a, b))
    else:
        with V.quiet():
            tot = V.add_bounds(a.bound, b.bound)
            gap = np.abs(a.center - b.center)
            known = (gap > tot) | (tot == 0) | ~np.isfinite(gap)
            und = ~known | np.isnan(tot)
    return [BVal(c, decided(und, np.shape(c)), np.dtype(bool))]


def _extreme_pair(a, b):
    """(operand, its extremum, axes) when one side is the other's reduce_max / reduce_min."""
    if b.extreme is not None and b.extreme[0] is a.root():
        return a, b, b.extreme[1]
    if a.extreme is not None and a.extreme[0] is b.root():
        return b, a, a.extreme[1]
    return None


def _same_value(a, b) -> bool:
    """True when a and b are one value in every implementation: copies of one value, or the same
    extremum (max or min over the same axes) of one value."""
    if a.root() is b.root():
        return True
    return (a.extreme is not None and b.extreme is not None and a.extreme[0] is b.extreme[0]
            and a.extreme[1] == b.extreme[1] and np.array_equal(a.center, b.center))


def _extreme_undecided(x, m, axes):
    """Comparing x with its own extremum m (broadcast): an element whose allowed set overlaps the
    extremum's is decided when it is the only such element of its group (it is then the extremum,
    bit for bit, in every implementation); exact ties (zero bounds) are decided too."""
    with V.quiet():
        tot = V.add_bounds(x.bound, m.bound)
        tot = np.zeros(()) if tot is None else tot
        cand = np.abs(x.center - m.center) <= tot
        count = np.sum(np.broadcast_to(cand, np.shape(x.center)), axis=axes, keepdims=True)
        tie_exact = np.all(np.broadcast_to(~cand | (tot == 0), np.shape(x.center)), axis=axes, keepdims=True)
        und = cand & (count > 1) & ~tie_exact
    return und | np.isnan(tot)


@register("select_n")
def _select_n(bctx, eqn, ins):
    """select_n: the chosen case's allowed set; where the predicate is undecidable, the union
    of the cases' sets when they overlap the chosen one's, else undecidable."""
    pred, cases = ins[0], ins[1:]
    ctx = bctx.rule_context()
    rule = RULES["select_n"]
    c = rule(ctx, pred.center, *[x.center for x in cases])
    shape = np.shape(c)
    dt = _out_dtype(eqn)
    b = None
    if any(x.bound is not None for x in cases):
        b = rule(ctx, pred.center, *[x.full_bound() for x in cases])
    dom = None
    if bctx.explain and any(x.dom is not None for x in cases):
        ds = [np.broadcast_to(x.dom if x.dom is not None else np.int32(-1), np.shape(x.center)) for x in cases]
        dom = np.asarray(rule(ctx, pred.center, *[d.astype(np.int64) for d in ds])).astype(np.int32)
    pu = V.undecidable(pred.bound)
    if V.any_of(pu):
        with V.quiet():
            bc = np.broadcast_to(0.0 if b is None else b, shape)
            union = bc
            overlap = np.ones(shape, bool)
            for x in cases:
                d = np.abs(np.broadcast_to(x.center, shape) - c)
                if not V.is_float(dt):
                    d = np.where(np.broadcast_to(x.center, shape) == c, 0.0, np.inf)
                bx = np.broadcast_to(x.bound_or_zero(), shape)
                union = np.fmax(union, d + bx)
                overlap &= d <= bx + bc
            b = np.where(pu, np.where(overlap, union, np.nan), bc)
    nonneg = all(x.nonneg for x in cases)
    return [BVal(c, b, np.dtype(dt), nonneg, dom)]


def _pow_chain(y: int) -> int:
    """Multiplications in JAX's square-and-multiply evaluation of x ** |y|."""
    n = abs(int(y))
    return max(n.bit_length() - 1, 0) + max(bin(n).count("1") - 1, 0)


def _interval_deviation(f, c, b, extra_points=(), fc=None, ends=None):
    """max |f(v) - f(c)| over v in {c - b, c + b, *extra_points} (each point only where given);
    `fc` and `ends` (c - b, c + b): where the caller has them already (for pow, f is the costly
    part: one libm call an element)."""
    with V.quiet():
        fc = f(c) if fc is None else fc
        lo, hi = (c - b, c + b) if ends is None else ends
        dev = np.fmax(np.abs(f(lo) - fc), np.abs(f(hi) - fc))
        for inside, v in extra_points:
            dev = np.where(inside, np.fmax(dev, np.abs(f(v) - fc)), dev)
    return dev


@register("integer_pow")
def _integer_pow(bctx, eqn, ins):
    """x ** y as JAX lowers it (square-and-multiply: m multiplications, then 1 / for y < 0):
    relative latitude (1 + u)**m - 1, plus the division's; propagation over the interval."""
    (x,) = ins
    y = int(eqn.params["y"])
    dt = _out_dtype(eqn)
    if not V.is_float(dt):
        return [int_rule(bctx, eqn, ins)]
    if y == 0:
        return [BVal(np.ones_like(x.center), None, dt)]
    if y == 1:
        return [x]
    with V.quiet():
        c = np.power(x.center, float(y))
        bp = None
        und = None
        if x.bound is not None:
            b = x.bound
            lo = x.center - b
            hi = x.center + b
            crosses = (lo <= 0) & (hi >= 0)
            if y < 0:
                und = crosses & (b > 0)
            bp = _interval_deviation(lambda v: np.power(v, float(y)), x.center, b, [(crosses & (y > 0), np.float64(0.0))],
                                     fc=c, ends=(lo, hi))
            bp = np.where(b == 0, 0.0, bp)
        m = _pow_chain(y)
        u = V.unit_roundoff(dt)
        rel = float(V.growth(m, u)) + (u if y < 0 else 0.0)
        a = np.abs(c) if bp is None else np.abs(c) + bp
        local = rel * a + (m + 1) * V.half_subnormal(dt) + 2 * V.REF_U * np.abs(c)
    out = result(bctx, eqn, c, dt, local, [(bp, x)], nonneg=(y % 2 == 0) or x.nonneg)
    if und is not None and V.any_of(und):
        out.bound = np.where(und, np.inf, out.bound)
    return [out]


@register("square")
def _square(bctx, eqn, ins):
    if not V.is_float(_out_dtype(eqn)):
        return [int_rule(bctx, eqn, ins)]      # refsim's square rule takes no `y`
    return _integer_pow(bctx, _with_params(eqn, y=2), ins)


class _with_params:
    """An equation with some params replaced (the rule of one primitive reused for another)."""

    def __init__(self, eqn, **params):
        self._eqn, self.params = eqn, {**eqn.params, **params}

    def __getattr__(self, name):
        return getattr(self._eqn, name)


@register("sqrt")
def _sqrt(bctx, eqn, ins):
    """sqrt is IEEE-exact: half an ulp; over the interval [c - b, c + b] (clipped at 0 where the
    operand is known non-negative), undecidable where it reaches below 0."""
    (x,) = ins
    dt = _out_dtype(eqn)
    if x.bound is None:
        with V.quiet():
            return [BVal(rounded(np.sqrt(x.center), dt), None, dt, True, origin="sqrt")]
    with V.quiet():
        c = np.sqrt(x.center)
        bp, und = None, None
        if x.bound is not None:
            lo = x.center - x.bound
            if x.nonneg:
                lo = np.maximum(lo, 0.0)
            und = (lo < 0) & (x.bound > 0)
            bp = np.where(x.bound == 0, 0.0, c - np.sqrt(np.maximum(lo, 0.0)))
        local = rounding(c, bp, dt)
    out = result(bctx, eqn, c, dt, local, [(bp, x)], nonneg=True, origin="sqrt")
    if und is not None and V.any_of(und):
        out.bound = np.where(und, np.inf, out.bound)
    return [out]


@register("rem")
def _rem(bctx, eqn, ins):
    """fmod (the sign of the dividend): exact in IEEE arithmetic; the quotient's integer part must
    be decided by the operands' intervals, and then the result moves with the dividend and with
    the divisor times that integer."""
    a, b = ins
    dt = _out_dtype(eqn)
    if not V.is_float(dt):
        return [int_rule(bctx, eqn, ins)]
    with V.quiet():
        c = np.fmod(a.center, b.center)
        if a.bound is None and b.bound is None:
            return [BVal(c, None, dt)]
        t = a.center / b.center
        acb = np.abs(b.center)
        bb = b.bound_or_zero()
        denom = acb - bb
        dt_ = (a.bound_or_zero() + np.abs(t) * bb) / np.where(denom > 0, denom, np.inf)
        q = np.trunc(t)
        und = (denom <= 0) | (np.trunc(t - dt_) != np.trunc(t + dt_))
        tb = sp(np.abs(q), b.bound)
        local = V.REF_U * np.abs(c)
    out = result(bctx, eqn, c, dt, local, [(a.bound, a), (tb, b)])
    und = und | np.isnan(out.bound)
    if V.any_of(und):
        out.bound = np.where(und, np.nan, out.bound)
    return [out]


@register("convert_element_type")
def _convert(bctx, eqn, ins):
    """float -> float: exact when the new type holds every value of the old, else one rounding;
    int -> float: one rounding; float -> int (truncation) and -> bool: decided where every
    allowed value converts alike; int -> int: exact (refsim's rule)."""
    (x,) = ins
    new = _out_dtype(eqn)
    src = x.dtype
    if V.is_float(new):
        if V.is_float(src):
            if V.widens_exactly(src, new):
                return [BVal(x.center, x.bound, new, x.nonneg, x.dom, x.origin)]
            if x.bound is None:
                return [BVal(rounded(x.center, new), None, new, x.nonneg, None, x.origin)]
            local = rounding(x.center, x.bound, new)
            return [result(bctx, eqn, x.center, new, local, [(x.bound, x)], nonneg=x.nonneg, origin=x.origin)]
        c = np.asarray(x.center).astype(np.float64)
        small = np.abs(c) < 2.0 ** 53           # exact in float64: one correctly rounded result
        c = np.where(small, rounded(c, new), c)
        local = None if np.all(small) else np.where(small, 0.0, rounding(c, None, new))
        out = result(bctx, eqn, c, new, local, [], nonneg=bool(np.all(c >= 0)), origin=x.origin)
        if x.bound is not None:
            out.bound = V.add_bounds(out.bound, np.broadcast_to(x.bound, np.shape(c)))
        return [out]
    if V.is_float(src):
        c = RULES["convert_element_type"](bctx.rule_context(), x.center, **eqn.params)
        if x.bound is None:
            return [BVal(c, None, new)]
        with V.quiet():
            lo, hi = x.center - x.bound, x.center + x.bound
            if new == bool:
                und = (lo <= 0) & (hi >= 0) & (x.bound > 0)
            else:
                und = np.trunc(lo) != np.trunc(hi)
        und = und | np.isnan(x.bound)
        return [BVal(c, decided(und, np.shape(c)), new)]
    return [int_rule(bctx, eqn, ins, dtype=new)]


@register("reduce_precision")
def _reduce_precision(bctx, eqn, ins):
    """Rounding to a format of `mantissa_bits` and `exponent_bits`: half an ulp of it, half its
    smallest subnormal (it flushes below its smallest normal: that whole range), undecidable
    where an allowed value reaches its overflow."""
    (x,) = ins
    e, m = int(eqn.params["exponent_bits"]), int(eqn.params["mantissa_bits"])
    emax = 2 ** (e - 1) - 1
    emin = 1 - emax
    u = 2.0 ** -(m + 1)
    tiny = 2.0 ** emin
    big = (2 - 2.0 ** -m) * 2.0 ** emax
    with V.quiet():
        a = np.abs(x.center) if x.bound is None else np.abs(x.center) + x.bound
        local = u * a + tiny + V.REF_U * np.abs(x.center)
        und = np.isfinite(x.center) & (a >= big)
    out = result(bctx, eqn, x.center, x.dtype, local, [(x.bound, x)], nonneg=x.nonneg)
    if V.any_of(und):
        out.bound = np.where(und, np.inf, out.bound)
    return [out]


@register("iota")
def _iota(bctx, eqn, ins):
    """iota: the integers 0..n-1 along `dimension`, exact; a float iota is each integer converted
    (correctly rounded: exact below 2**p, e.g. 256 for bfloat16; one rounding above)."""
    dt = _out_dtype(eqn)
    p = dict(eqn.params, dtype=np.int64)
    c = RULES["iota"](bctx.rule_context(), *[x.center for x in ins], **p)
    if not V.is_float(dt):
        return [BVal(np.asarray(c).astype(dt), None, dt, True)]
    c = np.asarray(c, np.float64)
    r = rounded(c, dt)
    return [BVal(r, None, dt, True, origin="constant")]


@register("bitcast_convert_type")
def _bitcast(bctx, eqn, ins):
    """The same bits read as another type: exact (refsim's rule on the operand's own bits) where
    the operand is exact; where its allowed set holds more than one value the bits are not
    determined: undecidable (elementwise for equal widths, else the whole result)."""
    (x,) = ins
    new = _out_dtype(eqn)
    with V.quiet():
        src = np.asarray(x.center).astype(x.dtype)
    c = V.as_center(RULES["bitcast_convert_type"](bctx.rule_context(), src, **eqn.params), new)
    if x.bound is None:
        return [BVal(c, None, new)]
    open_ = ~(x.full_bound() == 0)          # a positive or NaN bound
    if not open_.any():
        return [BVal(c, None, new)]
    if np.shape(c) == np.shape(x.center):
        return [BVal(c, np.where(open_, np.nan, 0.0), new)]
    return [BVal(c, np.full(np.shape(c), np.nan), new)]


@register("one_minus_square")
def _one_minus_square(bctx, eqn, ins):
    """1 - x**2 as JAX evaluates it, (1 + x)(1 - x) (jax >= 0.12: the JVP of tanh, asin, atanh):
    three roundings, each factor's (u relative) and the product's (half an ulp); the operand's
    bound propagated through |2 x| b + b**2."""
    (x,) = ins
    dt = _out_dtype(eqn)
    if not V.is_float(dt):
        return [int_rule(bctx, eqn, ins)]
    with V.quiet():
        c = (1.0 + x.center) * (1.0 - x.center)
        bp = None
        if x.bound is not None:
            bp = 2.0 * np.abs(x.center) * x.bound + x.bound * x.bound
        mag = np.abs(c) if bp is None else np.abs(c) + bp
        local = 2.0 * V.unit_roundoff(dt) * (1.0 + V.unit_roundoff(dt)) * mag + rounding(c, bp, dt) \
            + 2 * V.REF_U * np.abs(c)
    return [result(bctx, eqn, c, dt, local, [(bp, x)], nonneg=False)]
