"""Point-to-point data movement: ppermute, pbroadcast and axis_index.

`ppermute` follows StableHLO `collective_permute`: for each (source, target) pair the
target receives the source's operand; a device that is no pair's target receives
zeros. Indices are linear indices over `axis_name` in the given order (as
`axis_index` of that tuple). `pbroadcast` follows StableHLO `collective_broadcast`.
"""
from __future__ import annotations

import operator

import numpy as np

from refsim.collectives.groups import GroupLayout


def normalize_perm(perm, k: int, api: str = "ppermute") -> tuple[np.ndarray, np.ndarray]:
    """(sources, targets) as int arrays in [0, k); negative indices count from the end.

    Raises IndexError for an index outside [-k, k) and ValueError for a repeated source
    or target (JAX's "sources and destinations must be unique").
    """
    try:
        pairs = [tuple(operator.index(i) for i in p) for p in perm]
    except TypeError:
        raise TypeError(
            f"{api}: perm={perm!r} must be an iterable of (source, destination) int pairs."
        ) from None
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"{api}: every entry of perm={perm!r} must be a (source, destination) pair.")
    for p in pairs:
        for i in p:
            if not -k <= i < k:
                raise IndexError(
                    f"{api}: perm={tuple(pairs)!r} uses index {i}, out of range for an axis of "
                    f"size {k}; indices must be in [0, {k})."
                )
    src = np.array([p[0] % k for p in pairs], dtype=np.int64)
    dst = np.array([p[1] % k for p in pairs], dtype=np.int64)
    if len(set(src.tolist())) != len(src) or len(set(dst.tolist())) != len(dst):
        raise ValueError(
            f"{api} sources and destinations must be unique, got {tuple(pairs)!r}; each device "
            "may send once and receive once."
        )
    return src, dst


def ppermute(x, *, mesh, axis_name, perm, api: str = "ppermute"):
    """`ppermute_p`: target t receives source s's value for (s, t) in `perm`; others get 0."""
    lay = GroupLayout(mesh, axis_name, api)
    x = lay.check(x, api)
    src, dst = normalize_perm(perm, lay.k, api)
    xk = lay.to_k(x)
    if len(dst) == lay.k:
        take = np.empty(lay.k, dtype=np.int64)
        take[dst] = src
        return lay.from_k(xk[take])
    out = np.zeros(xk.shape, x.dtype)
    out[dst] = xk[src]
    return lay.from_k(out)


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
