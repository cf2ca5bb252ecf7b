"""All-to-all kernel (StableHLO `all_to_all`).

The member at group position j splits its operand into `group_size` equal blocks
along `split_axis` and sends block i to position i; every member concatenates the
blocks it receives along `concat_axis` in ascending sender position. At the
primitive level this is always "tiled" (JAX's untiled `all_to_all` adds and
squeezes a size-1 dimension around the primitive).
"""
from __future__ import annotations

import numpy as np

from refsim.collectives.gather import check_dimension
from refsim.collectives.groups import GroupLayout, device_groups, member_index


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
    xs = xk[None] if (ng == 1 and axis_index_groups is None) else xk[groups]  # (ng, S, ...)
    base = 2 + nrest
    shape = xs.shape
    xs = xs.reshape(shape[: base + s] + (gs, n // gs) + shape[base + s + 1:])
    xs = np.moveaxis(xs, base + s, 1)  # (ng, D, S, *rest, *local with block at s)
    xs = np.moveaxis(xs, 2, 2 + nrest + c)  # sender position right before concat dim
    shape = xs.shape
    p = 2 + nrest + c
    xs = xs.reshape(shape[:p] + (shape[p] * shape[p + 1],) + shape[p + 2:])
    flat = xs.reshape((ng * gs,) + xs.shape[2:])
    if ng == 1 and axis_index_groups is None:
        return lay.from_k(flat)
    gidx, jidx = member_index(groups, lay.k)
    return lay.from_k(flat[gidx * gs + jidx])
