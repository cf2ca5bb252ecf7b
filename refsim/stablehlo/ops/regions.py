"""Ops whose semantics are a region: sort's comparator, scatter's and select_and_scatter's
update computations, and reduce_window with any body.

A body refsim recognises (one add / max / min / ... of its arguments, `reduce.body_kind`)
runs refsim's kernel for it. Any other body is *interpreted*: the region is evaluated by the
machine on whole arrays at once (every device and every position in one call per step), so a
comparator, an update or a reduction is whatever the module says, never a guess.
"""
from __future__ import annotations

import types

import numpy as np

from refsim.interpreter.registry import RULES
from refsim.interpreter.rules import indexing as IX
from refsim.interpreter.rules import reductions as R
from refsim.interpreter.rules.sorting import total_order_key
from refsim.stablehlo.ops.reduce import body_kind, combine
from refsim.stablehlo.registry import UnsupportedOp, register

# ---- sort -----------------------------------------------------------------------------------

_ORDERED = {"LT": False, "GT": True}


def _simple_comparator(block):
    """(descending, compare_type) when the comparator is `compare(arg0, arg1, LT|GT)` on the first
    operand's pair (what lax.sort with one key and top_k emit), else None."""
    if len(block.ops) != 1 or len(block.returns) != 1:
        return None
    op = block.ops[0]
    if op.name != "stablehlo.compare" or op.results != block.returns:
        return None
    if tuple(op.operands) != (block.args[0], block.args[1]):
        return None
    direction = op.attrs.get("comparison_direction")
    ctype = op.attrs.get("compare_type")
    if direction not in _ORDERED or ctype not in ("TOTALORDER", "SIGNED", "UNSIGNED", None):
        return None
    return _ORDERED[direction], ctype


def _sort_by_comparator(m, op, env, xs, axis):
    """The stable order of every lane by the comparator region: element i goes to position
    #{j : comp(x_j, x_i)} + #{j < i : neither comp(x_i, x_j) nor comp(x_j, x_i)} (exact for a
    strict weak order, which StableHLO requires), one region evaluation over all pairs."""
    moved = [np.moveaxis(x, axis, -1) for x in xs]
    n = moved[0].shape[-1]
    pairs = []
    for x in moved:
        pairs += [x[..., :, None], x[..., None, :]]
    (less,) = m.scalar_region(op, 0, pairs, env)   # less[..., i, j] = comp(x_i, x_j)
    less = np.broadcast_to(np.asarray(less, bool), moved[0].shape[:-1] + (n, n))
    before = less.swapaxes(-1, -2).sum(axis=-1)                 # #{j : comp(x_j, x_i)}
    tie = ~less & ~less.swapaxes(-1, -2)
    earlier = np.tril(np.ones((n, n), bool), -1)                # j < i
    rank = before + (tie & earlier).sum(axis=-1)
    perm = np.argsort(rank, axis=-1, kind="stable")
    return [np.moveaxis(np.take_along_axis(x, perm, axis=-1), -1, axis) for x in moved]


@register("stablehlo.sort")
def sort_rule(m, op, env, *xs):
    """Sort every operand along `dimension` by the comparator region (stable)."""
    full = np.broadcast_arrays(*[np.asarray(x) for x in xs])
    shape0 = (max(x.shape[0] for x in xs),) + full[0].shape[1:]
    full = [np.broadcast_to(x, shape0[:1] + x.shape[1:]) for x in full]
    axis = 1 + op.attrs["dimension"]
    simple = _simple_comparator(op.regions[0])
    if simple is not None:
        descending, _ = simple
        key = total_order_key(np.ascontiguousarray(full[0]))
        perm = np.argsort(~key if descending else key, axis=axis, kind="stable")
        return [np.take_along_axis(x, perm, axis=axis) for x in full]
    return _sort_by_comparator(m, op, env, full, axis)


@register("chlo.top_k")
def chlo_top_k_rule(m, op, env, x):
    """The k largest entries of the last dim (IEEE total order, ties to the lower index), indices."""
    return RULES["top_k"](m.ctx, x, k=int(op.attrs["k"]))


@register("stablehlo.custom_call @TopK")
def xla_top_k_rule(m, op, env, x):
    """XLA:CPU's TopK custom call (what its passes turn a sort + slice into): the k largest
    entries of the last dim and their indices, as one tuple; k is the result's last dim."""
    import re

    shape = re.search(r"\[([\d,]*)\]", str(op.attrs.get("xla_shape", "")))
    k = int(shape.group(1).split(",")[-1]) if shape else None
    if k is None:
        raise UnsupportedOp("stablehlo.custom_call @TopK (no xla_shape to read k from)", op.loc.source)
    values, indices = RULES["top_k"](m.ctx, x, k=k)
    return [(values, indices)]


# ---- scatter --------------------------------------------------------------------------------

def _is_overwrite(block) -> bool:
    """True when the update computation returns its second argument (the update): a plain set."""
    return not block.ops and len(block.args) == 2 and tuple(block.returns) == (block.args[1],)


_SCATTER_KERNEL = {"sum": "scatter-add", "prod": "scatter-mul", "max": "scatter-max", "min": "scatter-min"}


@register("stablehlo.scatter")
def scatter_rule(m, op, env, *operands):
    """StableHLO scatter: each update window lands at its index (updates out of bounds are
    skipped), combined with the value there by the update computation, in update order."""
    k = (len(operands) - 1) // 2
    if k != 1:
        raise UnsupportedOp(f"stablehlo.scatter with {k} inputs (refsim runs single-input scatter)", op.loc.source)
    operand, indices, updates = operands
    dn = op.attrs["scatter_dimension_numbers"]
    rank = indices.ndim - 1
    ivd = dn.get("index_vector_dim", rank)
    if ivd == rank:
        indices = indices[..., None]
    elif ivd != rank - 1:
        indices = np.moveaxis(indices, 1 + ivd, -1)
    nums = types.SimpleNamespace(**{key: tuple(dn.get(key, ())) for key in (
        "update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims", "input_batching_dims",
        "scatter_indices_batching_dims")})
    nums.operand_batching_dims = nums.input_batching_dims
    block = op.regions[0]
    kind = body_kind(block)
    mode = "FILL_OR_DROP"
    common = dict(dimension_numbers=nums, indices_are_sorted=False, unique_indices=False, mode=mode,
                  update_consts=())
    if _is_overwrite(block):
        return RULES["scatter"](m.ctx, operand, indices, updates, update_jaxpr=None, **common)
    if kind in _SCATTER_KERNEL:
        return RULES[_SCATTER_KERNEL[kind]](m.ctx, operand, indices, updates, update_jaxpr=None, **common)
    out, sel, vals = IX._scatter_index(m.ctx, operand, indices, updates, nums, mode)

    def apply(old, upd):
        return m.scalar_region(op, 0, [old, upd], env)[0]

    return IX._combine_in_rounds(out, sel, vals, apply)


# ---- windows --------------------------------------------------------------------------------

def _window_attrs(op, r):
    a = op.attrs
    pad = a.get("padding")
    pad = [tuple(int(v) for v in row) for row in np.asarray(pad).reshape(-1, 2)] if pad is not None else [(0, 0)] * r
    return (tuple(a["window_dimensions"]), tuple(a.get("window_strides") or (1,) * r), pad,
            tuple(a.get("base_dilations") or (1,) * r), tuple(a.get("window_dilations") or (1,) * r))


def _scalar(init):
    init = np.asarray(init)
    if init.shape[0] != 1:
        raise ValueError("refsim.stablehlo: a window op with a per-device init value is not supported.")
    return init.reshape(-1)[0]


def reduce_window_generic(m, op, env, xs, inits):
    """reduce_window with any body: the body folded over each window's taps in row-major order,
    starting from the init values (every window and device at once, one region call per tap)."""
    r = xs[0].ndim - 1
    dims, strides, pad, base, wdil = _window_attrs(op, r)
    wins = [R._windows(m.ctx, x, _scalar(i), dims, strides, pad, base, wdil) for x, i in zip(xs, inits)]
    flat = [w.reshape(w.shape[:1 + r] + (-1,)) for w in wins]
    acc = [np.broadcast_to(np.asarray(i).reshape((1,) * (1 + r)), flat[0].shape[:-1]) for i in inits]
    for t in range(flat[0].shape[-1]):
        acc = m.scalar_region(op, 0, [*acc, *(f[..., t] for f in flat)], env)
    return acc


@register("stablehlo.select_and_scatter")
def select_and_scatter_rule(m, op, env, operand, source, init):
    """StableHLO select_and_scatter: in every window of `operand` the select region picks one
    element (the first tap, replaced by each later tap the region does not keep it over); each
    source value is combined into the picked position with the scatter region, starting from
    `init` (padding taps are never picked)."""
    r = operand.ndim - 1
    dims, strides, pad, _, _ = _window_attrs(op, r)
    ones = (1,) * r
    source = np.asarray(source)
    n = max(operand.shape[0], source.shape[0])
    operand = np.broadcast_to(operand, (n,) + operand.shape[1:])
    fill = np.zeros((), operand.dtype)
    wins = R._windows(m.ctx, operand, fill, dims, strides, pad, ones, ones)
    inside = R._windows(m.ctx, np.ones((1,) + operand.shape[1:], bool), np.zeros((), bool), dims, strides, pad,
                        ones, ones)
    flat = wins.reshape(wins.shape[:1 + r] + (-1,))
    valid = np.broadcast_to(inside.reshape(inside.shape[:1 + r] + (-1,)), flat.shape)
    best = flat[..., 0]
    best_t = np.zeros(best.shape, np.int64)
    have = valid[..., 0]
    for t in range(1, flat.shape[-1]):
        cand, ok = flat[..., t], valid[..., t]
        (keep,) = m.scalar_region(op, 0, [best, cand], env)
        take = ok & (~have | ~np.asarray(keep, bool))
        best = np.where(take, cand, best)
        best_t = np.where(take, t, best_t)
        have = have | ok
    offs = np.unravel_index(best_t, dims)
    grids = np.indices(best.shape, sparse=True)
    coords = [grids[1 + d] * strides[d] + offs[d] - pad[d][0] for d in range(r)]
    src = np.broadcast_to(source, (n,) + source.shape[1:])
    out = np.array(np.broadcast_to(np.asarray(init).reshape((1,) * (1 + r)), (n,) + operand.shape[1:]))
    sel = (np.broadcast_to(grids[0], best.shape),) + tuple(np.broadcast_to(c, best.shape) for c in coords)
    mask = have
    sel = tuple(s[mask] for s in sel)
    vals = src[mask]
    kind = body_kind(op.regions[1])
    if kind is not None:
        return IX._combine_in_rounds(out, sel, vals, lambda a, b: combine(m, kind, a, b))

    def apply(old, upd):
        return m.scalar_region(op, 1, [old, upd], env)[0]

    return IX._combine_in_rounds(out, sel, vals, apply)
