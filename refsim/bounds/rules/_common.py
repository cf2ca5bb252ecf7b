"""Helpers shared by the bound rules: a rounding's latitude, assembling a result, moving data."""
from __future__ import annotations

import numpy as np

from refsim.bounds import values as V
from refsim.bounds.registry import BCtx
from refsim.bounds.values import BVal, dtype_of
from refsim.interpreter.registry import RULES

ERR = V.ERR


def rounding(c, bp, dtype, factor: float = 1.0):
    """The latitude of one correctly rounded operation whose exact result, on the allowed
    operands, lies within `bp` of `c`: ``factor`` times half an ulp of `dtype` at ``|c| + bp``
    (`values.half_ulp`: at least half the smallest subnormal), plus the float64 center's own
    rounding ``REF_U * |c|``."""
    a = np.abs(c)
    with V.quiet():
        h = V.half_ulp(a if bp is None else a + bp, dtype)
        return (h if factor == 1.0 else factor * h) + V.REF_U * a


def rounded(c, dtype) -> np.ndarray:
    """The correctly rounded value, in `dtype`, of an exact float64 result `c` (as float64). For
    +, -, *, /, sqrt of float32 or narrower operands the float64 result rounded again is the
    correctly rounded one (53 >= 2 p + 2 bits: double rounding is innocuous), so an operation on
    exact operands has exactly one allowed result."""
    with V.quiet():
        return np.asarray(c, np.float64).astype(dtype).astype(np.float64)


def result(bctx: BCtx, eqn, center, dtype, local, terms=(), *, nonneg=False, origin=None) -> BVal:
    """A BVal whose bound is ``local + sum(contribution for contribution, operand in terms)``
    (None where everything is None); in explain mode its `dom` names, per element, the op whose
    latitude is the largest part (this one, or the dominating op of the largest term)."""
    parts = [t for t, _ in terms if t is not None]
    with V.quiet():
        bound = V.add_bounds(local, *parts)
    dom = None
    if bctx.explain and bound is not None:
        dom = _dominant(bctx, eqn, np.shape(center), local, terms)
    return BVal(center, bound, np.dtype(dtype), nonneg, dom, origin)


def _dominant(bctx, eqn, shape, local, terms):
    me = bctx.op_id(eqn)
    cands, doms = [], []
    if local is not None:
        cands.append(np.broadcast_to(local, shape))
        doms.append(np.broadcast_to(np.int32(me), shape))
    for t, x in terms:
        if t is None:
            continue
        cands.append(np.broadcast_to(t, shape))
        doms.append(np.broadcast_to(x.dom if x.dom is not None else np.int32(-1), shape))
    if not cands:
        return None
    with V.quiet():
        st = np.nan_to_num(np.stack(cands), nan=np.inf)
    idx = np.argmax(st, axis=0)
    return np.choose(idx, [np.asarray(d, np.int32) for d in doms]) if len(doms) > 1 else np.asarray(doms[0])


def int_rule(bctx: BCtx, eqn, ins, dtype=None) -> BVal:
    """An elementwise primitive on integers or bools: refsim's rule on the exact values;
    undecidable where an operand is."""
    out = RULES[eqn.primitive.name](bctx.rule_context(), *[x.center for x in ins], **eqn.params)
    bound = V.add_bounds(*[x.bound for x in ins])
    dt = dtype if dtype is not None else out.dtype
    if bound is not None:
        bound = np.broadcast_to(bound, np.shape(out))
    return BVal(out, bound, np.dtype(dt))


def decided(mask_undecidable, shape=None):
    """A bound of 0 where decided, NaN where not (None when every element is decided)."""
    m = np.asarray(mask_undecidable)
    if not m.any():
        return None
    b = np.where(m, np.nan, 0.0)
    return b if shape is None else np.broadcast_to(b, shape)


def move(bctx: BCtx, eqn, ins, data_positions, *, origin=None) -> list:
    """A data-movement primitive: refsim's value rule applied to the centers, then to the bounds
    (and, in explain mode, to the dominating-op ids), the other operands (indices, sizes) as they
    are. Exact on both value and bound. An undecidable index makes every result undecidable."""
    rule = RULES[eqn.primitive.name]
    ctx = bctx.rule_context()
    multiple = eqn.primitive.multiple_results
    centers = rule(ctx, *[x.center for x in ins], **eqn.params)
    centers = list(centers) if multiple else [centers]
    data = set(data_positions)
    index_undecided = any(i not in data and x.bound is not None and np.isnan(x.bound).any()
                          for i, x in enumerate(ins))
    dts = [dtype_of(v) for v in eqn.outvars]
    bounds = [None] * len(centers)
    if any(ins[i].bound is not None for i in data):
        args = [x.full_bound() if i in data else x.center for i, x in enumerate(ins)]
        # a fill value (gather's mode='fill', NaN by default) is exact: its elements' bound is 0
        params = dict(eqn.params, fill_value=0.0) if "fill_value" in eqn.params else eqn.params
        bounds = rule(ctx, *args, **params)
        bounds = list(bounds) if multiple else [bounds]
    doms = [None] * len(centers)
    if bctx.explain and any(ins[i].dom is not None for i in data):
        args = [np.broadcast_to(x.dom if x.dom is not None else np.int32(-1), np.shape(x.center)).astype(np.float64)
                if i in data else x.center for i, x in enumerate(ins)]
        # a filled element is no operand's: no op dominates it (-1)
        doms = rule(ctx, *args, **(dict(eqn.params, fill_value=-1.0) if "fill_value" in eqn.params else eqn.params))
        doms = [np.asarray(d).astype(np.int32) for d in (list(doms) if multiple else [doms])]
    nonneg = all(ins[i].nonneg for i in data) if data else False
    outs = []
    for c, b, dm, dt in zip(centers, bounds, doms, dts):
        if index_undecided:
            b = np.full(np.shape(c), np.nan)
        outs.append(BVal(c, b, dt, nonneg, dm, origin))
    return outs


def unreduced(var) -> bool:
    """Whether a jaxpr variable's type is unreduced over some mesh axis (``f32[3]{U:x}``: each
    device holds a partial value, the value is their sum)."""
    spec = getattr(getattr(getattr(var, "aval", None), "sharding", None), "spec", None)
    return bool(getattr(spec, "unreduced", None))
