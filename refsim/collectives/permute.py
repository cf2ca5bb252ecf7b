"""Point-to-point data movement: ppermute, pbroadcast and axis_index.

`ppermute` follows StableHLO `collective_permute`: for each (source, target) pair the
target receives the source's operand; a device that is no pair's target receives
zeros. Indices are linear indices over `axis_name` in the given order (as
`axis_index` of that tuple). `pbroadcast` follows StableHLO `collective_broadcast`.
"""
from __future__ import annotations

import functools
import operator

import numpy as np

from refsim.collectives.alltoall import empty_in_order_of
from refsim.collectives.groups import GroupLayout


def _normalize(pairs: tuple, k: int, api: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        pairs = [tuple(operator.index(i) for i in p) for p in pairs]
    except TypeError:
        raise TypeError(
            f"{api}: perm={pairs!r} must be an iterable of (source, destination) int pairs."
        ) from None
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"{api}: every entry of perm={tuple(pairs)!r} must be a (source, destination) pair.")
    for p in pairs:
        for i in p:
            if not -k <= i < k:
                raise IndexError(
                    f"{api}: perm={tuple(pairs)!r} uses index {i}, out of range for an axis of "
                    f"size {k}; indices must be in [0, {k})."
                )
    src = np.array([p[0] % k for p in pairs], dtype=np.int64)
    dst = np.array([p[1] % k for p in pairs], dtype=np.int64)
    if len(np.unique(src)) != len(src) or len(np.unique(dst)) != len(dst):
        raise ValueError(
            f"{api} sources and destinations must be unique, got {tuple(pairs)!r}; each device "
            "may send once and receive once."
        )
    src.flags.writeable = False
    dst.flags.writeable = False
    return src, dst


# perm arrives as a tuple of pairs (JAX binds it that way); one program applies the
# same few perms again and again, so their checked form and copy plan are cached
_normalize_cached = functools.lru_cache(maxsize=256)(_normalize)


def normalize_perm(perm, k: int, api: str = "ppermute") -> tuple[np.ndarray, np.ndarray]:
    """(sources, targets) as read-only int arrays in [0, k); negative indices count from
    the end.

    Raises IndexError for an index outside [-k, k) and ValueError for a repeated source
    or target (JAX's "sources and destinations must be unique").
    """
    try:
        perm = tuple(perm)  # once: perm may be a one-shot iterator
    except TypeError:
        raise TypeError(
            f"{api}: perm={perm!r} must be an iterable of (source, destination) int pairs."
        ) from None
    try:
        pairs = tuple(tuple(p) for p in perm)
        hash(pairs)
    except TypeError:
        return _normalize(perm, k, api)
    return _normalize_cached(pairs, k, api)


@functools.lru_cache(maxsize=256)
def _runs(src_bytes: bytes, dst_bytes: bytes, k: int) -> tuple[np.ndarray, tuple]:
    """For each target position, its source (-1: receives zeros), and the same map as
    maximal runs (t0, t1, s0): targets t0..t1-1 receive sources s0.. (s0 = -1: zeros)."""
    src = np.frombuffer(src_bytes, dtype=np.int64)
    dst = np.frombuffer(dst_bytes, dtype=np.int64)
    take = np.full(k, -1, dtype=np.int64)
    take[dst] = src
    got = take >= 0
    same = np.zeros(k, dtype=bool)
    same[1:] = (got[1:] & got[:-1] & (take[1:] == take[:-1] + 1)) | (~got[1:] & ~got[:-1])
    starts = np.flatnonzero(~same)
    ends = np.append(starts[1:], k)
    take.flags.writeable = False
    return take, tuple(zip(starts.tolist(), ends.tolist(), take[starts].tolist()))


# up to this many runs the permutation is copied slice by slice (one memcpy-like call
# per run); beyond it one np.take does the gather
_MAX_RUNS = 64


def _permute_axis(x: np.ndarray, axis: int, take: np.ndarray, runs: tuple) -> np.ndarray:
    """out with out[..., t, ...] = x[..., take[t], ...] along `axis` (zeros where
    take[t] < 0), written in one pass."""
    lead = (slice(None),) * axis
    if len(runs) <= _MAX_RUNS:
        # in x's memory order: a shard_map operand keeps its global layout (see alltoall)
        out = empty_in_order_of(x.shape, x)
        for t0, t1, s0 in runs:
            if s0 < 0:
                out[lead + (slice(t0, t1),)] = 0
            else:
                np.copyto(out[lead + (slice(t0, t1),)], x[lead + (slice(s0, s0 + t1 - t0),)])
        return out
    out = np.empty(x.shape, x.dtype)
    got = take >= 0
    np.take(x, np.where(got, take, 0), axis=axis, out=out, mode="clip")
    if not got.all():
        out[lead + (~got,)] = 0
    return out


def ppermute(x, *, mesh, axis_name, perm, api: str = "ppermute"):
    """`ppermute_p`: target t receives source s's value for (s, t) in `perm`; others get 0.

    Follows StableHLO `collective_permute`. Consecutive targets fed by consecutive
    sources (a shift, a swap of halves) are copied as whole slices.
    """
    lay = GroupLayout(mesh, axis_name, api)
    x = lay.check(x, api)
    src, dst = normalize_perm(perm, lay.k, api)
    take, runs = _runs(src.tobytes(), dst.tobytes(), lay.k)
    if len(lay.pos) == 1:
        # one mesh axis: permute along it in place, so the result keeps x's layout
        axis = lay.pos[0]
        if x.shape[axis] != lay.k:
            x = np.broadcast_to(x, x.shape[:axis] + (lay.k,) + x.shape[axis + 1:])
        return _permute_axis(x, axis, take, runs)
    return lay.from_k(_permute_axis(lay.to_k(x), 0, take, runs))


def _check_source(source, k: int, api: str) -> int:
    try:
        source = operator.index(source)
    except TypeError:
        raise TypeError(f"{api}: source={source!r} must be an int.") from None
    if not 0 <= source < k:
        raise IndexError(
            f"{api}: source={source} is out of range for axis size {k}; pass a source in "
            f"[0, {k})."
        )
    return source


def pbroadcast(x, *, mesh, axis_name, source, api: str = "pbroadcast"):
    """`pbroadcast_p`: every device receives the value of linear index `source`."""
    lay = GroupLayout(mesh, axis_name, api)
    x = lay.check(x, api)
    source = _check_source(source, lay.k, api)
    xk = lay.to_k(x)
    return lay.from_k(xk[source:source + 1])


def pbroadcast_dynamic(x, source, *, mesh, axis_name, api: str = "pbroadcast"):
    """`pbroadcast_dynamic_p` (JAX >= 0.12): `source` is an int32 scalar operand.

    Each device receives the value at the linear index its own `source` names; all
    devices of a group must agree on it (StableHLO `has_dynamic_root`), else ValueError.
    """
    lay = GroupLayout(mesh, axis_name, api)
    x = lay.check(x, api)
    src = np.asarray(source)
    if src.dtype.kind not in "iu" or src.ndim != lay.nm:
        raise TypeError(
            f"{api}: dynamic source must be an int32 scalar per device, got dtype {src.dtype} "
            f"with shape {src.shape}."
        )
    sk = lay.to_k(src)  # (K, *rest)
    if (sk != sk[:1]).any():
        raise ValueError(
            f"{api}: devices of one group disagree on the dynamic source ({np.unique(sk).tolist()}); "
            "the source must be the same on every member of a group."
        )
    s0 = sk[0]
    if ((s0 < 0) | (s0 >= lay.k)).any():
        raise IndexError(f"{api}: dynamic source {np.unique(s0).tolist()} out of range [0, {lay.k}).")
    xk = lay.to_k(x)
    rest = xk.shape[1:1 + len(lay.others)]
    s0 = np.broadcast_to(s0, rest)
    idx = s0.reshape((1,) + rest + (1,) * (xk.ndim - 1 - len(rest)))
    return lay.from_k(np.take_along_axis(xk, np.broadcast_to(idx, (1,) + xk.shape[1:]), axis=0))


def axis_index(*, mesh, axis_name, api: str = "axis_index"):
    """`axis_index_p`: int32 linear index over `axis_name` (given order, row-major).

    Returned with the mesh's leading dims only (size 1 on the other axes) and a scalar
    local shape, as JAX's `axis_index` of a tuple: sum_i idx(a_i) * prod_{j>i} size(a_j).
    """
    lay = GroupLayout(mesh, axis_name, api)
    return lay.from_k(np.arange(lay.k, dtype=np.int32).reshape((lay.k,) + (1,) * len(lay.others)))
