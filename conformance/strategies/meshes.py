"""`meshes()`: refsim Meshes of 1-4 named axes in any of four device orders."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.cases import DEVICE_ORDERS
from conformance.strategies import _validate as v
from refsim.layouts.mesh import Mesh

DEFAULT_AXIS_NAMES = ("x", "y", "z", "w")
DEFAULT_SIZES = (1, 2, 3, 4, 5, 8)


def _ids(shape: tuple, order: str, perm: list | None) -> np.ndarray:
    n = math.prod(shape)
    if order == "default":
        return np.arange(n).reshape(shape)
    if order == "reversed":
        return np.arange(n)[::-1].reshape(shape)
    if order == "transposed":
        return np.arange(n).reshape(shape[::-1]).T.copy()
    return np.asarray(perm, dtype=np.int64).reshape(shape)


# Module level: st.composite reads the function's source each time it decorates one (~3 ms),
# which a closure redefined per call would pay on every draw that builds this strategy.
@st.composite
def _draw_mesh(draw, max_axes, max_devices, min_axes, names, orders, sizes) -> Mesh:
    ndim = draw(st.integers(min_axes, max_axes))
    shape: list[int] = []
    budget = max_devices
    for k in range(ndim):
        rest = ndim - k - 1
        fits = [s for s in sizes if s * sizes[0] ** rest <= budget]
        # Half the axes come from sizes > 1 that leave room for the remaining axes to be
        # > 1 too: multi-axis bugs (axis order, strided groups) need two non-trivial axes,
        # which uniform draws rarely give. Branch 0 (uniform, size 1 first) is what shrinks.
        roomy = [s for s in fits if s > 1 and s * 2 ** rest <= budget]
        s = draw(st.sampled_from(roomy if roomy and draw(st.booleans()) else fits))
        shape.append(s)
        budget //= s
    shape_t = tuple(shape)
    order = draw(st.sampled_from(orders))
    perm = None
    if order == "random":
        perm = draw(st.permutations(range(max_devices)))[: math.prod(shape_t)]
    return Mesh(shape_t, names[:ndim], device_ids=_ids(shape_t, order, perm))


def meshes(*, min_axes: int = 1, max_axes: int = 4, max_devices: int = 8, sizes=DEFAULT_SIZES,
           device_orders=DEVICE_ORDERS, axis_names=DEFAULT_AXIS_NAMES) -> st.SearchStrategy[Mesh]:
    """Meshes with `min_axes`..`max_axes` axes named by the first entries of `axis_names`.

    Axis sizes come from `sizes` (size 1 included by default), with at most `max_devices`
    devices in all. Device ids are < `max_devices`, arranged by one of `device_orders`:
    "default" (row-major 0..n-1), "reversed", "transposed" (first axis fastest) or
    "random" (a random choice of n distinct ids in random order). Shrinks towards fewer,
    smaller axes in the default order.

    >>> meshes(max_axes=2, device_orders=("reversed",)).example()  # doctest: +SKIP
    Mesh('x': 2, 'y': 4, axis_types=(Auto, Auto), device_ids=[[7, 6, 5, 4], [3, 2, 1, 0]])
    """
    v.check_int("min_axes", min_axes, min_value=1)
    v.check_int("max_axes", max_axes, min_value=1)
    v.check_order("min_axes", min_axes, "max_axes", max_axes)
    v.check_int("max_devices", max_devices, min_value=1)
    orders = v.check_options("device_orders", device_orders, DEVICE_ORDERS)
    names = tuple(axis_names) if not isinstance(axis_names, str) else (axis_names,)
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
        raise InvalidArgument(f"axis_names={axis_names!r} must be distinct non-empty strings.")
    if len(names) < max_axes:
        raise InvalidArgument(
            f"axis_names={names!r} has {len(names)} names but max_axes={max_axes}; give at least "
            "max_axes names or lower max_axes.")
    try:
        sizes = tuple(sorted(set(int(s) for s in sizes)))
    except (TypeError, ValueError):
        raise InvalidArgument(f"sizes={sizes!r} must be a sequence of positive ints.") from None
    if not sizes or sizes[0] < 1:
        raise InvalidArgument(f"sizes={sizes!r} must be a non-empty sequence of positive ints.")
    if sizes[0] ** min_axes > max_devices:
        raise InvalidArgument(
            f"no mesh fits: the smallest size in sizes={sizes!r} on min_axes={min_axes} axes needs "
            f"{sizes[0] ** min_axes} devices but max_devices={max_devices}; include 1 in sizes or "
            "raise max_devices.")

    return _draw_mesh(max_axes, max_devices, min_axes, names, orders, sizes)
