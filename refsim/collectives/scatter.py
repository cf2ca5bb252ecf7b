"""Reduce-scatter kernels: reduce_scatter (psum_scatter) and unreduced_reduce_scatter.

Semantics of StableHLO `reduce_scatter`: the group's operands are summed
(ascending group position, as `reductions.ordered_reduce`), the sum is split into
`group_size` equal blocks along `scatter_dimension`, and the member at group
position j keeps block j (untiled: the block's size-1 dimension is removed).
"""
from __future__ import annotations

import numpy as np

from refsim.collectives.gather import check_dimension
from refsim.collectives.groups import GroupLayout, member_index, sized_groups
from refsim.collectives.reductions import ordered_reduce


def reduce_scatter(x, *, mesh, axis_name, scatter_dimension, axis_size, axis_index_groups=None,
                   tiled=False, api: str = "reduce_scatter"):
    """`reduce_scatter_p`: sum within each group and give position j the j-th block.

    bool is a TypeError, as in JAX (the reduction is `add`, which does not accept bool;
    unlike psum, psum_scatter does not convert bool to int32).
    """
    lay = GroupLayout(mesh, axis_name, api)
    x = lay.check(x, api)
    if x.dtype == np.bool_:
        raise TypeError(
            f"{api} does not accept dtype bool (JAX: 'add does not accept dtype bool'); cast the "
            "operand to an integer dtype first, e.g. x.astype(np.int32).")
    groups = sized_groups(mesh, lay.names, axis_index_groups, axis_size, api)
    ng, gs = groups.shape
    local_ndim = x.ndim - lay.nm
    d = check_dimension(scatter_dimension, local_ndim, api, "scatter_dimension")
    n = x.shape[lay.nm + d]
    if tiled and n == 0:
        # XLA's verifier: "result dimension size at scatter_dimension cannot be zero".
        raise ValueError(
            f"{api}: the operand's scatter_dimension={scatter_dimension} has size 0 (local shape "
            f"{x.shape[lay.nm:]}); XLA rejects a reduce_scatter whose result block is empty. "
            "Scatter along a non-empty dimension or skip the collective."
        )
    if tiled and n % gs:
        raise ValueError(
            f"{api}: tiled reduce_scatter operand scatter dimension size {n} must be divisible "
            f"by shard_count {gs} (scatter_dimension={scatter_dimension}, axis_name="
            f"{lay.names!r}); pad the dimension to a multiple of {gs}."
        )
    if not tiled and n != gs:
        raise ValueError(
            f"{api}: reduce_scatter operand scatter dimension size {n} must match shard count "
            f"{gs} (scatter_dimension={scatter_dimension}, axis_name={lay.names!r}); use "
            "tiled=True to scatter blocks of a larger dimension."
        )
    xk = lay.to_k(x)
    nrest = len(lay.others)
    if ng == 1 and axis_index_groups is None:
        red = ordered_reduce(np.add, xk)[None]  # (1, *rest, *local)
    else:
        red = ordered_reduce(np.add, xk[groups.T])  # (ng, *rest, *local)
    p = 1 + nrest + d
    shape = red.shape
    red = red.reshape(shape[:p] + (gs, n // gs) + shape[p + 1:])
    red = np.moveaxis(red, p, 1)  # (ng, gs, *rest, *local with block n//gs)
    if not tiled:
        red = red.reshape(red.shape[: p + 1] + red.shape[p + 2:])
    flat = red.reshape((ng * gs,) + red.shape[2:])
    gidx, jidx = member_index(groups, lay.k)
    order = gidx * gs + jidx
    if ng == 1 and axis_index_groups is None:
        return lay.from_k(flat)  # order is the identity
    return lay.from_k(flat[order])


def unreduced_reduce_scatter(x, *, mesh, axis_name, scatter_dimension, axis_size, tiled=False):
    """`unreduced_reduce_scatter_p`: unreduced -> varying; values as reduce_scatter."""
    return reduce_scatter(x, mesh=mesh, axis_name=axis_name, scatter_dimension=scatter_dimension,
                          axis_size=axis_size, tiled=tiled, api="unreduced_reduce_scatter")
