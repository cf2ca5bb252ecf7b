"""reduce, reduce_window and the body analysis the reductions and collectives share.

A body that applies one binary op to its two arguments (add, maximum, minimum, multiply,
and, or, xor) is recognised and reduced with refsim's kernel for it, then combined with the
init value by that op (XLA folds the init in too, so `reduce([-0.], init=0)` is +0). Any
other body (variadic reduces, e.g. argmax's compare-and-select) is evaluated step by step
over the reduced elements, vectorised across every device and every kept position.
"""
from __future__ import annotations

import numpy as np

from refsim.interpreter.registry import RULES
from refsim.interpreter.rules import reductions as R
from refsim.stablehlo.registry import register

_KINDS = {"stablehlo.add": "sum", "stablehlo.maximum": "max", "stablehlo.minimum": "min",
          "stablehlo.multiply": "prod", "stablehlo.and": "and", "stablehlo.or": "or", "stablehlo.xor": "xor"}
_COMBINE = {"sum": "add", "max": "max", "min": "min", "prod": "mul", "and": "and", "or": "or", "xor": "xor"}


# ops a body may apply to its result without changing the value (Shardy's and GSPMD's annotations)
def _is_annotation(op) -> bool:
    return op.name == "sdy.sharding_constraint" or (
        op.name == "stablehlo.custom_call" and op.attrs.get("call_target_name") == "Sharding")


def body_kind(block) -> str | None:
    """'sum', 'max', ... when `block` is `return op(arg0, arg1)` for one recognised op (maybe
    annotated by a sharding constraint), else None."""
    if not block.ops or len(block.args) != 2 or len(block.returns) != 1:
        return None
    op, rest = block.ops[0], block.ops[1:]
    kind = _KINDS.get(op.name)
    if kind is None or set(op.operands) != set(block.args):
        return None
    last = op.results
    for a in rest:
        if not _is_annotation(a) or a.operands != last:
            return None
        last = a.results
    return kind if block.returns == last else None


def combine(m, kind: str, a, b):
    return RULES[_COMBINE[kind]](m.ctx, a, b)


def _generic(m, op, env, xs, inits, dims):
    """Fold the body over the reduced dims one element at a time (all devices and kept
    positions at once), in row-major order of the reduced positions."""
    keep = [d for d in range(xs[0].ndim - 1) if d not in dims]
    moved = [np.moveaxis(x, [1 + d for d in dims], list(range(x.ndim - len(dims), x.ndim))) for x in xs]
    kept_shape = tuple(xs[0].shape[1 + d] for d in keep)
    flat = [x.reshape(x.shape[:1 + len(keep)] + (-1,)) for x in moved]
    acc = [np.broadcast_to(i.reshape(i.shape[:1] + (1,) * len(keep)), i.shape[:1] + kept_shape) for i in inits]
    for j in range(flat[0].shape[-1]):
        acc = m.scalar_region(op, 0, [*acc, *(f[..., j] for f in flat)], env)
    return acc


@register("stablehlo.reduce")
def reduce_rule(m, op, env, *operands):
    """StableHLO reduce of `dimensions` with the op's body, starting from the init values."""
    k = len(operands) // 2
    xs, inits = operands[:k], operands[k:]
    dims = tuple(op.attrs["dimensions"])
    kind = body_kind(op.regions[0]) if k == 1 else None
    if kind is None:
        return _generic(m, op, env, xs, inits, dims)
    red = R._reduce(kind, xs[0], dims, 1)
    init = inits[0].reshape(inits[0].shape[:1] + (1,) * (red.ndim - 1))
    return combine(m, kind, init, red)


@register("stablehlo.reduce_window")
def reduce_window_rule(m, op, env, *operands):
    """StableHLO reduce_window: every window (padding and base dilation filled with the init
    value) reduced by the body. A recognised one-op body uses refsim's kernel, then folds the
    init in; any other body (or several operands) is interpreted tap by tap
    (`regions.reduce_window_generic`)."""
    k = len(operands) // 2
    xs, inits = operands[:k], operands[k:]
    kind = body_kind(op.regions[0]) if k == 1 else None
    if kind is None or inits[0].shape[0] != 1:
        from refsim.stablehlo.ops.regions import reduce_window_generic

        return reduce_window_generic(m, op, env, xs, inits)
    x, init = xs[0], inits[0]
    a = op.attrs
    r = x.ndim - 1
    dims = a["window_dimensions"]
    strides = a.get("window_strides") or (1,) * r
    pad = a.get("padding")
    pad = [tuple(int(v) for v in row) for row in pad] if pad is not None else [(0, 0)] * r
    base = a.get("base_dilations") or (1,) * r
    wdil = a.get("window_dilations") or (1,) * r
    init_s = np.asarray(init).reshape(-1)[0]
    w = R._windows(m.ctx, x, init_s, dims, strides, pad, base, wdil)
    red = R._reduce(kind, w, tuple(range(r, 2 * r)), 1)
    return combine(m, kind, init.reshape((1,) * red.ndim), red)
