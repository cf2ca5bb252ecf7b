"""sort and top_k: values by order statistics, positions by decided comparisons.

**Values.** Sorting is monotone in every operand: if each allowed key lies in [c_i - b_i,
c_i + b_i], the k-th smallest allowed key lies between the k-th smallest lower end and the k-th
smallest upper end, whatever order the comparisons take. So the sorted first key (and top_k's
values) has a bound in every case -- the larger distance from the k-th center to those two order
statistics -- with no undecidable element.

**Positions.** Every other operand (argsort's iota, sort_multi's payloads, later keys) and
top_k's indices follow the permutation. Two elements' order is decided when their key intervals
are strictly apart on the first key that is not an exact tie, or when every key is an exact tie
and the sort keeps input order (`is_stable`; top_k always does) or the two elements are equal
in every operand. An element whose order against every other is decided has one position in
every allowed result; a result position held by no such element is undecidable (NaN bound).
Rows with an undecidable key element, and top_k rows holding a NaN, are undecidable throughout.
"""
from __future__ import annotations

import numpy as np

from refsim.bounds import values as V
from refsim.bounds.registry import register
from refsim.bounds.values import BVal, dtype_of
from refsim.interpreter.registry import RULES

#: Above this many pairs (rows x n x n) positions are decided by isolation on the first key only.
PAIRWISE_LIMIT = 1 << 22


def _dtypes(eqn):
    return [dtype_of(v) for v in eqn.outvars]


def _interval(x: BVal, shape):
    """(center, lo, hi, exact, bad) of one key broadcast to `shape` (float64)."""
    c = np.broadcast_to(np.asarray(x.center, np.float64), shape)
    b = np.broadcast_to(x.bound_or_zero(), shape)
    with V.quiet():
        lo, hi = c - b, c + b
        nan = np.isnan(c) & (b == 0)              # an exact NaN: one NaN, after +inf
        lo = np.where(nan, np.inf, lo)
        hi = np.where(nan, np.inf, hi)
    return c, lo, hi, b == 0, np.isnan(b) | (np.isnan(c) & (b != 0)), nan


def order_statistic_bound(c, b, axis, descending=False):
    """The bound of the sorted centers `c` (bounds `b`): for every order of the comparisons, the
    k-th allowed value lies between the k-th lower and the k-th upper end (module docstring).
    Exact NaNs sort last in all three; their positions are exact."""
    with V.quiet():
        lo, hi = c - b, c + b
        if descending:
            cs, ls, hs = (-np.sort(-v, axis=axis) for v in (c, lo, hi))
        else:
            cs, ls, hs = (np.sort(v, axis=axis) for v in (c, lo, hi))
        down = np.where(cs == ls, 0.0, cs - ls)     # an infinite center: exact, not inf - inf
        up = np.where(hs == cs, 0.0, hs - cs)
        return np.where(np.isnan(cs), 0.0, np.fmax(down, up))


def decided_elements(keys, others, axis, stable):
    """Per element (the keys' shape): True where its order against every other element of its
    row is decided (module docstring). `keys`, `others`: (center, bound-or-None) arrays."""
    shape = np.shape(keys[0][0])
    n = shape[axis]
    rows = int(np.prod(shape)) // max(n, 1)
    ivs = []
    for c, b in keys:
        x = BVal(c, b, np.dtype(np.float64))
        ivs.append([np.moveaxis(a, axis, -1) for a in _interval(x, shape)])
    bad_row = np.zeros(np.moveaxis(np.zeros(shape), axis, -1).shape[:-1] + (1,), bool)
    for iv in ivs:
        bad_row = bad_row | np.any(iv[4], axis=-1, keepdims=True)
    if n <= 1:
        out = np.ones(np.moveaxis(np.zeros(shape), axis, -1).shape, bool) & ~bad_row
        return np.moveaxis(out, -1, axis)
    if rows * n * n > PAIRWISE_LIMIT:
        c, lo, hi, exact, bad, nan = ivs[0]
        order = np.argsort(lo, axis=-1, kind="stable")
        slo = np.take_along_axis(lo, order, -1)
        shi = np.take_along_axis(hi, order, -1)
        prev_hi = np.concatenate([np.full(slo.shape[:-1] + (1,), -np.inf), np.maximum.accumulate(shi, -1)[..., :-1]], -1)
        next_lo = np.concatenate([slo[..., 1:], np.full(slo.shape[:-1] + (1,), np.inf)], -1)
        iso_sorted = (prev_hi < slo) & (shi < next_lo)
        iso = np.empty_like(iso_sorted)
        np.put_along_axis(iso, order, iso_sorted, -1)
        return np.moveaxis(iso & ~bad_row, -1, axis)
    und = np.zeros(np.moveaxis(np.zeros(shape), axis, -1).shape + (n,), bool)
    pending = np.ones_like(und)
    for c, lo, hi, exact, bad, nan in ivs:
        with V.quiet():
            sep = (hi[..., :, None] < lo[..., None, :]) | (hi[..., None, :] < lo[..., :, None])
            tie = exact[..., :, None] & exact[..., None, :] & (
                (c[..., :, None] == c[..., None, :]) | (nan[..., :, None] & nan[..., None, :]))
        und |= pending & ~sep & ~tie
        pending &= tie
    if not stable:
        same = np.ones_like(pending)
        for c, b in [*keys, *others]:
            cc = np.moveaxis(np.broadcast_to(np.asarray(c), shape), axis, -1)
            ex = np.moveaxis(np.broadcast_to(np.asarray(b if b is not None else 0.0) == 0, shape), axis, -1)
            with V.quiet():
                same &= ex[..., :, None] & ex[..., None, :] & (cc[..., :, None] == cc[..., None, :])
        und |= pending & ~same
    und &= ~np.eye(n, dtype=bool)
    ok = ~np.any(und, axis=-1) & ~bad_row
    return np.moveaxis(ok, -1, axis)


def _positions(ok, perm, axis):
    """Per result position: decided where the element placed there is."""
    return np.take_along_axis(ok, perm, axis=axis)


def _permuted(x: BVal, perm, pos_ok, axis, dtype, shape) -> BVal:
    c = np.take_along_axis(np.broadcast_to(x.center, shape), perm, axis=axis)
    b = None if x.bound is None else np.take_along_axis(np.broadcast_to(x.full_bound(), shape), perm, axis=axis)
    if not pos_ok.all():
        b = np.where(pos_ok, 0.0 if b is None else b, np.nan)
    return BVal(c, b, dtype, x.nonneg)


def _perm(keys_centers, axis, num_keys):
    """refsim's permutation of the centers (its sort rule on an iota payload)."""
    shape = np.shape(keys_centers[0])
    iota = np.broadcast_to(np.arange(shape[axis]).reshape((-1,) + (1,) * (len(shape) - axis - 1)), shape)
    from refsim.interpreter.registry import Context

    outs = RULES["sort"](Context(nm=0, mesh=None, extra={}), *keys_centers, np.ascontiguousarray(iota),
                         dimension=axis, is_stable=True, num_keys=num_keys)
    return outs[-1]


@register("sort")
def _sort(bctx, eqn, ins):
    p = eqn.params
    num_keys, ax = int(p["num_keys"]), bctx.nm + int(p["dimension"])
    dts = _dtypes(eqn)
    shape = np.broadcast_shapes(*[np.shape(x.center) for x in ins])
    centers = [np.ascontiguousarray(np.broadcast_to(x.center, shape)) for x in ins]
    perm = _perm(centers[:num_keys], ax, num_keys)
    if all(x.bound is None for x in ins) and p["is_stable"]:
        return [BVal(np.take_along_axis(c, perm, axis=ax), None, dt, x.nonneg) for c, x, dt in zip(centers, ins, dts)]
    keys = [(centers[i], None if ins[i].bound is None else ins[i].full_bound()) for i in range(num_keys)]
    others = [(centers[i], None if ins[i].bound is None else ins[i].full_bound()) for i in range(num_keys, len(ins))]
    ok = decided_elements(keys, others, ax, bool(p["is_stable"]))
    pos_ok = _positions(ok, perm, ax)
    outs = []
    for i, (x, dt) in enumerate(zip(ins, dts)):
        if i == 0 and V.is_float(x.dtype):
            c, _, _, _, bad, _ = _interval(x, shape)
            b = order_statistic_bound(c, np.broadcast_to(x.bound_or_zero(), shape), ax)
            b = np.where(np.any(bad, axis=ax, keepdims=True), np.nan, b)
            outs.append(BVal(np.take_along_axis(centers[0], perm, axis=ax), None if not b.any() and not np.isnan(b).any()
                             else b, dt, x.nonneg))
        else:
            outs.append(_permuted(x, perm, pos_ok, ax, dt, shape))
    return outs


@register("top_k")
def _top_k(bctx, eqn, ins):
    (x,) = ins
    p = eqn.params
    k = int(p["k"])
    dts = _dtypes(eqn)
    ctx = bctx.rule_context()
    values, idx = RULES["top_k"](ctx, x.center, **p)
    rank = np.ndim(x.center) - bctx.nm
    ax = bctx.nm + (int(p.get("axis", -1)) % rank)
    if x.bound is None:
        return [BVal(values, None, dts[0], x.nonneg), BVal(idx, None, dts[1])]
    shape = np.shape(x.center)
    full = x.full_bound()
    c, _, _, _, bad, _ = _interval(x, shape)
    bad_row = np.any(bad | np.isnan(c), axis=ax, keepdims=True)
    b = order_statistic_bound(c, full, ax, descending=True)
    b = np.where(bad_row, np.nan, b)
    b = np.take(b, np.arange(k), axis=ax)
    ok = decided_elements([(np.asarray(x.center, np.float64), full)], [], ax, True) & ~bad_row
    pos_ok = np.take_along_axis(ok, idx.astype(np.int64), axis=ax)
    ib = None if pos_ok.all() else np.where(pos_ok, 0.0, np.nan)
    return [BVal(values, b, dts[0], x.nonneg), BVal(idx, ib, dts[1])]
