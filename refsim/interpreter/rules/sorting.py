"""sort and top_k with lax's orderings, as integer sort keys.

lax.sort (jax/_src/lax/lax.py, ``_sort_lt_comparator``) compares the first `num_keys`
operands lexicographically after canonicalising floats: -0.0 equals +0.0 and every NaN
is one NaN that sorts after +inf; complex keys compare (real, imag). Stable sorting
keeps equal keys in input order. lax.top_k orders by the IEEE total order instead
(-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN), largest first, ties to the lower index.
"""
from __future__ import annotations

import numpy as np

from refsim.interpreter.registry import register
from refsim.interpreter.rules import _util as U


def total_order_key(x: np.ndarray) -> np.ndarray:
    """Unsigned integers whose order is the IEEE total order of float `x` (ints: their order)."""
    dtype = x.dtype
    if dtype == bool:
        return x.astype(np.uint8)
    if U.is_int(dtype):
        if U.is_unsigned_int(dtype):
            return x.astype(np.uint64)
        return (x.astype(np.int64).view(np.uint64)) ^ np.uint64(1 << 63)
    bits = dtype.itemsize * 8
    u = np.ascontiguousarray(x).view(np.dtype(f"u{dtype.itemsize}")).astype(np.uint64)
    sign = np.uint64(1 << (bits - 1))
    mask = np.uint64((1 << bits) - 1)
    # negative floats: flip all bits (reverses their order); positive: set the sign bit
    return np.where(u & sign, (~u) & mask, u | sign)


def _sort_keys(x: np.ndarray) -> list[np.ndarray]:
    """lax.sort's canonical keys: zeros merged, NaNs merged after +inf; complex -> (re, im)."""
    if U.is_complex(x.dtype):
        return _sort_keys(np.real(x)) + _sort_keys(np.imag(x))
    if U.is_float(x.dtype):
        c = np.where(x == 0, np.zeros((), x.dtype), x)
        c = np.where(np.isnan(c), np.array(np.nan).astype(x.dtype), c)
        return [total_order_key(np.asarray(c, dtype=x.dtype))]
    return [total_order_key(x)]


@register("sort")
def sort_rule(ctx, *operands, dimension, is_stable, num_keys):
    """Sort all operands along local `dimension` by the first `num_keys` (lexicographic).

    The sort is always stable; an unstable request may return any order of equal keys,
    so the stable one is a valid answer."""
    nm = ctx.nm
    ops = U.bcast_mesh(nm, *operands)
    ax = nm + dimension
    keys = []
    for op in ops[:num_keys]:
        keys.extend(_sort_keys(op))
    if len(keys) == 1:
        perm = np.argsort(keys[0], axis=ax, kind="stable")
    else:
        moved = [np.moveaxis(k, ax, -1) for k in keys]
        perm = np.moveaxis(np.lexsort(moved[::-1], axis=-1), -1, ax)
    return [np.take_along_axis(op, perm, axis=ax) for op in ops]


@register("top_k")
def top_k_rule(ctx, x, *, k, axis=-1, is_stable=True):
    """The k largest entries along local `axis` (IEEE total order, ties to the lower index)
    and their int32 indices (lax.top_k)."""
    nm = ctx.nm
    rank = x.ndim - nm
    ax = nm + (axis % rank)
    if not 0 <= k <= x.shape[ax]:
        raise ValueError(f"top_k: k={k} must be in [0, {x.shape[ax]}] for axis {axis}.")
    key = ~total_order_key(x)  # largest first; the stable sort keeps ties in index order
    perm = np.argsort(key, axis=ax, kind="stable")
    perm = np.take(perm, np.arange(k), axis=ax)
    return [np.take_along_axis(x, perm, axis=ax), perm.astype(np.int32)]


# --- total-order comparisons (searchsorted, digitize, histogram) ----------------------------

def _total_keys(x, y):
    """Integer keys of x and y in StableHLO's TOTALORDER (-NaN < -inf < -0 < +0 < +inf < +NaN)."""
    if U.is_complex(x.dtype):
        raise TypeError(f"total-order comparison of complex dtype {x.dtype} is not defined.")
    return total_order_key(np.asarray(x)), total_order_key(np.asarray(y))


def _total_compare(op):
    def rule(ctx, x, y):
        x, y = U.bcast_local_rank(ctx.nm, [x, y])
        kx, ky = _total_keys(x, y)
        return op(kx, ky)
    return rule


for _name, _op in (("lt_to", np.less), ("le_to", np.less_equal), ("eq_to", np.equal)):
    _rule = _total_compare(_op)
    _rule.__name__ = _rule.__qualname__ = f"{_name}_rule"
    _rule.__doc__ = (f"`{_name}`: {_op.__name__} under StableHLO compare's TOTALORDER type "
                     "(what jnp.searchsorted / digitize bind), as IEEE-754 totalOrder.")
    register(_name)(_rule)


@register("approx_top_k")
def approx_top_k_rule(ctx, x, *, k, reduction_dimension, recall_target, is_max_k,
                      reduction_input_size_override, aggregate_to_topk):
    """`lax.approx_max_k` / `approx_min_k` on CPU: XLA's ApproxTopK fallback is an exact sort
    along the reduction dimension (comparator GT for max, LT for min) keeping the first
    entries — k of them with aggregate_to_topk, else jaxlib's approximate output size.
    Equal values keep index order; NaNs sort as the largest values (IEEE total order)."""
    nm = ctx.nm
    rank = x.ndim - nm
    ax = nm + (reduction_dimension % rank)
    n = x.shape[ax]
    size = k if aggregate_to_topk else approx_top_k_size(n, rank, k, recall_target, reduction_input_size_override)
    key = total_order_key(x)
    perm = np.argsort(~key if is_max_k else key, axis=ax, kind="stable")
    perm = np.take(perm, np.arange(size), axis=ax)
    return [np.take_along_axis(x, perm, axis=ax), perm.astype(np.int32)]


def approx_top_k_size(n, rank, k, recall_target, override) -> int:
    from refsim import compat

    return compat.approx_top_k_output_size(n, rank, k, recall_target, False, override)
