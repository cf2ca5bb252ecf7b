"""dot_general: any order of the K products' additions (Higham's inner-product bound).

For allowed operands A~ (within bA of A) and B~ (within bB of B), every element of fl(A~ B~),
with the K products added in any order and tree and rounded to the result type, lies within

    |A| bB + bA |B| + bA bB                       (the operands' latitude, propagated)
    + ((1 + u)**(K + 1) - 1) * (|A| + bA)(|B| + bB)  (Higham, Thm 3.5 / eq. 3.5: K roundings
                                                    of an inner product in any order, one more
                                                    for a final rounding of a wider accumulator)

of the float64 center A B, plus the center's own gamma(K) of |A||B| (BLAS in float64) and half
a subnormal per addition. `u` is the unit roundoff of the result type: accumulating in a wider
type (bfloat16 operands summed in float32) is within it too. Integer products are exact
(refsim's rule, wrapping).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from refsim import blas
from refsim.bounds import values as V
from refsim.bounds.registry import register
from refsim.bounds.values import BVal, dtype_of
from refsim.interpreter.registry import RULES


def contract(x, y, nlead, dimension_numbers):
    """dot_general of float64 `x` and `y` (``nlead`` leading mesh dims broadcast as batch dims)
    with NumPy's matmul (BLAS): result dims lead + batch + x free + y free."""
    try:
        plan = _plan(x.ndim, y.ndim, nlead, dimension_numbers)
    except TypeError:     # unhashable dimension numbers (lists): the long way
        plan = _plan.__wrapped__(x.ndim, y.ndim, nlead, dimension_numbers)
    px, py, nb, nxf, nyc = plan
    xt = x.transpose(px)
    yt = y.transpose(py)
    xs, ys = xt.shape, yt.shape
    k = math.prod(xs[nb + nxf:])
    m = math.prod(xs[nb:nb + nxf])
    n = math.prod(ys[nb + nyc:])
    bx, by = xs[:nb], ys[:nb]
    out_lead = bx if bx == by else np.broadcast_shapes(bx, by)
    xm = xt.reshape(bx + (m, k))
    ym = yt.reshape(by + (k, n))
    with V.quiet():
        # refsim's BLAS seam: on a busy machine OpenBLAS's spinning threads cost ~100x a product
        r = blas.matmul(xm, ym)
    free = xs[nb:nb + nxf] + ys[nb + nyc:]
    return r.reshape(out_lead + free), k


@functools.lru_cache(maxsize=512)
def _plan(xnd: int, ynd: int, nlead: int, dimension_numbers) -> tuple:
    """`contract`'s transposes (lead + batch + free + contracting for x, lead + batch +
    contracting + free for y), the batch dims' count and x's free / y's contracting dims' counts:
    once per (ranks, nlead, dimension numbers), not per product (a dot_general makes 3-4)."""
    (xc, yc), (xb, yb) = dimension_numbers
    xc = tuple(nlead + d for d in xc)
    yc = tuple(nlead + d for d in yc)
    xb = tuple(nlead + d for d in xb)
    yb = tuple(nlead + d for d in yb)
    lead = tuple(range(nlead))
    xf = tuple(d for d in range(nlead, xnd) if d not in xb and d not in xc)
    yf = tuple(d for d in range(nlead, ynd) if d not in yb and d not in yc)
    return lead + xb + xf + xc, lead + yb + yc + yf, nlead + len(xb), len(xf), len(yc)


def _finite_stand_in(x):
    """x's bound (full shape) with 1e300 for each infinite element (None: exact); the bound itself
    where none is infinite and it is one contiguous array already (no copy: the products then see
    the same memory layout as the copy would have)."""
    if x.bound is None:
        return None
    full = x.full_bound()
    inf = np.isinf(full)
    if not inf.any() and full.flags.c_contiguous and full.strides == x.bound.strides:
        return full
    return np.where(inf, 1e300, full)


@register("dot_general")
def _dot_general(bctx, eqn, ins):
    a, b = ins
    dt = dtype_of(eqn.outvars[0])
    dn = eqn.params["dimension_numbers"]
    if not V.is_float(dt) or not (V.is_float(a.dtype) and V.is_float(b.dtype)):
        if V.is_float(dt) or V.is_float(a.dtype) or V.is_float(b.dtype):
            from refsim.bounds.values import Unknown

            return [Unknown(frozenset({"dot_general of mixed integer and float operands"}))]
        c = RULES["dot_general"](bctx.rule_context(), a.center, b.center, **eqn.params)
        bound = None
        if a.bound is not None or b.bound is not None:
            mask, _ = contract(np.isnan(a.full_bound()).astype(np.float64), np.ones(np.shape(b.center)),
                               bctx.nm, dn)
            mask2, _ = contract(np.ones(np.shape(a.center)), np.isnan(b.full_bound()).astype(np.float64),
                                bctx.nm, dn)
            bound = np.where((mask + mask2) > 0, np.nan, 0.0)
        return [BVal(c, bound, dt)]
    ca, cb = a.center, b.center
    c, k = contract(ca, cb, bctx.nm, dn)
    # an unbounded operand element (inf) times an exact zero adds nothing: contract with a huge
    # finite stand-in (1e300 * 0 is 0; any real contribution still overflows to inf)
    fa, fb = _finite_stand_in(a), _finite_stand_in(b)
    with V.quiet():
        aa, ab = np.abs(ca), np.abs(cb)
        p, _ = contract(aa, ab, bctx.nm, dn)
        prop_a = prop_b = None
        if fa is not None:
            prop_a, _ = contract(fa, ab if fb is None else ab + fb, bctx.nm, dn)
        if fb is not None:
            prop_b, _ = contract(aa, fb, bctx.nm, dn)
        prop = V.add_bounds(prop_a, prop_b)
        total = p if prop is None else p + prop
        u = V.unit_roundoff(dt)
        local = (V.growth(k + 1, u) * total + V.growth(k, 2.0 ** -53) * p
                 + (k + 1) * V.half_subnormal(dt) + V.REF_U * np.abs(c))
        bound = local if prop is None else prop + local
    dom = None
    if bctx.explain:
        me = bctx.op_id(eqn)
        dom = np.full(np.shape(c), me, np.int32)
        for pr, x in ((prop_a, a), (prop_b, b)):
            if pr is not None and x.dom is not None:
                vals, counts = np.unique(np.asarray(x.dom), return_counts=True)
                dom = np.where(pr > local, np.int32(vals[np.argmax(counts)]), dom)
    return [BVal(c, bound, dt, False, dom)]


@register("conv_general_dilated")
def _conv(bctx, eqn, ins):
    """A convolution is K products per output element added in any order (K: the kernel's
    elements per output feature, an upper bound where padding or groups leave fewer): the
    inner-product bound of dot_general, each array computed by refsim's own convolution rule
    in float64 (centers, magnitudes, bounds)."""
    a, b = ins
    dt = dtype_of(eqn.outvars[0])
    if not (V.is_float(dt) and V.is_float(a.dtype) and V.is_float(b.dtype)):
        from refsim.bounds.values import Unknown

        return [Unknown(frozenset({"conv_general_dilated of integers"}))]
    rule = RULES["conv_general_dilated"]
    ctx = bctx.rule_context()
    params = dict(eqn.params, preferred_element_type=None)

    def conv(x, y):
        with V.quiet():
            return np.asarray(rule(ctx, x, y, **params), np.float64)

    local_rhs = np.shape(b.center)[bctx.nm:]
    out_feature = eqn.params["dimension_numbers"].rhs_spec[0]
    k = int(np.prod(local_rhs)) // max(int(local_rhs[out_feature]), 1)
    c = conv(a.center, b.center)
    aa, ab = np.abs(a.center), np.abs(b.center)
    p = conv(aa, ab)
    fa, fb = _finite_stand_in(a), _finite_stand_in(b)
    prop = V.add_bounds(None if fa is None else conv(fa, ab if fb is None else ab + fb),
                        None if fb is None else conv(aa, fb))
    with V.quiet():
        total = p if prop is None else p + prop
        u = V.unit_roundoff(dt)
        local = (V.growth(k + 1, u) * total + V.growth(k, 2.0 ** -53) * p
                 + (k + 1) * V.half_subnormal(dt) + V.REF_U * np.abs(c))
        bound = local if prop is None else prop + local
    dom = np.full(np.shape(c), bctx.op_id(eqn), np.int32) if bctx.explain else None
    return [BVal(c, bound, dt, False, dom)]
