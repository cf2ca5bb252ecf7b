"""sort, argsort, multi-operand sort and top_k."""
from __future__ import annotations

import math

from conformance.strategies._sharded_graph import F32, I32, Builder, int_result, model_of
from conformance.strategies._sharded_ops.common import exact_numeric


def _sort(b: Builder) -> bool:
    a = b.pick(lambda v: v.dtype in (F32, I32) and v.ndim >= 1 and not v.manual and v.mag < math.inf)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    main = a
    a = b.replicated(a)
    if b.boolean():
        expr = f"jnp.sort({a.name}, axis={d}, descending={b.boolean()})"
    else:
        expr = f"jax.lax.sort({a.name}, dimension={d})"
    b.emit("sort", expr, a.shape, a.dtype, main=main, **model_of(a))
    return True


def _argsort(b: Builder) -> bool:
    a = b.pick(lambda v: exact_numeric(v) and v.ndim >= 1)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    main = a
    a = b.replicated(a)
    b.emit("argsort", f"jnp.argsort({a.name}, axis={d}, stable=True, descending={b.boolean()})", a.shape, I32,
           main=main, **int_result(0, a.shape[d] - 1))
    return True


def _sort_multi(b: Builder) -> bool:
    k = b.pick(lambda v: exact_numeric(v) and v.ndim >= 1)
    if k is None:
        return False
    o = b.pick(lambda v: v.shape == k.shape and v.dtype in (F32, I32) and not v.manual) or k
    d = b.draw_int(0, k.ndim - 1)
    main = k
    k, o = b.replicated(k), b.replicated(o)
    b.emit_multi("sort_multi", f"jax.lax.sort(({k.name}, {o.name}), dimension={d}, num_keys=1)",
                 [(k.shape, k.dtype, None, model_of(k)), (o.shape, o.dtype, None, model_of(o))], main=main)
    return True


def _top_k(b: Builder) -> bool:
    a = b.pick(lambda v: v.dtype in (F32, I32) and v.ndim >= 1 and not v.manual and v.mag < math.inf)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    kk = b.draw_int(1, a.shape[d])
    main = a
    a = b.replicated(a)
    shape = a.shape[:d] + (kk,) + a.shape[d + 1:]
    axis = "" if d == a.ndim - 1 and b.boolean() else f", axis={d}"
    vals, idx = b.emit_multi("top_k", f"jax.lax.top_k({a.name}, {kk}{axis})",
                             [(shape, a.dtype, None, model_of(a)), (shape, I32, None, int_result(0, a.shape[d] - 1))],
                             main=main)
    if not a.exact:
        # ties among values that differ by rounding may order differently: keep only the values
        b.pool.remove(idx)
    return True


#: This family's ops, by the name programs and the coverage table use.
OPS = {"sort": _sort, "argsort": _argsort, "sort_multi": _sort_multi, "top_k": _top_k}
