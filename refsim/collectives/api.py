"""`jax.lax`'s collectives, called directly on mesh-major stacked arrays.

Each function has the signature of its `jax.lax` namesake plus a keyword `mesh=`
(a refsim Mesh or AbstractMesh), and does what the jax.lax wrapper does before it
binds a primitive (bool -> int32 for psum, pmean's psum then `/ n`, untiled all_to_all's
expand/squeeze, pshuffle -> ppermute, ...), then binds the primitive through
`refsim.collectives.primitives`: the same rule, with the same params, that refsim's jaxpr
interpreter runs for that primitive, so an eager call and a traced program agree. `x` is a
stacked array (shape `mesh.axis_sizes + local_shape`, size 1 on axes where it is invariant)
or a tuple / list / dict of them.
"""
from __future__ import annotations

import numpy as np

from refsim.collectives import asyncs, vma
from refsim.collectives import gather as _gather
from refsim.collectives.groups import group_size_total, normalize_axis_index_groups, normalize_axis_name
from refsim.collectives.primitives import bind


def _tree_map(fn, x):
    if isinstance(x, (tuple, list)):
        return type(x)(_tree_map(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: _tree_map(fn, v) for k, v in x.items()}
    return fn(np.asarray(x))


def _names(axis_name):
    return normalize_axis_name(axis_name)


def _group_size(mesh, axis_name, axis_index_groups):
    """Size of the first group (the `axis_size` JAX binds); `axis_index_groups` already normalised."""
    if axis_index_groups is not None:
        return len(axis_index_groups[0])
    return group_size_total(mesh, axis_name)


def _groups(axis_index_groups, api):
    return normalize_axis_index_groups(axis_index_groups, api)


# ---- reductions -----------------------------------------------------------------------------

def psum(x, axis_name, *, axis_index_groups=None, mesh):
    """All-reduce sum over `axis_name` (bool inputs become int32 first, as jax.lax.psum)."""
    axes = _names(axis_name)
    axis_index_groups = _groups(axis_index_groups, "psum")
    if not axes:
        return x

    def leaf(v):
        v = v.astype(np.int32) if v.dtype == np.bool_ else v
        return bind("psum", v, mesh=mesh, axes=axes, axis_index_groups=axis_index_groups)
    return _tree_map(leaf, x)


def pmean(x, axis_name, *, axis_index_groups=None, mesh):
    """psum divided by n, as jax.lax.pmean: n is `psum(1, axis_name, axis_index_groups=...)`,
    which JAX evaluates as a constant, the size of the *first* group (or of the named axes).

    With groups of unequal size every device divides by that one n, as JAX does (e.g. groups
    [[0], [1, 2, 3]] of values 0, 1, 2, 3 give 0, 6, 6, 6: each sum divided by 1). Integer
    and bool inputs give float32 (JAX's `x / n` with x64 off); complex values are divided as
    complex numbers, (a+bi) / (n+0i).
    """
    axis_index_groups = _groups(axis_index_groups, "pmean")
    s = psum(x, axis_name, axis_index_groups=axis_index_groups, mesh=mesh)
    n = _group_size(mesh, _names(axis_name), axis_index_groups)

    def leaf(v):
        dt = v.dtype if v.dtype.kind in "fcV" or v.dtype.name == "bfloat16" else np.dtype(np.float32)
        return (v.astype(dt) / np.asarray(n, dt)).astype(dt)
    return _tree_map(leaf, s)


def pmax(x, axis_name, *, axis_index_groups=None, mesh):
    """All-reduce maximum over `axis_name` (NaN propagates)."""
    axes = _names(axis_name)
    axis_index_groups = _groups(axis_index_groups, "pmax")
    return x if not axes else _tree_map(
        lambda v: bind("pmax", v, mesh=mesh, axes=axes, axis_index_groups=axis_index_groups), x)


def pmin(x, axis_name, *, axis_index_groups=None, mesh):
    """All-reduce minimum over `axis_name` (NaN propagates)."""
    axes = _names(axis_name)
    axis_index_groups = _groups(axis_index_groups, "pmin")
    return x if not axes else _tree_map(
        lambda v: bind("pmin", v, mesh=mesh, axes=axes, axis_index_groups=axis_index_groups), x)


def _parg(x, axis_name, mesh, reduce_fn, api):
    if isinstance(axis_name, (tuple, list)):
        raise TypeError(f"{api} only accepts a single axis, got axis_name={axis_name!r}; call it "
                        "once per axis.")
    big = np.iinfo(np.int32).max

    def leaf(v):
        best = reduce_fn(v, axis_name, mesh=mesh)
        idx = axis_index(axis_name, mesh=mesh)
        idx = idx.reshape(idx.shape + (1,) * (v.ndim - idx.ndim))
        cand = np.where(best == v, idx, np.int32(big)).astype(np.int32)
        return bind("pmin", cand, mesh=mesh, axes=(axis_name,), axis_index_groups=None)
    return _tree_map(leaf, x)


def pargmax(x, axis_name, *, mesh):
    """Index along `axis_name` of the first maximum, int32 (as JAX: pmin of the indices
    where x equals pmax(x); where pmax is NaN no index matches and the result is 2**31-1)."""
    return _parg(x, axis_name, mesh, pmax, "pargmax")


def pargmin(x, axis_name, *, mesh):
    """Index along `axis_name` of the first minimum, int32 (see `pargmax`)."""
    return _parg(x, axis_name, mesh, pmin, "pargmin")


def psum_invariant(x, axis_name, *, mesh):
    """psum as check_vma=True binds it (varying -> invariant, no groups)."""
    return _tree_map(lambda v: bind("psum_invariant", v, mesh=mesh, axes=_names(axis_name)), x)


def unreduced_psum(x, axis_name, *, mesh):
    """Sum an unreduced value's per-device partials (unreduced -> invariant)."""
    return _tree_map(lambda v: bind("unreduced_psum", v, mesh=mesh, axes=_names(axis_name)), x)


def unreduced_pmax(x, axis_name, *, mesh):
    """Max-combine an unreduced(max) value (JAX >= 0.12)."""
    return _tree_map(lambda v: bind("unreduced_pmax", v, mesh=mesh, axes=_names(axis_name)), x)


def unreduced_pmin(x, axis_name, *, mesh):
    """Min-combine an unreduced(min) value (JAX >= 0.12)."""
    return _tree_map(lambda v: bind("unreduced_pmin", v, mesh=mesh, axes=_names(axis_name)), x)


# ---- gather / scatter / all-to-all ------------------------------------------------------------

def _gather_dim(axis, v, mesh, tiled):
    return _gather.check_dimension(axis, v.ndim - mesh.ndim + (0 if tiled else 1), "all_gather",
                                   "axis")


def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False, to="varying", mesh):
    """Gather x from every member of the group along `axis` (jax.lax.all_gather)."""
    if to not in ("varying", "reduced", "invarying"):
        raise ValueError("Got unexpected `to` value for `jax.lax.all_gather`. Allowed `to` values "
                         f"are: {{'varying', 'reduced', 'invarying'}} (got to={to!r})")
    axes = _names(axis_name)
    if not axes:
        return x
    axis_index_groups = _groups(axis_index_groups, "all_gather")
    if to != "varying" and axis_index_groups is not None:
        raise ValueError(f"all_gather: to={to!r} does not take axis_index_groups; drop them or "
                         "use to='varying'.")
    size = _group_size(mesh, axes, axis_index_groups)
    if to == "varying":
        return _tree_map(lambda v: bind(
            "all_gather", v, mesh=mesh, axis_name=axes, all_gather_dimension=_gather_dim(axis, v, mesh, tiled),
            axis_size=size, axis_index_groups=axis_index_groups, tiled=tiled), x)
    name = "all_gather_invariant" if to == "invarying" else "all_gather_reduced"
    return _tree_map(lambda v: bind(
        name, v, mesh=mesh, axis_name=axes, all_gather_dimension=_gather_dim(axis, v, mesh, tiled),
        axis_size=size, tiled=tiled), x)


def all_gather_invariant(x, axis_name, *, axis=0, tiled=False, mesh):
    """all_gather whose result is invariant over `axis_name`."""
    return all_gather(x, axis_name, axis=axis, tiled=tiled, to="invarying", mesh=mesh)


def all_gather_reduced(x, axis_name, *, axis=0, tiled=False, mesh):
    """all_gather whose result is reduced over `axis_name`."""
    return all_gather(x, axis_name, axis=axis, tiled=tiled, to="reduced", mesh=mesh)


def psum_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False, mesh):
    """Sum over the group and keep this member's block of `scatter_dimension`.

    bool is a TypeError, as in JAX (the reduction is `add`, which does not accept bool;
    unlike psum, psum_scatter does not convert bool to int32).
    """
    axes = _names(axis_name)
    if not axes:
        return x
    axis_index_groups = _groups(axis_index_groups, "psum_scatter")
    size = _group_size(mesh, axes, axis_index_groups)

    return _tree_map(lambda v: bind(
        "reduce_scatter", v, mesh=mesh, axis_name=axes, scatter_dimension=scatter_dimension, axis_size=size,
        axis_index_groups=axis_index_groups, tiled=tiled, api="psum_scatter"), x)


def unreduced_psum_scatter(x, axis_name, *, scatter_dimension=0, tiled=False, mesh):
    """psum_scatter of an unreduced value (unreduced -> varying)."""
    return psum_scatter(x, axis_name, scatter_dimension=scatter_dimension, tiled=tiled, mesh=mesh)


def all_to_all(x, axis_name, split_axis, concat_axis, *, axis_index_groups=None, tiled=False, mesh):
    """jax.lax.all_to_all: map `split_axis` over the group, materialise it at `concat_axis`."""
    axes = _names(axis_name)
    axis_index_groups = _groups(axis_index_groups, "all_to_all")
    gs = _group_size(mesh, axes, axis_index_groups)

    def leaf(v):
        nd = v.ndim - mesh.ndim
        s = _gather.check_dimension(split_axis, nd, "all_to_all", "split_axis")
        c = _gather.check_dimension(concat_axis, nd, "all_to_all", "concat_axis")
        n = v.shape[mesh.ndim + s]
        if tiled:
            if n % gs:
                raise ValueError(f"The size of all_to_all split_axis ({n}) has to be divisible by "
                                 f"the size of the named axis {axis_name} ({gs})")
            return bind("all_to_all", v, mesh=mesh, axis_name=axes, split_axis=s, concat_axis=c,
                        axis_index_groups=axis_index_groups, tiled=True)
        if n != gs:
            raise ValueError("all_to_all requires the size of the mapped axis axis_name to equal "
                             f"x.shape[split_axis], but they are {gs} and {n} respectively.")
        if s < c:
            c += 1
            v = np.expand_dims(v, mesh.ndim + c)
        elif s > c:
            v = np.expand_dims(v, mesh.ndim + c)
            s += 1
        out = bind("all_to_all", v, mesh=mesh, axis_name=axes, split_axis=s, concat_axis=c,
                   axis_index_groups=axis_index_groups, tiled=False)
        return out if s == c else np.squeeze(out, mesh.ndim + s)
    return _tree_map(leaf, x)


def pswapaxes(x, axis_name, axis, *, axis_index_groups=None, mesh):
    """all_to_all(x, axis_name, axis, axis): swap the mapped axis with local `axis`."""
    return all_to_all(x, axis_name, axis, axis, axis_index_groups=axis_index_groups, mesh=mesh)


def ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
                      axis_name, axis_index_groups=None, mesh):
    """Exchange ragged row-slices (see `refsim.collectives.ragged`)."""
    return bind("ragged_all_to_all", operand, output, input_offsets, send_sizes, output_offsets, recv_sizes,
                mesh=mesh, axis_name=_names(axis_name), axis_index_groups=axis_index_groups)


# ---- permutations, broadcast, indices -------------------------------------------------------

def ppermute(x, axis_name, perm, *, mesh):
    """Send from source to destination for each pair of `perm` (any iterable); others get 0."""
    try:
        perm = tuple(tuple(p) for p in perm)
    except TypeError:
        raise TypeError(f"ppermute: perm={perm!r} must be a list of (source, destination) pairs, "
                        "e.g. [(0, 1), (1, 0)].") from None
    return _tree_map(lambda v: bind("ppermute", v, mesh=mesh, axis_name=_names(axis_name), perm=perm), x)


def pshuffle(x, axis_name, perm, *, mesh):
    """Output at index i comes from input index perm[i] (ppermute with pairs (perm[i], i))."""
    perm = list(perm)
    if set(perm) != set(range(len(perm))):
        raise ValueError(f"`perm` does not represent a permutation: {perm}")
    return ppermute(x, axis_name, list(zip(perm, range(len(perm)))), mesh=mesh)


def pbroadcast(x, axis_name, source, *, mesh):
    """Every device receives the value at linear index `source` over `axis_name`."""
    return _tree_map(lambda v: bind("pbroadcast", v, mesh=mesh, axis_name=axis_name, source=source), x)


def axis_index(axis_name, *, mesh):
    """int32 linear index over `axis_name` (row-major in the order given), stacked."""
    return bind("axis_index", mesh=mesh, axis_name=axis_name)


def axis_size(axis_name, *, mesh) -> int:
    """Product of the sizes of the named axes."""
    return group_size_total(mesh, axis_name)


def psend(x, axis_name, perm, *, mesh):
    """Send x along `perm`; returns the token `precv` takes."""
    return bind("psend", x, mesh=mesh, axis_name=_names(axis_name), perm=tuple(map(tuple, perm)))


def precv(token, out_shape, axis_name, perm, *, mesh):
    """Receive what the matching psend sent (zeros where no pair targets the device)."""
    return bind("precv", token, mesh=mesh, out_shape=out_shape, axis_name=_names(axis_name),
                perm=tuple(map(tuple, perm)))


# ---- manual-axis-type casts (no-ops on data) --------------------------------------------------

def _infer_mat(x, mesh):
    shape = np.shape(x)[: mesh.ndim]
    return vma.Mat(varying={n for n, s in zip(mesh.axis_names, shape) if s > 1})


def pcast(x, axis_name, *, to, mesh, mat=None):
    """jax.lax.pcast on data (the identity) after checking JAX's allowed conversions.

    `mat` is the value's manual axis type; by default axes where x has a mesh dim of
    size > 1 are varying and the others invariant.
    """
    vma.pcast_type(mat if mat is not None else _infer_mat(x, mesh), axis_name, to)
    return bind("pvary", x, mesh=mesh, axes=_names(axis_name))


def pvary(x, axis_name, *, mesh):
    """Invariant -> varying cast (identity on data)."""
    return bind("pvary", x, mesh=mesh, axes=_names(axis_name))


preduced = vary_unreduced_cast = reduced_vary_cast = pvary


# ---- async pairs ------------------------------------------------------------------------------

def all_gather_start(x, axis_name, **kw):
    return asyncs.start(all_gather(x, axis_name, **kw), "all_gather")


def psum_start(x, axis_name, **kw):
    return asyncs.start(psum(x, axis_name, **kw), "psum")


def psum_scatter_start(x, axis_name, **kw):
    return asyncs.start(psum_scatter(x, axis_name, **kw), "psum_scatter")


def all_to_all_start(x, axis_name, split_axis, concat_axis, **kw):
    return asyncs.start(all_to_all(x, axis_name, split_axis, concat_axis, **kw), "all_to_all")


def ppermute_start(x, axis_name, perm, **kw):
    return asyncs.start(ppermute(x, axis_name, perm, **kw), "ppermute")


def pbroadcast_start(x, axis_name, source, **kw):
    return asyncs.start(pbroadcast(x, axis_name, source, **kw), "pbroadcast")


def _done(name):
    def fn(future):
        return asyncs.done(future, name + "_done")
    fn.__name__ = fn.__qualname__ = name + "_done"
    fn.__doc__ = f"Resolve the Future of `{name}_start` (equal to the synchronous `{name}`)."
    return fn


all_gather_done = _done("all_gather")
psum_done = _done("psum")
psum_scatter_done = _done("psum_scatter")
all_to_all_done = _done("all_to_all")
ppermute_done = _done("ppermute")
pbroadcast_done = _done("pbroadcast")
