"""All-gather kernels: all_gather, all_gather_invariant, all_gather_reduced.

Semantics of StableHLO `all_gather`: every member of a group receives the
concatenation (tiled) or stack (untiled) of all members' operands along
`all_gather_dimension`, in ascending group position (the order of the group as
given in `axis_index_groups`, else the linear index over `axis_name`).
"""
from __future__ import annotations

import numpy as np

from refsim.collectives.groups import GroupLayout, member_index, sized_groups


def check_dimension(dim, ndim: int, api: str, name: str) -> int:
    """A dimension index in [-ndim, ndim) as a non-negative int (ValueError otherwise)."""
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"{api}: {name}={dim!r} must be an int.")
    if not -ndim <= dim < ndim:
        raise ValueError(
            f"{api}: {name}={dim} is out of bounds for a local value of rank {ndim - 0} "
            f"(valid: {-ndim}..{ndim - 1})."
        )
    return int(dim) % ndim


def all_gather(x, *, mesh, axis_name, all_gather_dimension, axis_size, axis_index_groups=None,
               tiled=False, api: str = "all_gather"):
    """`all_gather_p`: gather the group's operands along `all_gather_dimension`.

    Untiled inserts a new dimension of size `axis_size` at `all_gather_dimension`;
    tiled multiplies that existing dimension by `axis_size`. Without groups every
    device gets the same value, so the named mesh dims come back with size 1.
    """
    lay = GroupLayout(mesh, axis_name, api)
    x = lay.check(x, api)
    groups = sized_groups(mesh, lay.names, axis_index_groups, axis_size, api)
    ng, gs = groups.shape
    local_ndim = x.ndim - lay.nm
    d = check_dimension(all_gather_dimension, local_ndim if tiled else local_ndim + 1, api,
                        "all_gather_dimension")
    if tiled and x.shape[lay.nm + d] == 0:
        # XLA's verifier: "dimension size of operand at 'all_gather_dim' cannot be zero"
        # (JAX traces the call and fails when lowering; refsim rejects it as XLA does).
        raise ValueError(
            f"{api}: the operand's all_gather_dimension={all_gather_dimension} has size 0 "
            f"(local shape {x.shape[lay.nm:]}); XLA rejects a tiled all_gather over an empty "
            "dimension. Gather along a non-empty dimension or skip the collective."
        )
    xk = lay.to_k(x)  # (K, *rest, *local)
    nrest = len(lay.others)
    xs = xk[None] if (ng == 1 and axis_index_groups is None) else xk[groups]  # (ng, gs, ...)
    # move the group-position axis right before local dim d, then (tiled) merge them
    xs = np.moveaxis(xs, 1, 1 + nrest + d)
    if tiled:
        shape = xs.shape
        p = 1 + nrest + d
        xs = xs.reshape(shape[:p] + (shape[p] * shape[p + 1],) + shape[p + 2:])
    if ng == 1:
        return lay.from_k(xs)
    gidx, _ = member_index(groups, lay.k)
    return lay.from_k(xs[gidx])


def all_gather_invariant(x, *, mesh, axis_name, all_gather_dimension, axis_size, tiled=False):
    """`all_gather_invariant_p`: all_gather over the whole axes; the result is invariant."""
    return all_gather(x, mesh=mesh, axis_name=axis_name, all_gather_dimension=all_gather_dimension,
                      axis_size=axis_size, tiled=tiled, api="all_gather_invariant")


def all_gather_reduced(x, *, mesh, axis_name, all_gather_dimension, axis_size, tiled=False):
    """`all_gather_reduced_p`: varying -> reduced all_gather; values as all_gather_invariant."""
    return all_gather(x, mesh=mesh, axis_name=axis_name, all_gather_dimension=all_gather_dimension,
                      axis_size=axis_size, tiled=tiled, api="all_gather_reduced")
