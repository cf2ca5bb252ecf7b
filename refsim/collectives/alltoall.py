"""All-to-all kernel (StableHLO `all_to_all`).

The member at group position j splits its operand into `group_size` equal blocks
along `split_axis` and sends block i to position i; every member concatenates the
blocks it receives along `concat_axis` in ascending sender position. At the
primitive level this is always "tiled" (JAX's untiled `all_to_all` adds and
squeezes a size-1 dimension around the primitive).

The data movement is one axis swap of the stacked value, materialised by
`transpose_copy`, a cache-blocked copy: at 4096 devices with one element per block
a plain strided copy reads every element from a different cache line. Large copies
split their tiles over a few threads (`threads()`, ``$REFSIM_NUM_THREADS``); the
tiles are disjoint, so the bits do not depend on the thread count.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from refsim.collectives.gather import check_dimension
from refsim.collectives.groups import GroupLayout, device_groups, member_index
from refsim.compat import reshape_view

# A tile of the swapped axes is staged through one buffer that stays in L2. Runs of
# more than `_WIDE_RUN` contiguous bytes on both sides already stream well, and
# arrays under `_SMALL` fit in cache: both are copied by NumPy directly.
_TILE_BYTES = 1 << 18
_WIDE_RUN = 128
_SMALL = 1 << 20
_PAD_BYTES = 64  # one cache line of padding per buffer row breaks power-of-two aliasing
# Below this a copy takes about a millisecond, less than handing tiles to threads is worth.
_PARALLEL_BYTES = 8 << 20
_MAX_THREADS = 8


def _coalesce(v: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and strides of `v` with size-1 dims dropped and adjacent dims merged
    wherever `v` is contiguous across them (a C-order copy is unchanged by this)."""
    shape, strides = [], []
    for n, s in zip(v.shape, v.strides):
        if n == 1:
            continue
        if shape and strides[-1] == s * n:
            shape[-1] *= n
            strides[-1] = s
        else:
            shape.append(n)
            strides.append(s)
    return tuple(shape), tuple(strides)


def _buffer(shape, order, item: int) -> np.ndarray:
    """An empty buffer for a tile of logical `shape`, its axes laid out in memory order
    `order` (outermost first) and its rows padded by at least `_PAD_BYTES`, so that
    rows a power of two apart do not collide in a set-associative cache."""
    laid = [shape[i] for i in order]
    laid[-1] += -(-_PAD_BYTES // item)
    return laid


def _view(base, shape, order):
    idx = tuple(slice(0, shape[i]) for i in order)
    return base[idx].transpose(np.argsort(order))


def _tiled_copy(dst: np.ndarray, src: np.ndarray, p: int, q: int, tp: int, tq: int):
    """dst[...] = src, tile by tile over axes p and q (q is dst's contiguous axis).

    Each tile is read in the source's memory order into a padded buffer, then
    written in the destination's order, so both big arrays are walked in runs.
    Copies of at least `_PARALLEL_BYTES` split their rows of tiles over `threads()`
    threads (NumPy's copy loops release the GIL); tiles are disjoint, so the result
    is the same bits for any thread count.
    """
    starts = range(0, src.shape[p], tp)
    n = min(threads(), len(starts)) if src.nbytes >= _PARALLEL_BYTES else 1
    if n <= 1:
        _copy_tile_rows(dst, src, p, q, tp, tq, starts)
        return
    futures = [_pool(n).submit(_copy_tile_rows, dst, src, p, q, tp, tq, starts[t::n]) for t in range(n)]
    for f in futures:
        f.result()  # re-raises a thread's exception here


def _copy_tile_rows(dst, src, p, q, tp, tq, p_starts) -> None:
    """The tiles of `_tiled_copy` whose offset along p is in `p_starts`, through one staging buffer."""
    ndim = src.ndim
    full = list(src.shape)
    full[p], full[q] = min(tp, full[p]), min(tq, full[q])
    order = sorted(range(ndim), key=lambda i: (-abs(src.strides[i]), i))
    base = np.empty(_buffer(full, order, src.itemsize), src.dtype)
    # At most four tile shapes (full, and trimmed at the end of p and/or q): their
    # staging views are built once, not per tile (a view costs ~15 us, and a
    # 4096 x 4096 transpose has 256 tiles).
    stages = {}
    idx = [slice(None)] * ndim
    for p0 in p_starts:
        idx[p] = slice(p0, p0 + tp)
        for q0 in range(0, src.shape[q], tq):
            idx[q] = slice(q0, q0 + tq)
            key = tuple(idx)
            tile = src[key]
            stage = stages.get(tile.shape)
            if stage is None:
                stage = stages[tile.shape] = _view(base, tile.shape, order)
            np.copyto(stage, tile)
            np.copyto(dst[key], stage)


def threads() -> int:
    """Threads a large blocked copy uses: ``$REFSIM_NUM_THREADS`` if set, else the CPUs this
    process may run on, at most `_MAX_THREADS` (a copy is memory-bound beyond a few)."""
    env = os.environ.get("REFSIM_NUM_THREADS", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"REFSIM_NUM_THREADS={env!r} is not an integer; set it to the number of threads "
                             "refsim's copy kernel may use (1 turns threading off).") from None
        if n < 1:
            raise ValueError(f"REFSIM_NUM_THREADS={env!r}; set it to a positive number of threads (1: no threads).")
        return n
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, _MAX_THREADS))


_POOLS: dict = {}
_POOL_LOCK = threading.Lock()
# A forked child has none of the parent's pool threads: it starts its own pools.
os.register_at_fork(after_in_child=_POOLS.clear)


def _pool(n: int) -> ThreadPoolExecutor:
    """One shared pool of `n` threads (created on first use)."""
    with _POOL_LOCK:
        pool = _POOLS.get(n)
        if pool is None:
            pool = _POOLS[n] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="refsim-copy")
        return pool


def _pow2_at_most(n: int) -> int:
    return 1 << max(0, int(n).bit_length() - 1)


def _as_wide(a: np.ndarray, shape, nbytes: int) -> np.ndarray:
    """`a` (coalesced to `shape`) with its contiguous last axis of `nbytes` bytes read
    as one element: an unsigned int of that width, else raw bytes (void)."""
    wide = np.dtype(f"u{nbytes}") if nbytes in (1, 2, 4, 8) else np.dtype(f"V{nbytes}")
    return a.reshape(shape).view(wide)[..., 0]


def transpose_copy(v: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of the (possibly strided) array `v`, equal to `np.array(v)`.

    When the result's contiguous runs are short and lie far apart in `v` (an axis
    swap), the copy goes through cache-sized tiles of the axis innermost in `v` and
    the axis innermost in the result. Short runs contiguous on both sides are first
    read as single wide elements (bit-exact: nothing is converted), because NumPy's
    copy loops cost about the same per run as per element.
    """
    out = np.empty(v.shape, v.dtype)
    _copy_into_c(out, v)
    return out


def empty_in_order_of(shape, like: np.ndarray) -> np.ndarray:
    """An empty array of `shape` whose axes lie in memory in the order of `like`'s strides.

    Keeping an input's memory order keeps a value in the layout of the global array it
    came from, so assembling the global result later is a view instead of a transpose.
    C order where `like` has a zero or negative stride (a broadcast or reversed view) or is
    size 1 along an axis that `shape` is not.
    """
    st = like.strides
    if len(shape) != like.ndim or any((x <= 0 and n > 1) or (n == 1 and m > 1)
                                      for x, n, m in zip(st, like.shape, shape)):
        return np.empty(shape, like.dtype)
    order = sorted(range(like.ndim), key=lambda i: (-st[i] if like.shape[i] > 1 else 0, i))
    base = np.empty([shape[i] for i in order], like.dtype)
    return base.transpose(np.argsort(order))


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """`dst[...] = src` for a `dst` whose axes are a permutation of a C-contiguous array,
    by `transpose_copy`'s cache-blocked path in `dst`'s memory order (else np.copyto)."""
    order = sorted(range(dst.ndim), key=lambda i: (-abs(dst.strides[i]) if dst.shape[i] > 1 else 0, i))
    d, v = dst.transpose(order), src.transpose(order)
    if d.flags.c_contiguous:
        _copy_into_c(d, v)
    else:
        np.copyto(dst, src)


def _copy_into_c(out: np.ndarray, v: np.ndarray) -> None:
    """out[...] = v for a C-contiguous `out` of v's shape (see `transpose_copy`)."""
    shape, strides = _coalesce(v)
    if v.size == 0 or len(shape) < 2 or v.nbytes < _SMALL or v.dtype.hasobject:
        np.copyto(out, v)
        return
    src, dst = v.reshape(shape), out.reshape(shape)  # views: only contiguous dims merged
    run = shape[-1] * v.itemsize
    if strides[-1] == v.itemsize:
        if run > _WIDE_RUN:  # long runs: NumPy's strided copy streams them already
            np.copyto(dst, src)
            return
        src, dst = _as_wide(src, shape, run), _as_wide(dst, shape, run)
        shape, strides = src.shape, src.strides
        if len(shape) < 2:
            np.copyto(dst, src)
            return
    q = len(shape) - 1
    p = min(range(len(shape)), key=lambda i: (abs(strides[i]) or np.inf, -i))
    area = _TILE_BYTES // (src.nbytes // (shape[p] * shape[q]))
    if p == q or strides[p] == 0 or area < 16 * 16:
        np.copyto(dst, src)
        return
    # near-square tiles, each side a power of two, trimmed to the axis lengths
    tp = min(shape[p], _pow2_at_most(int(area ** 0.5)))
    tq = min(shape[q], _pow2_at_most(max(1, area // tp)))
    tp = min(shape[p], _pow2_at_most(max(1, area // tq)))
    _tiled_copy(dst, src, p, q, tp, tq)
    return


def _grid(groups: np.ndarray, k: int) -> str | None:
    """'blocks' when group g holds g*gs .. g*gs+gs-1, 'strided' when it holds
    g, g+ng, g+2*ng, ...; None for any other partition."""
    ng, gs = groups.shape
    ar = np.arange(k, dtype=np.int64)
    if np.array_equal(groups, ar.reshape(ng, gs)):
        return "blocks"
    if np.array_equal(groups, ar.reshape(gs, ng).T):
        return "strided"
    return None


def _into_input_order(x, xs, lay, grid, ng, gs, p):
    """all_to_all's result written once, straight into an array in `x`'s memory order.

    `xs` is the moved view (receiver group, member, ..., sender before the concat block);
    the destination is the stacked result laid out like `x`, viewed with the same axes.
    When `x` is a view of the global array (a shard_map operand), the result is then in
    the global layout of its out_specs and reading it back copies nothing. None when
    that view of the result does not exist (several named axes not adjacent in memory).
    """
    local = xs.shape[2 + len(lay.others):p] + (xs.shape[p] * xs.shape[p + 1],) + xs.shape[p + 2:]
    mesh_shape = list(x.shape[:lay.nm])
    for a, n in zip(lay.pos, lay.sizes):
        mesh_shape[a] = n
    res = empty_in_order_of(tuple(mesh_shape) + local, x)
    dst = res.transpose(lay.pos + lay.others + tuple(range(lay.nm, res.ndim)))
    dst = reshape_view(dst, (lay.k,) + dst.shape[len(lay.pos):])  # the K axis, as lay.to_k
    if dst is not None:
        dst = reshape_view(dst, ((ng, gs) if grid == "blocks" else (gs, ng)) + dst.shape[1:])
    if dst is not None:
        dst = reshape_view(dst, dst.shape[:p] + (xs.shape[p], xs.shape[p + 1]) + dst.shape[p + 1:])
    if dst is None or dst.shape != xs.shape:
        return None
    copy_into(dst, xs)
    return res


def all_to_all(x, *, mesh, axis_name, split_axis, concat_axis, axis_index_groups=None,
               tiled=False, api: str = "all_to_all"):
    """`all_to_all_p`: split `split_axis` across the group, concatenate along `concat_axis`.

    `tiled` is accepted as JAX binds it and, as in JAX's lowering, does not change the
    primitive's semantics.
    """
    del tiled
    lay = GroupLayout(mesh, axis_name, api)
    x = lay.check(x, api)
    groups = device_groups(mesh, lay.names, axis_index_groups, equal_sizes=True, api=api)
    ng, gs = groups.shape
    local_ndim = x.ndim - lay.nm
    s = check_dimension(split_axis, local_ndim, api, "split_axis")
    c = check_dimension(concat_axis, local_ndim, api, "concat_axis")
    n = x.shape[lay.nm + s]
    if n % gs:
        raise ValueError(
            f"{api}: the size of all_to_all split_axis ({n}) has to be divisible by the size "
            f"of the named axis {lay.names!r} ({gs}) (split_axis={split_axis}); pad it to a "
            f"multiple of {gs}."
        )
    nrest = len(lay.others)
    xk = lay.to_k(x)
    grid = _grid(groups, lay.k)
    # (ng, S, *rest, *local): a view of xk for grid-shaped groups, else one row gather
    if grid == "blocks":
        xs = xk.reshape((ng, gs) + xk.shape[1:])
    elif grid == "strided":
        xs = xk.reshape((gs, ng) + xk.shape[1:]).swapaxes(0, 1)
    else:
        xs = np.take(xk, groups, axis=0)
    base = 2 + nrest
    shape = xs.shape
    xs = xs.reshape(shape[: base + s] + (gs, n // gs) + shape[base + s + 1:])
    xs = np.moveaxis(xs, base + s, 1)  # (ng, D, S, *rest, *local with block at s)
    xs = np.moveaxis(xs, 2, 2 + nrest + c)  # sender position right before concat dim
    if grid == "strided":
        xs = xs.swapaxes(0, 1)  # receiver (g, d) has linear index d * ng + g
    p = 2 + nrest + c
    if grid is not None:
        res = _into_input_order(x, xs, lay, grid, ng, gs, p)
        if res is not None:
            return res
    out = transpose_copy(xs)  # the only full copy of the data
    shape = out.shape
    out = out.reshape((lay.k,) + shape[2:p] + (shape[p] * shape[p + 1],) + shape[p + 2:])
    if grid is None:
        gidx, jidx = member_index(groups, lay.k)
        out = np.take(out, gidx * gs + jidx, axis=0)
    return lay.from_k(out)
