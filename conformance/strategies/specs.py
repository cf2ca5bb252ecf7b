"""`partition_specs()` and `sharded_shapes()`: valid layouts of an array over a mesh."""
from __future__ import annotations

import math

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.strategies import _validate as v
from refsim.layouts.mesh import AbstractMesh
from refsim.layouts.partition_spec import UNCONSTRAINED, PartitionSpec


def _check_mesh(mesh) -> st.SearchStrategy:
    if v.is_strategy(mesh):
        return mesh
    if not isinstance(mesh, AbstractMesh):
        raise InvalidArgument(f"mesh={mesh!r} must be a refsim Mesh/AbstractMesh or a strategy drawing one.")
    return st.just(mesh)


# Module level: st.composite reads the function's source each time it decorates one (~3 ms),
# which a closure redefined per call would pay on every draw that builds this strategy.
@st.composite
def _draw_spec(draw, allow_short, allow_tuples, allow_unconstrained, allow_unordered, excluded, mesh_s, ndim_s, required) -> PartitionSpec:
    m = draw(mesh_s)
    n = v.check_drawn_int("ndim", draw(ndim_s), min_value=0)
    names = m.axis_names
    need = set(required)
    if need - set(names) or (need and n == 0) or (not allow_tuples and len(need) > n):
        raise InvalidArgument(f"required_axes={required!r} cannot be placed on rank {n} over {m!r}.")
    dims: list[list[str]] = [[] for _ in range(n)]
    free = list(range(n))
    order = draw(st.permutations(names)) if allow_unordered else list(names)
    # Required axes go first so that, without tuples, they always find a free dimension.
    order = [a for a in order if a in need] + [a for a in order if a not in need]
    for a in order:
        if a in excluded:
            continue
        choices = list(range(n)) if allow_tuples else free
        if not choices:
            continue
        if a in need:
            d = draw(st.sampled_from(choices))
        else:
            d = draw(st.sampled_from([None, *choices]))
            if d is None:
                continue
        dims[d].append(a)
        if d in free:
            free.remove(d)
    if not allow_unordered:
        dims = [sorted(ax, key=names.index) for ax in dims]
    entries: list = []
    for ax in dims:
        if not ax:
            entries.append(UNCONSTRAINED if allow_unconstrained and draw(st.booleans()) else None)
        else:
            entries.append(ax[0] if len(ax) == 1 else tuple(ax))
    if allow_short and draw(st.booleans()):
        while entries and entries[-1] is None:
            entries.pop()
    return PartitionSpec(*entries)


def partition_specs(mesh, ndim, *, allow_tuples: bool = True, allow_unordered: bool = True,
                    allow_unconstrained: bool = False, allow_short: bool = True,
                    required_axes=(), excluded_axes=()) -> st.SearchStrategy[PartitionSpec]:
    """PartitionSpecs for a rank-`ndim` array over `mesh` that JAX's NamedSharding accepts.

    Each mesh axis shards at most one dimension (NamedSharding's rule); an entry is None,
    one axis, or (if `allow_tuples`) a tuple of axes, in mesh order or, with
    `allow_unordered`, in any order. `allow_unconstrained` lets unsharded entries be
    `P.UNCONSTRAINED` (valid for sharding constraints only); `allow_short` lets trailing
    None entries be left out (P('x') for a rank-2 array). Every axis in `required_axes`
    is used (as shard_map out_specs need for a varying value) and none in `excluded_axes`
    (an input invariant over them). Shrinks towards P().

    >>> partition_specs(Mesh((2, 4), ('x', 'y')), 2).example()  # doctest: +SKIP
    P(('y', 'x'), None)
    """
    mesh_s = _check_mesh(mesh)
    ndim_s = v.check_int_or_strategy("ndim", ndim, min_value=0)
    for name, flag in (("allow_tuples", allow_tuples), ("allow_unordered", allow_unordered),
                       ("allow_unconstrained", allow_unconstrained), ("allow_short", allow_short)):
        v.check_bool(name, flag)
    required = (required_axes,) if isinstance(required_axes, str) else tuple(required_axes)
    excluded = (excluded_axes,) if isinstance(excluded_axes, str) else tuple(excluded_axes)
    if set(required) & set(excluded):
        raise InvalidArgument(f"required_axes={required!r} and excluded_axes={excluded!r} overlap.")
    if not v.is_strategy(mesh):
        for a in required:
            if a not in mesh.axis_names:
                raise InvalidArgument(f"required_axes={required!r} names {a!r}, which is not an axis of {mesh!r}.")
        if not v.is_strategy(ndim):
            if required and ndim == 0:
                raise InvalidArgument(f"required_axes={required!r} cannot be placed on a rank-0 array (ndim=0).")
            if not allow_tuples and len(required) > ndim:
                raise InvalidArgument(
                    f"required_axes={required!r} needs {len(required)} dimensions without tuples but "
                    f"ndim={ndim}; allow tuples or raise ndim.")

    return _draw_spec(allow_short, allow_tuples, allow_unconstrained, allow_unordered, excluded, mesh_s, ndim_s, required)


# Module level: st.composite reads the function's source each time it decorates one (~3 ms),
# which a closure redefined per call would pay on every draw that builds this strategy.
@st.composite
def _draw_shape(draw, max_local_side, mesh_s, min_local_side, mult, ndim_s, spec_s) -> tuple:
    m = draw(mesh_s)
    s = draw(spec_s)
    if not isinstance(s, PartitionSpec):
        raise InvalidArgument(f"spec={s!r} must be a refsim PartitionSpec.")
    n = draw(ndim_s)
    n = len(s) if n is None else n
    if n < len(s):
        raise InvalidArgument(f"ndim={n} is less than len(spec)={len(s)} for spec={s!r}.")
    shape = []
    for d in range(n):
        f = mult.get(d, 1)
        lo = max(min_local_side, 1 if f > 1 else min_local_side)
        choices = [k for k in range(lo, max(max_local_side, f) + 1) if k % f == 0] or [f]
        local = draw(st.sampled_from(choices))
        shape.append(local * math.prod(m.axis_size(a) for a in s.axes_of(d)))
    return tuple(shape)


def sharded_shapes(mesh, spec, *, ndim=None, min_local_side: int = 1, max_local_side: int = 3,
                   multiples=None) -> st.SearchStrategy[tuple]:
    """Global shapes that `NamedSharding(mesh, spec)` divides evenly.

    Each dimension is ``local * (product of the sizes of the axes spec puts on it)`` with
    ``local`` in [`min_local_side`, `max_local_side`]; `ndim` (default len(spec)) may add
    unsharded trailing dimensions. `multiples` optionally maps a dimension to a factor its
    local size must be a multiple of (e.g. the group size a tiled psum_scatter splits by).

    >>> sharded_shapes(Mesh((2, 4), ('x', 'y')), P(('x', 'y'))).example()  # doctest: +SKIP
    (16,)
    """
    mesh_s = _check_mesh(mesh)
    v.check_int("min_local_side", min_local_side, min_value=0)
    v.check_int("max_local_side", max_local_side, min_value=0)
    v.check_order("min_local_side", min_local_side, "max_local_side", max_local_side)
    spec_s = v.as_strategy(spec)
    ndim_s = st.none() if ndim is None else v.check_int_or_strategy("ndim", ndim, min_value=0)
    mult = dict(multiples or {})
    for d, f in mult.items():
        v.check_int(f"multiples[{d}]", f, min_value=1)

    return _draw_shape(max_local_side, mesh_s, min_local_side, mult, ndim_s, spec_s)
