"""`axis_index_groups()`, `permutations()` and `collective_calls()`: one collective with every
parameter JAX accepts, drawn valid by construction (rules of `jax/_src/lax/parallel.py`)."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.cases import CollectiveCall
from refsim import compat as _compat
from conformance.strategies import _validate as v
from conformance.strategies.arrays import DEFAULT_DTYPES, MODES, _np_dtype, arrays
from conformance.strategies.specs import _check_mesh, partition_specs
from refsim.layouts.mesh import Mesh
from refsim.layouts.partition_spec import PartitionSpec

GROUP_KINDS = ("contiguous", "strided", "shuffled", "singleton")
PERM_KINDS = ("partial", "fixed_points", "identity", "cycles")
COLLECTIVES = ("psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all",
               "ppermute", "pshuffle", "pswapaxes", "axis_index", "pbroadcast")
ENTRIES = ("shard_map", "pmap")
_REDUCTIONS = ("psum", "pmean", "pmax", "pmin")
# Collectives whose `axis_index_groups` JAX's shard_map rejects (psum's rule raises
# NotImplementedError there); they take groups under pmap only.
_GROUPS_PMAP_ONLY = ("psum", "pmean")
# Lowered through ppermute, which JAX 0.12 rejects over axes out of mesh order.
_PERMUTING = ("ppermute", "pshuffle", "pbroadcast")
_GROUPED = ("psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all", "pswapaxes")


# -- axis_index_groups ------------------------------------------------------------------
def groups_kind(groups, axis_size: int) -> str:
    """Classify axis_index_groups: singleton, contiguous, strided or shuffled (the first that fits)."""
    g = [list(x) for x in groups]
    if all(len(x) == 1 for x in g):
        return "singleton"
    if all(x == list(range(i * len(x), (i + 1) * len(x))) for i, x in enumerate(g)):
        return "contiguous"
    k = len(g)
    if all(x == list(range(i, axis_size, k)) for i, x in enumerate(g)):
        return "strided"
    return "shuffled"


def _feasible_group_kinds(n: int) -> set:
    divisors = [d for d in range(2, n) if n % d == 0]
    kinds = {"singleton", "contiguous"}          # contiguous includes the one group of all n
    if divisors:
        kinds.add("strided")
    if n >= 2:
        kinds.add("shuffled")                    # any other arrangement, e.g. [[1, 0]]
    return kinds


# Module level: st.composite reads the function's source each time it decorates one (~3 ms),
# which a closure redefined per call would pay on every draw that builds this strategy.
@st.composite
def _draw_groups(draw, kinds, size_s) -> list:
    n = v.check_drawn_int("axis_size", draw(size_s), min_value=1)
    usable = [k for k in kinds if k in _feasible_group_kinds(n)]
    if not usable:
        reject()
    kind = draw(st.sampled_from(usable))
    if kind == "singleton":
        return [[i] for i in range(n)]
    if kind == "contiguous":
        g = draw(st.sampled_from([d for d in range(2, n + 1) if n % d == 0] or [n]))
        return [list(range(i, i + g)) for i in range(0, n, g)]
    if kind == "strided":
        k = draw(st.sampled_from([d for d in range(2, n) if n % d == 0]))  # number of groups
        return [list(range(i, n, k)) for i in range(k)]
    g = draw(st.sampled_from([d for d in range(2, n + 1) if n % d == 0]))
    order = draw(st.permutations(range(n)))
    out = [list(order[i:i + g]) for i in range(0, n, g)]
    if groups_kind(out, n) != "shuffled":
        reject()  # drew one of the sorted patterns (chance <= 1/2 at n=2, far less beyond)
    return out


def axis_index_groups(axis_size, *, kinds=GROUP_KINDS) -> st.SearchStrategy[list]:
    """Equal-size groups covering ``range(axis_size)`` once each, as `axis_index_groups` takes them.

    kinds: "contiguous" ([[0, 1], [2, 3]] or one group of all), "strided" ([[0, 2], [1, 3]]),
    "shuffled" (any other arrangement, members in any order) and "singleton" ([[0], [1], ...]).
    A kind impossible for the size (strided needs a proper divisor, shuffled two devices) is
    skipped; `InvalidArgument` if none of `kinds` is possible for a literal `axis_size`.

    >>> axis_index_groups(4, kinds=("strided",)).example()
    [[0, 2], [1, 3]]
    """
    size_s = v.check_int_or_strategy("axis_size", axis_size, min_value=1)
    kinds = v.check_options("kinds", kinds, GROUP_KINDS)
    if not v.is_strategy(axis_size) and not set(kinds) & _feasible_group_kinds(axis_size):
        raise InvalidArgument(f"none of kinds={kinds!r} is possible for axis_size={axis_size}; "
                              f"possible: {sorted(_feasible_group_kinds(axis_size))}.")

    return _draw_groups(kinds, size_s)


# -- permutations ------------------------------------------------------------------------
def perm_kind(perm, axis_size: int) -> str:
    """Classify a ppermute perm: identity, partial (someone receives nothing), fixed_points or cycles."""
    pairs = [tuple(p) for p in perm]
    if len(pairs) < axis_size:
        return "partial"
    if all(s == d for s, d in pairs):
        return "identity"
    if any(s == d for s, d in pairs):
        return "fixed_points"
    return "cycles"


def _feasible_perm_kinds(n: int) -> set:
    kinds = {"identity", "partial"}
    if n >= 2:
        kinds.add("cycles")
    if n >= 3:
        kinds.add("fixed_points")
    return kinds


def _cycle_pairs(draw, items: list) -> list:
    """Split `items` into one or more cycles of length >= 2 and return their (src, dst) pairs."""
    pairs, rest = [], list(items)
    while rest:
        if len(rest) <= 3:
            length = len(rest)
        else:
            length = draw(st.sampled_from([len(rest), *range(2, len(rest) - 1)]))
        cyc, rest = rest[:length], rest[length:]
        pairs += [(cyc[i], cyc[(i + 1) % len(cyc)]) for i in range(len(cyc))]
    return pairs


# Module level: st.composite reads the function's source each time it decorates one (~3 ms),
# which a closure redefined per call would pay on every draw that builds this strategy.
@st.composite
def _draw_perm(draw, kinds, size_s) -> list:
    n = v.check_drawn_int("axis_size", draw(size_s), min_value=1)
    usable = [k for k in kinds if k in _feasible_perm_kinds(n)]
    if not usable:
        reject()
    kind = draw(st.sampled_from(usable))
    order = list(draw(st.permutations(range(n))))
    if kind == "identity":
        return [(i, i) for i in range(n)]
    if kind == "cycles":
        return _cycle_pairs(draw, order)
    if kind == "fixed_points":
        nfixed = draw(st.integers(1, n - 2))
        return [(i, i) for i in order[:nfixed]] + _cycle_pairs(draw, order[nfixed:])
    full = _cycle_pairs(draw, order) if n >= 2 and draw(st.booleans()) else [(i, i) for i in range(n)]
    keep = draw(st.integers(0, n - 1))
    drop = draw(st.permutations(range(n)))
    return [full[i] for i in sorted(drop[:keep])]


def permutations(axis_size, *, kinds=PERM_KINDS) -> st.SearchStrategy[list]:
    """`perm` arguments for `jax.lax.ppermute`: (source, destination) pairs, each index at most
    once as a source and once as a destination.

    kinds: "identity" (every i -> i), "cycles" (every index moves; one or several cycles),
    "fixed_points" (a full permutation where some indices stay and others move) and "partial"
    (some index receives nothing, so ppermute zero-fills it; may be empty). Kinds impossible
    for the size are skipped (cycles need 2 indices, fixed_points 3).

    >>> permutations(4, kinds=("cycles",)).example()  # doctest: +SKIP
    [(2, 0), (0, 2), (3, 1), (1, 3)]
    """
    size_s = v.check_int_or_strategy("axis_size", axis_size, min_value=1)
    kinds = v.check_options("kinds", kinds, PERM_KINDS)
    if not v.is_strategy(axis_size) and not set(kinds) & _feasible_perm_kinds(axis_size):
        raise InvalidArgument(f"none of kinds={kinds!r} is possible for axis_size={axis_size}; "
                              f"possible: {sorted(_feasible_perm_kinds(axis_size))}.")

    return _draw_perm(kinds, size_s)


# -- collective_calls ---------------------------------------------------------------------
def _dtype_ok(name: str, dt: np.dtype) -> bool:
    """Which dtypes JAX's rules accept for each collective."""
    if name in ("pmax", "pmin") and dt.kind == "c":
        return False          # XLA has no complex max/min reduction
    if name == "psum_scatter" and dt.kind == "b":
        return False          # reduce_scatter adds; bool has no add
    if name == "axis_index" and dt.kind == "b":
        return False
    return True


def _axes_label(axes) -> str:
    return repr(axes).replace(" ", "")


def _output_kind(name: str, dt: np.dtype) -> str:
    floating = dt.kind in "fc" or (dt.kind == "V" and "float" in dt.name) or dt.name.startswith(("bfloat16", "float8"))
    if name == "pmean":
        return "mean"
    if name in ("psum", "psum_scatter") and floating:
        return "sum"
    # pmax / pmin: "exact", zero signs included; StableHLO's maximum / minimum are IEEE 754-2019's,
    # which order -0 < +0, so the sign of a zero result is defined (docs/comparison.md).
    return "exact"


# Module level: st.composite reads the function's source each time it decorates one (~3 ms),
# which a closure redefined per call would pay on every `collective_calls` strategy.
@st.composite
def _draw_call(draw, mesh_s, names, ents, dts, mode, max_local_side, max_rank) -> CollectiveCall:
    m: Mesh = draw(mesh_s)
    name = draw(st.sampled_from([n for n in names if any(_dtype_ok(n, d) for d in dts)]))
    dt = draw(st.sampled_from([d for d in dts if _dtype_ok(name, d)]))
    entry = "shard_map"
    if m.ndim == 1 and "pmap" in ents and ("shard_map" not in ents or draw(st.booleans())):
        entry = "pmap"
    # axes: pmap has one named axis; shard_map any non-empty subset in any order
    if entry == "pmap":
        axes_t = (m.axis_names[0],)
    else:
        axes_t = tuple(draw(st.permutations(m.axis_names))[:draw(st.integers(1, m.ndim))])
        if name in _PERMUTING and _compat.ppermute_axes_must_follow_mesh_order():
            axes_t = tuple(sorted(axes_t, key=m.axis_names.index))
    axes = axes_t[0] if len(axes_t) == 1 and draw(st.booleans()) else axes_t
    total = math.prod(m.axis_size(a) for a in axes_t)
    params: dict = {"axis_name": axes}
    labels: list = [("axes", _axes_label(axes))]
    groups = None
    if name in _GROUPED and (entry == "pmap" or name not in _GROUPS_PMAP_ONLY) and draw(st.booleans()):
        groups = draw(axis_index_groups(total))
        params["axis_index_groups"] = groups
    if name in _GROUPED:
        labels.append(("groups", "none" if groups is None else groups_kind(groups, total)))
    n = total if groups is None else len(groups[0])
    rank = draw(st.integers(2 if name == "psum_scatter" else 1, max_rank))
    local = [draw(st.integers(1, max_local_side)) for _ in range(rank)]
    call = _draw_params(draw, name, params, labels, local, n, total)
    args_local = tuple(local)
    if entry == "pmap":
        in_spec = None
        x = draw(arrays(dt, (total,) + args_local, mode=mode))
    else:
        # JAX's vma rules: pbroadcast needs an input varying over every axis it acts on; a
        # reduction's axes must be all varying or all invariant (mixed is a JAX error).
        need, avoid = (), ()
        if name == "pbroadcast":
            need = axes_t
        elif name in _REDUCTIONS or name == "psum_scatter":
            need, avoid = (axes_t, ()) if draw(st.booleans()) else ((), axes_t)
        in_spec = draw(partition_specs(m, rank, required_axes=need, excluded_axes=avoid))
        counts = [math.prod(m.axis_size(a) for a in in_spec.axes_of(d)) for d in range(rank)]
        x = draw(arrays(dt, tuple(l * c for l, c in zip(args_local, counts)), mode=mode))
    if name == "pmean" and dt.kind in "iu":
        x = _no_wrap(x, total)
    out_rank = call["out_rank"]
    reduced = set(axes_t) if name in _REDUCTIONS and groups is None else set()
    if entry == "pmap":
        in_specs, out_spec = (), None
    else:
        required = tuple(a for a in m.axis_names if a not in reduced)
        out_spec = draw(partition_specs(m, out_rank, required_axes=required))
        in_specs = (in_spec,)
    if entry == "pmap":
        labels.append(("entry", "pmap"))
    return CollectiveCall(
        family=name, source=call["source"], entry=entry, mesh=m, args=(x,), in_specs=in_specs,
        out_specs=out_spec, labels=tuple(labels), outputs=(_output_kind(name, dt),),
        name=name, params=params)


def collective_calls(mesh, *, collectives=COLLECTIVES, dtypes=DEFAULT_DTYPES, mode: str = "exact",
                     entries=ENTRIES, max_local_side: int = 3, max_rank: int = 3
                     ) -> st.SearchStrategy[CollectiveCall]:
    """One collective call over `mesh` (a Mesh or a strategy) with every parameter JAX accepts.

    Draws the collective, its axes (one name or a tuple, in or out of mesh order), its
    `axis_index_groups`, `perm`, `tiled`, gather `axis`, `scatter_dimension`,
    `split_axis`/`concat_axis`, pbroadcast `source`; the dtype; the input layout (any
    `partition_specs` of the mesh) and an out spec naming every axis the result varies over;
    and data by `arrays(mode=mode)`. On a 1-D mesh an entry may be "pmap", which is where
    psum/pmean take `axis_index_groups` (JAX's shard_map rejects them).

    >>> collective_calls(Mesh((2, 4), ('x', 'y')), collectives=("psum",)).example().case_id  # doctest: +SKIP
    "psum[axes=('y','x'),groups=none,dtype=float32,mesh=2x4:default]"
    """
    mesh_s = _check_mesh(mesh)
    names = v.check_options("collectives", collectives, COLLECTIVES)
    v.check_choice("mode", mode, MODES)
    ents = v.check_options("entries", entries, ENTRIES)
    v.check_int("max_local_side", max_local_side, min_value=1)
    v.check_int("max_rank", max_rank, min_value=2)
    if isinstance(dtypes, str):
        dtypes = (dtypes,)
    if not dtypes:
        raise InvalidArgument("dtypes=() is empty; name at least one dtype.")
    dts = [_np_dtype(d) for d in dtypes]
    if not any(_dtype_ok(n, d) for n in names for d in dts):
        raise InvalidArgument(f"no dtype in dtypes={tuple(dtypes)!r} is accepted by any of collectives={names!r}.")

    return _draw_call(mesh_s, names, ents, tuple(dts), mode, max_local_side, max_rank)


def _no_wrap(x: np.ndarray, n: int) -> np.ndarray:
    """`x` divided by `n`, rounded towards zero, so a sum of `n` such values cannot wrap.

    Integer pmean is psum (which wraps on overflow, as XLA's add does) then a division; its
    "mean" comparison policy bounds the distance to the exact mean, which a wrapped sum is
    not. mode="random" draws integers over the dtype's whole range, so they are scaled.
    """
    wide = x.astype(np.int64)
    return np.where(wide < 0, -((-wide) // n), wide // n).astype(x.dtype)


def _kw(params: dict, keys) -> str:
    return "".join(f", {k}={params[k]!r}" for k in keys if k in params)


def _draw_params(draw, name: str, params: dict, labels: list, local: list, n: int, total: int) -> dict:
    """Draw the collective-specific parameters, fix the local shape they need, build the source."""
    rank = len(local)
    ax = repr(params["axis_name"])
    out_rank = rank
    if name in _REDUCTIONS:
        body = f"jax.lax.{name}(a, {ax}{_kw(params, ['axis_index_groups'])})"
    elif name == "all_gather":
        tiled = draw(st.booleans())
        hi = rank - 1 if tiled else rank
        axis = draw(st.integers(-hi - 1, hi))
        params.update(axis=axis, tiled=tiled)
        labels += [("axis", axis), ("tiled", tiled)]
        out_rank = rank if tiled else rank + 1
        body = f"jax.lax.all_gather(a, {ax}{_kw(params, ['axis_index_groups', 'axis', 'tiled'])})"
    elif name == "psum_scatter":
        tiled = draw(st.booleans())
        # JAX does not canonicalise a negative scatter_dimension (StableHLO then rejects it),
        # so valid calls use 0..rank-1; negative ones belong to the error suite.
        dim = draw(st.integers(0, rank - 1))
        local[dim] = n * (draw(st.integers(1, 2)) if tiled else 1)
        params.update(scatter_dimension=dim, tiled=tiled)
        labels += [("scatter_dimension", dim), ("tiled", tiled)]
        out_rank = rank if tiled else rank - 1
        body = f"jax.lax.psum_scatter(a, {ax}{_kw(params, ['scatter_dimension', 'axis_index_groups', 'tiled'])})"
    elif name == "all_to_all":
        tiled = draw(st.booleans())
        split, concat = draw(st.integers(0, rank - 1)), draw(st.integers(0, rank - 1))
        local[split] = n * (draw(st.integers(1, 2)) if tiled else 1)
        params.update(split_axis=split, concat_axis=concat, tiled=tiled)
        labels += [("split_axis", split), ("concat_axis", concat), ("tiled", tiled)]
        body = (f"jax.lax.all_to_all(a, {ax}, {split}, {concat}"
                f"{_kw(params, ['axis_index_groups', 'tiled'])})")
    elif name == "ppermute":
        perm = draw(permutations(total))
        params["perm"] = perm
        labels.append(("perm", perm_kind(perm, total)))
        body = f"jax.lax.ppermute(a, {ax}, perm={perm!r})"
    elif name == "pshuffle":
        pairs = draw(permutations(total, kinds=[k for k in ("identity", "cycles", "fixed_points")
                                                 if k in _feasible_perm_kinds(total)]))
        perm = [0] * total
        for s, d in pairs:
            perm[d] = s                      # pshuffle: output i takes the value of device perm[i]
        params["perm"] = perm
        labels.append(("perm", perm_kind(pairs, total)))
        body = f"jax.lax.pshuffle(a, {ax}, perm={perm!r})"
    elif name == "pswapaxes":
        axis = draw(st.integers(0, rank - 1))
        local[axis] = n
        params["axis"] = axis
        labels.append(("axis", axis))
        body = f"jax.lax.pswapaxes(a, {ax}, {axis}{_kw(params, ['axis_index_groups'])})"
    elif name == "axis_index":
        body = f"a + jax.lax.axis_index({ax}).astype(a.dtype)"
    else:  # pbroadcast
        source = draw(st.integers(0, total - 1))
        params["source"] = source
        labels.append(("source", source))
        body = f"jax.lax.pbroadcast(a, {ax}, source={source})"
    return {"source": f"def f(a):\n    return {body}\n", "out_rank": out_rank}
