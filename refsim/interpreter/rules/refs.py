"""Mutable array references: `jax.new_ref`, `ref[idx]` reads, writes and `+=`, `jax.freeze`.

A Ref is a `RefCell` holding one stacked ndarray (mesh dims first, as every refsim value).
`get` reads `ref[indexer]`, `swap` writes a value and returns the old one, `addupdate` adds
in place, `freeze` returns the current value; the cell is shared by every equation that
holds the reference, so writes inside `jit`, `scan` and `while` bodies are seen afterwards,
as with JAX's refs. Indexers are JAX's `NDIndexer`s (`jax/_src/state/indexing.py`): static
or dynamic `Slice(start, size, stride)` and integer (array) indices with NumPy semantics;
dynamic starts and integer indices are clamped into range as `dynamic_slice` clamps them.
"""
from __future__ import annotations

import numpy as np

from refsim import compat
from refsim.interpreter.registry import register
from refsim.interpreter.rules import _util as U


class RefCell:
    """The storage of one mutable reference: a stacked ndarray replaced in place on writes."""

    __slots__ = ("value",)

    def __init__(self, value: np.ndarray):
        self.value = value

    def __repr__(self):
        return f"RefCell(shape={self.value.shape}, dtype={self.value.dtype})"


class _Leaf:
    """Placeholder for the k-th dynamic index operand inside an unflattened indexer."""

    __slots__ = ("k",)

    def __init__(self, k: int):
        self.k = k


def _transforms(tree, n: int):
    import jax

    return jax.tree_util.tree_unflatten(tree, [_Leaf(k) for k in range(n)])


def _invariant(x, nm) -> bool:
    return np.ndim(x) < nm or all(d == 1 for d in np.shape(x)[:nm])


def _local_index(indexer, leaf_local, shape: tuple) -> tuple:
    """One device's NumPy index for `indexer` over a local array of `shape`."""
    out = []
    for dim, idx in zip(shape, indexer.indices):
        if hasattr(idx, "start") and hasattr(idx, "size"):  # a Slice
            start = int(np.asarray(leaf_local(idx.start)))
            size, stride = int(idx.size), int(getattr(idx, "stride", 1) or 1)
            start = min(max(start, 0), max(dim - ((size - 1) * stride + 1), 0))
            out.append(slice(start, start + (size - 1) * stride + 1 if size else start, stride))
        else:
            val = np.asarray(leaf_local(idx))
            val = np.where(val < 0, val + dim, val).clip(0, dim - 1) if val.size else val
            out.append(int(val) if val.ndim == 0 else val)
    return tuple(out)


def _apply(ctx, cell: RefCell, tree, leaves, fn):
    """Call fn(stacked view, index) for each device group that shares one index.

    With device-invariant index operands there is one call over all devices at once;
    indices that differ per device are applied device by device.
    """
    nm = ctx.nm
    leaves = [np.asarray(x) for x in leaves]
    transforms = _transforms(tree, len(leaves))
    for t in transforms:
        if not hasattr(t, "indices"):
            raise TypeError(f"ref transform {type(t).__name__} has no refsim rule; refsim indexes refs "
                            "with NDIndexer (ref[...], ref[i], ref[a:b]) only.")
    if len(transforms) > 1:
        raise TypeError("refsim applies one indexer per ref access; chained ref transforms "
                        f"({len(transforms)} of them) are not supported.")
    local_shape = cell.value.shape[nm:]
    if not transforms:
        return fn((slice(None),) * nm)
    (indexer,) = transforms
    if all(_invariant(x, nm) for x in leaves):
        def whole(v):
            if not isinstance(v, _Leaf):
                return v  # a static start / index
            x = leaves[v.k]
            return x.reshape(x.shape[nm:]) if nm and x.ndim >= nm else x
        idx = _local_index(indexer, whole, local_shape)
        return fn((slice(None),) * nm + idx)
    results = {}
    for pos in np.ndindex(*cell.value.shape[:nm]):
        def pick(v, pos=pos):
            if not isinstance(v, _Leaf):
                return v
            x = leaves[v.k]
            return x[tuple(p if x.shape[j] > 1 else 0 for j, p in enumerate(pos))]
        results[pos] = fn(pos + _local_index(indexer, pick, local_shape))
    return results


def _full(ctx, cell: RefCell, *others) -> None:
    """Give the cell's value full size along mesh dims any written operand varies over."""
    nm = ctx.nm
    if not nm:
        return
    m = U.mesh_shape(nm, cell.value, *[np.asarray(o) for o in others])
    if cell.value.shape[:nm] != m or not cell.value.flags.writeable:
        cell.value = np.array(np.broadcast_to(cell.value, m + cell.value.shape[nm:]))


def _stack_results(ctx, res, shape_of):
    if not isinstance(res, dict):
        return np.array(res)
    positions = list(res)
    first = np.asarray(res[positions[0]])
    out = np.empty(tuple(np.max(positions, axis=0) + 1) + first.shape, first.dtype)
    for pos, v in res.items():
        out[pos] = v
    return out


@register("new_ref")
def new_ref_rule(ctx, x, *, memory_space=None, kind=None, pin=None):
    """`jax.new_ref(x)`: a fresh cell holding a copy of x."""
    return RefCell(np.array(x, copy=True))


@register("empty_ref")
def empty_ref_rule(ctx, *, ty, memory_space=None):
    """`jax.empty_ref(ty)`: a cell of the declared type; refsim fills it with zeros."""
    aval = getattr(ty, "inner_aval", ty)
    return RefCell(np.zeros((1,) * ctx.nm + tuple(aval.shape), compat.physical_dtype(aval.dtype)))


@register("free_ref")
def free_ref_rule(ctx, ref):
    return []


@register("freeze")
def freeze_rule(ctx, ref):
    """`jax.freeze(ref)`: the current value (the cell is not used afterwards)."""
    return np.array(ref.value)


@register("get")
def get_rule(ctx, ref, *idx, tree):
    """`ref[indexer]`: the indexed value."""
    return _stack_results(ctx, _apply(ctx, ref, tree, idx, lambda i: np.array(ref.value[i])), None)


@register("swap")
def swap_rule(ctx, ref, val, *idx, tree):
    """`ref[indexer] = val`: write val, return the value it replaced."""
    _full(ctx, ref, val, *idx)
    val = np.asarray(val)

    def write(i):
        old = np.array(ref.value[i])
        ref.value[i] = _piece(ctx, val, i)
        return old
    return _stack_results(ctx, _apply(ctx, ref, tree, idx, write), None)


@register("addupdate")
def addupdate_rule(ctx, ref, val, *idx, tree):
    """`ref[indexer] += val` (no result)."""
    _full(ctx, ref, val, *idx)
    val = np.asarray(val)

    def add(i):
        with np.errstate(over="ignore"):
            ref.value[i] = ref.value[i] + _piece(ctx, val, i)
    _apply(ctx, ref, tree, idx, add)
    return []


def _piece(ctx, val, i):
    """The part of stacked `val` that goes to index `i` (all devices, or one device's block)."""
    nm = ctx.nm
    if nm and all(isinstance(p, (int, np.integer)) for p in i[:nm]):  # one device
        return val[tuple(p if val.shape[k] > 1 else 0 for k, p in enumerate(i[:nm]))]
    return val
