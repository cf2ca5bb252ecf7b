"""Indexing primitives: slice, dynamic_slice, dynamic_update_slice, gather, scatter family.

Semantics follow the StableHLO ops (``slice``, ``dynamic_slice`` and
``dynamic_update_slice`` clamp start indices so the whole window is in bounds;
``gather``/``scatter`` with batching dims) and JAX's ``GatherScatterMode``
(jax/_src/lax/slicing.py): CLIP clamps the window start, FILL_OR_DROP fills a gathered
window / drops a scattered window that is not entirely in bounds, PROMISE_IN_BOUNDS
behaves as XLA does (gather clamps, scatter drops).

Per-device start indices are handled without a loop over devices: the mesh dims are
treated as extra batch dims of one fancy-indexing call.
"""
from __future__ import annotations

import numpy as np

from refsim.interpreter.registry import register
from refsim.interpreter.rules import _util as U


def _mode_name(mode) -> str:
    name = getattr(mode, "name", None) or str(mode).split(".")[-1]
    if name not in ("CLIP", "FILL_OR_DROP", "PROMISE_IN_BOUNDS"):
        raise ValueError(
            f"gather/scatter: mode={mode!r} is not a mode the primitive executes; use 'clip', "
            "'fill' or 'promise_in_bounds' (JAX rewrites 'one_hot' before binding)."
        )
    return name


@register("slice")
def slice_rule(ctx, x, *, start_indices, limit_indices, strides):
    """StableHLO slice of the local dims (a view)."""
    strides = strides or (1,) * len(start_indices)
    idx = tuple(slice(s, l, st) for s, l, st in zip(start_indices, limit_indices, strides))
    return x[(slice(None),) * ctx.nm + idx]


def _starts(nm, starts, dims, sizes):
    """Per-dim clamped start indices, each with the starts' own mesh dims (int64)."""
    out = []
    for s, n, k in zip(starts, dims, sizes):
        out.append(np.clip(np.asarray(s).astype(np.int64), 0, n - k))
    return out


def _window_index(nm, m, starts, sizes):
    """Fancy indices (mesh dims, then one per local dim) for windows at per-device starts."""
    r = len(sizes)
    total = nm + r
    idx = U.mesh_index(nm, m, total)
    for d, (s, k) in enumerate(zip(starts, sizes)):
        shape = [1] * total
        shape[nm + d] = k
        idx.append(s.reshape(s.shape[:nm] + (1,) * r) + np.arange(k).reshape(shape))
    return tuple(idx)


def _invariant(nm, arrays) -> bool:
    return all(a.shape[:nm] == (1,) * nm for a in arrays)


@register("dynamic_slice")
def dynamic_slice_rule(ctx, x, *starts_and_dyn, slice_sizes):
    """Window of `slice_sizes` at starts clamped into [0, dim - size] (StableHLO dynamic_slice)."""
    nm = ctx.nm
    local = x.shape[nm:]
    starts = starts_and_dyn[: len(local)]
    cl = _starts(nm, starts, local, slice_sizes)
    if _invariant(nm, cl):
        idx = tuple(slice(int(s.reshape(())), int(s.reshape(())) + k) for s, k in zip(cl, slice_sizes))
        return x[(slice(None),) * nm + idx]
    m = U.mesh_shape(nm, x, *cl)
    return x[_window_index(nm, x.shape[:nm], cl, slice_sizes)].reshape(m + tuple(slice_sizes))


@register("dynamic_update_slice")
def dynamic_update_slice_rule(ctx, x, update, *starts):
    """`update` written at starts clamped into [0, dim - update dim] (StableHLO)."""
    nm = ctx.nm
    local = x.shape[nm:]
    sizes = update.shape[nm:]
    cl = _starts(nm, starts, local, sizes)
    m = U.mesh_shape(nm, x, update, *cl)
    out = np.array(np.broadcast_to(x, m + local))
    if _invariant(nm, cl):
        idx = tuple(slice(int(s.reshape(())), int(s.reshape(())) + k) for s, k in zip(cl, sizes))
        out[(slice(None),) * nm + idx] = update
    else:
        out[_window_index(nm, m, cl, sizes)] = update
    return out


# --- gather --------------------------------------------------------------------------------

def _default_fill(dtype):
    """JAX's FILL_OR_DROP default: NaN, INT_MIN (signed), UINT_MAX (unsigned), True (bool)."""
    if U.is_inexact(dtype):
        return np.nan
    if U.is_signed_int(dtype):
        return U.iinfo(dtype).min
    if U.is_unsigned_int(dtype):
        return U.iinfo(dtype).max
    if np.dtype(dtype) == bool:
        return True
    if np.dtype(dtype).fields:  # PRNG keys: every word all ones, as JAX fills keys
        return np.full((), np.iinfo(np.uint32).max, dtype=np.uint32)
    raise TypeError(f"gather: no default fill_value for dtype {dtype}; pass fill_value.")


def _fill_array(fill, dtype):
    dtype = np.dtype(dtype)
    if dtype.fields:
        words = np.broadcast_to(np.asarray(fill, np.uint32), dtype[0].shape)
        return np.ascontiguousarray(words).view(dtype).reshape(())
    return np.asarray(fill).astype(dtype)


@register("gather")
def gather_rule(ctx, operand, indices, *, dimension_numbers, slice_sizes, indices_are_sorted,
                unique_indices, mode, fill_value):
    """StableHLO gather (index vector = last indices dim, as JAX binds it) with batching dims."""
    nm = ctx.nm
    dn = dimension_numbers
    mode = _mode_name(mode)
    oshape = operand.shape[nm:]
    batch_shape = indices.shape[nm:-1]
    out_rank = len(batch_shape) + len(dn.offset_dims)
    total = nm + out_rank
    batch_pos = [p for p in range(out_rank) if p not in dn.offset_dims]
    offset_operand = [d for d in range(len(oshape))
                      if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims]
    offset_axes = tuple(nm + p for p in dn.offset_dims)

    def place(a):  # mesh + batch dims -> all output dims
        return np.expand_dims(a, offset_axes) if offset_axes else a

    ind = np.asarray(indices).astype(np.int64)
    idx = U.mesh_index(nm, operand.shape[:nm], total)
    valid = None
    for d in range(len(oshape)):
        term = np.zeros((1,) * total, dtype=np.int64)
        if d in dn.start_index_map:
            s = ind[..., list(dn.start_index_map).index(d)]
            hi = oshape[d] - slice_sizes[d]
            if mode == "FILL_OR_DROP":
                ok = (s >= 0) & (s <= hi)
                valid = ok if valid is None else valid & ok
            term = place(np.clip(s, 0, hi))
        if d in dn.operand_batching_dims:
            ib = dn.start_indices_batching_dims[list(dn.operand_batching_dims).index(d)]
            shape = [1] * total
            shape[nm + batch_pos[ib]] = batch_shape[ib]
            term = term + np.arange(batch_shape[ib]).reshape(shape)
        if d in offset_operand:
            shape = [1] * total
            shape[nm + dn.offset_dims[offset_operand.index(d)]] = slice_sizes[d]
            term = term + np.arange(slice_sizes[d]).reshape(shape)
        idx.append(term)
    out = operand[tuple(idx)]
    m = U.mesh_shape(nm, operand, indices)
    out_local = [0] * out_rank
    for p, n in zip(batch_pos, batch_shape):
        out_local[p] = n
    for p, d in zip(dn.offset_dims, offset_operand):
        out_local[p] = slice_sizes[d]
    out = np.broadcast_to(out, m + tuple(out_local))
    if valid is not None:
        fill = _fill_array(_default_fill(operand.dtype) if fill_value is None else fill_value,
                           operand.dtype)
        out = np.where(place(valid), out, fill)
    return out


# --- scatter -------------------------------------------------------------------------------

def _scatter_index(ctx, operand, indices, updates, dn, mode):
    """Full fancy indices into the mesh-broadcast operand for every update element, and the
    mask of update windows to apply (the others are dropped or were clamped)."""
    nm = ctx.nm
    mode = _mode_name(mode)
    oshape = operand.shape[nm:]
    ushape = updates.shape[nm:]
    m = U.mesh_shape(nm, operand, indices, updates)
    total = nm + len(ushape)
    full = m + tuple(ushape)
    scatter_pos = [p for p in range(len(ushape)) if p not in dn.update_window_dims]
    window_operand = [d for d in range(len(oshape))
                      if d not in dn.inserted_window_dims and d not in dn.operand_batching_dims]
    window_axes = tuple(nm + p for p in dn.update_window_dims)

    def place(a):
        return np.expand_dims(a, window_axes) if window_axes else a

    ind = np.asarray(indices).astype(np.int64)
    idx = U.mesh_index(nm, m, total)
    valid = np.ones((1,) * total, dtype=bool)
    for d in range(len(oshape)):
        term = np.zeros((1,) * total, dtype=np.int64)
        w = ushape[dn.update_window_dims[window_operand.index(d)]] if d in window_operand else 1
        if d in dn.scatter_dims_to_operand_dims:
            s = ind[..., list(dn.scatter_dims_to_operand_dims).index(d)]
            hi = oshape[d] - w
            if mode == "CLIP":
                s = np.clip(s, 0, hi)
            else:
                valid = valid & place((s >= 0) & (s <= hi))
            term = place(s)
        if d in dn.operand_batching_dims:
            ib = dn.scatter_indices_batching_dims[list(dn.operand_batching_dims).index(d)]
            pos = scatter_pos[ib]
            shape = [1] * total
            shape[nm + pos] = ushape[pos]
            term = term + np.arange(ushape[pos]).reshape(shape)
        if d in window_operand:
            pos = dn.update_window_dims[window_operand.index(d)]
            shape = [1] * total
            shape[nm + pos] = w
            term = term + np.arange(w).reshape(shape)
        idx.append(term)
    valid = np.broadcast_to(valid, full)
    sel = tuple(np.broadcast_to(i, full)[valid] for i in idx)
    vals = np.broadcast_to(updates, full)[valid]
    # C order: `_combine_in_rounds` updates `out` through a flat view, which a copy in the operand's
    # own (e.g. transposed) order would not be
    out = np.array(np.broadcast_to(operand, m + tuple(oshape)), order="C")
    return out, sel, vals


def _combine_in_rounds(out, sel, vals, combine):
    """Apply `combine(old, update)` per update, in update order, with no Python loop over
    elements: each round applies the next not-yet-applied update of every target index."""
    if not len(vals):
        return out
    flat = np.ravel_multi_index(sel, out.shape)
    order = np.argsort(flat, kind="stable")
    sorted_flat = flat[order]
    first = np.r_[True, sorted_flat[1:] != sorted_flat[:-1]]
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(flat)), 0))
    rank = np.empty_like(order)
    rank[order] = np.arange(len(flat)) - group_start
    view = out.reshape(-1)
    for r in range(int(rank.max()) + 1):
        pick = rank == r
        tgt = flat[pick]
        view[tgt] = combine(view[tgt], vals[pick])
    return out


_UFUNC_AT = {
    "scatter-add": np.add, "scatter-sub": np.subtract, "scatter-mul": np.multiply,
}


def _make_scatter(name):
    def rule(ctx, operand, indices, updates, *, dimension_numbers, indices_are_sorted,
             unique_indices, mode, update_jaxpr, update_consts):
        out, sel, vals = _scatter_index(ctx, operand, indices, updates, dimension_numbers, mode)
        if out.ndim == 0:
            # a 0-d operand (x.at[()].set(v)): no index dimension at all; apply the updates to a
            # one-element view and give the scalar back
            one = _combine(out.reshape(1), (np.zeros(np.size(vals), np.intp),), np.ravel(vals), update_jaxpr,
                           update_consts)
            return one.reshape(())
        return _combine(out, sel, vals, update_jaxpr, update_consts)

    def _combine(out, sel, vals, update_jaxpr, update_consts):
        cd = U.compute_dtype(out.dtype)
        if name == "scatter":
            if update_jaxpr is None:
                out[sel] = vals  # duplicates: the last update in order wins, as XLA:CPU
                return out
            return _combine_in_rounds(out, sel, vals, _jaxpr_combiner(update_jaxpr, update_consts))
        if name in ("scatter-max", "scatter-min"):
            from refsim.interpreter.rules.elementwise import _max, _min

            fn = _max if name == "scatter-max" else _min
            return _combine_in_rounds(out, sel, vals, fn)
        ufunc = _UFUNC_AT[name]
        if out.dtype == bool:  # bool scatter-add is logical or, scatter-mul logical and
            ufunc = {np.add: np.logical_or, np.multiply: np.logical_and}.get(ufunc, ufunc)
        if cd != out.dtype:  # narrow floats: each combine rounds back to the narrow type
            return _combine_in_rounds(
                out, sel, vals, lambda a, b: ufunc(a.astype(cd), b.astype(cd)).astype(out.dtype))
        with np.errstate(all="ignore"):
            ufunc.at(out, sel, vals)
        return out

    rule.__name__ = rule.__qualname__ = name.replace("-", "_") + "_rule"
    rule.__doc__ = (f"`{name}`: StableHLO scatter whose update computation is "
                    f"{name.split('-')[-1] if '-' in name else 'overwrite or update_jaxpr'}; "
                    "updates to one index combine in update order.")
    return rule


def _jaxpr_combiner(update_jaxpr, update_consts):
    """The scatter's scalar update computation evaluated on vectors (one leading dim)."""
    from refsim.interpreter.core import eval_jaxpr
    from refsim.interpreter.registry import Context

    jaxpr = getattr(update_jaxpr, "jaxpr", update_jaxpr)
    consts = [np.asarray(c).reshape(1) for c in update_consts]

    def combine(old, upd):
        return eval_jaxpr(jaxpr, consts, old, upd, ctx=Context(nm=1))[0]

    return combine


for _name in ("scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max"):
    register(_name)(_make_scatter(_name))
