"""Unreduced layouts: where the partial sums of a value sit when it is unreduced over mesh axes.

`NamedSharding(mesh, P(..., unreduced={'x'}))` lays out a value whose devices along 'x' each
hold a *partial* value: the global value is their sum (`jax._src.core.getu`: reading it
needs an all-reduce). Two things follow, both pure layout:

* `partial_sums`: the devices' blocks tiled back, one partial global value per position along
  the unreduced axes (shape: each unreduced axis' size, 1 for the other mesh axes, + shape);
* `held_mask` / `decompose`: how JAX splits a plain value into partial sums when it is moved
  into an unreduced layout (reshard, device_put, out_shardings): each device keeps what it
  already holds, zeros elsewhere, so every element is counted once.

A *reduced* axis (`P(reduced={'x'})`) is a replicated layout whose type says its cotangent is
unreduced: the data is laid out as a replicated value.
"""
from __future__ import annotations

import numpy as np

from refsim.layouts.partition_spec import PartitionSpec
from refsim.layouts.stacking import replica_mismatch


def _names(entry) -> tuple:
    names = tuple(entry) if isinstance(entry, (tuple, list)) else (() if entry is None else (entry,))
    return tuple(a for a in names if isinstance(a, str))


def _entries(spec) -> tuple:
    return tuple(getattr(spec, "partitions", spec)) if spec is not None else ()


def _along(mesh, axis: str, values: np.ndarray, rank: int) -> np.ndarray:
    """`values` (one per position along `axis`) shaped to broadcast over mesh dims + `rank` dims."""
    k = mesh.axis_index(axis)
    return values.reshape((1,) * k + (-1,) + (1,) * (mesh.ndim - k - 1) + (1,) * rank)


def kept_cut(spec, target, axes, rank: int) -> tuple:
    """The dimension entries of `spec` whose blocks survive a move into a layout unreduced over
    `axes` and cut by `target` (the others become None: that dimension is first gathered).

    Measured on XLA:CPU (jax 0.10.2 and 0.12), dimension by dimension: one that `spec` cuts
    over axes of `axes` keeps its blocks when it names them last (minor) and `target` cuts it
    over exactly the axes before them (P(('x', 'z')) into P('x', unreduced={'z'})); otherwise
    XLA first moves it to `target`'s cut, replicated over those axes (P('x') into
    P('y', unreduced={'x'}); P('x', 'y') into P('z', None, unreduced={'x', 'y'}) gathers
    dimension 0 and keeps dimension 1's blocks). A dimension `spec` does not cut over `axes`
    may be recut freely: that moves data only between devices at one position along `axes`.
    """
    entries = _entries(spec) + (None,) * max(0, rank - len(_entries(spec)))
    targets = _entries(target) + (None,) * max(0, rank - len(_entries(target)))
    out = []
    for e, t in zip(entries[:rank], targets[:rank]):
        names = _names(e)
        first = next((i for i, a in enumerate(names) if a in axes), None)
        keep = first is None or (all(a in axes for a in names[first:]) and names[:first] == _names(t))
        out.append(e if keep else None)
    return tuple(out)


def held_mask(shape: tuple, spec, mesh, axes, target=None) -> np.ndarray:
    """Which device along `axes` contributes each element when a value laid out by `spec`
    becomes unreduced over `axes`, laid out by `target`'s dimension entries (JAX's reshard /
    device_put / out_shardings to `unreduced`).

    Along the dimensions `kept_cut` keeps, XLA keeps on every device what it already holds and zeros
    elsewhere, so each element is counted once: along an axis of `axes` that `spec` shards a dimension over, the device
    holding the element's block contributes it; along one `spec` replicates over, the device
    at position 0 (JAX's `test_identity_jit_out_unreduced`: a replicated [0 1 2 3] becomes
    [0 1 2 3] and [0 0 0 0], a P('x')-sharded one [0 1 0 0] and [0 0 2 3]). Along the
    others XLA first gathers the value, so the devices at position 0 along those axes hold
    it. `spec` None: the value is replicated;
    `target` None: the cut `spec` implies. Returns a boolean array of shape (each mesh axis'
    size for the axes in `axes`, 1 for the others) + `shape`.
    """
    nm, rank = mesh.ndim, len(shape)
    if target is not None:
        spec = kept_cut(spec, target, axes, rank)
    mask = np.ones((1,) * (nm + rank), bool)
    entries, named = _entries(spec), set()
    for d, n in enumerate(shape):
        names = _names(entries[d]) if d < len(entries) else ()
        if not names:
            continue
        sizes = [mesh.axis_size(a) for a in names]
        block = np.arange(n) // max(1, n // int(np.prod(sizes, dtype=np.int64)))
        for i, a in enumerate(names):
            if a not in axes:
                continue
            named.add(a)
            coord = (block // int(np.prod(sizes[i + 1:], dtype=np.int64))) % sizes[i]
            coord = coord.reshape((1,) * (nm + d) + (n,) + (1,) * (rank - d - 1))
            mask = mask & (_along(mesh, a, np.arange(sizes[i]), rank) == coord)
    for a in axes:
        if a not in named:
            mask = mask & _along(mesh, a, np.arange(mesh.axis_size(a)) == 0, rank)
    return mask


def decompose(value: np.ndarray, spec, mesh, axes, target=None) -> np.ndarray:
    """The partial sums (`partial_sums`' shape) JAX gives a plain `value` laid out by `spec`
    when it moves into a layout unreduced over `axes` and cut by `target`: `value` where
    `held_mask`, else 0."""
    value = np.asarray(value)
    mask = held_mask(value.shape, spec, mesh, frozenset(axes), target)
    return np.where(mask, value.reshape((1,) * mesh.ndim + value.shape), np.zeros((), value.dtype))


def partial_sums(stacked: np.ndarray, mesh, spec) -> np.ndarray:
    """The partial global values of an unreduced layout: `stacked` (each device's block,
    `mesh.axis_sizes + block shape`) tiled back by `spec`'s dimension entries, keeping one
    partial value per position along `spec.unreduced`; shape (each unreduced axis' size, 1
    for the other mesh axes) + global shape.

    Devices along the axes `spec` neither names nor leaves unreduced are replicas: ValueError
    when they disagree (as reading a replicated Array checks); position 0 is kept.
    """
    ur = set(spec.unreduced)
    dims = PartitionSpec(*spec)
    used = {a for e in _entries(dims) for a in _names(e)}
    replicas = [k for k, a in enumerate(mesh.axis_names) if a not in ur and a not in used]
    bad = replica_mismatch(stacked, mesh.ndim, replicas)
    if bad is not None:
        pos_a, pos_b, index = bad
        raise ValueError(
            f"devices at mesh positions {pos_a} and {pos_b} of a layout unreduced over {sorted(ur)} "
            f"({spec!r}) are replicas (the spec neither names nor leaves unreduced the axes between "
            f"them) but hold different partial sums, first at local index {index}; give every "
            "replica the same block.")
    kept = [a for a in mesh.axis_names if a in ur or a in used]
    y = stacked[tuple(slice(None) if a in kept else 0 for a in mesh.axis_names)]
    local = y.shape[len(kept):]
    order = [kept.index(a) for a in mesh.axis_names if a in ur]
    shape = []
    for d, n in enumerate(local):
        axes = _names(_entries(dims)[d]) if d < len(_entries(dims)) else ()
        order.extend(kept.index(a) for a in axes)
        order.append(len(kept) + d)
        shape.append(n * int(np.prod([mesh.axis_size(a) for a in axes], dtype=np.int64)))
    lead = tuple(mesh.axis_size(a) if a in ur else 1 for a in mesh.axis_names)
    return np.ascontiguousarray(y.transpose(order)).reshape(lead + tuple(shape))


def stacked_of_partials(parts: np.ndarray, mesh, spec) -> np.ndarray:
    """Inverse of `partial_sums`: each device's block (`mesh.axis_sizes + block shape`) of the
    partial values `parts`, cut by `spec`'s dimension entries."""
    from refsim.layouts.stacking import global_to_stacked

    dims = PartitionSpec(*spec)
    nm = mesh.ndim
    out = None
    for u in np.ndindex(*parts.shape[:nm]):
        blocks = global_to_stacked(parts[u], mesh, dims)
        if out is None:
            out = np.empty(blocks.shape, parts.dtype)
        sel = tuple(u[k] if parts.shape[k] > 1 else slice(None) for k in range(nm))
        out[sel] = blocks[sel]
    return out
