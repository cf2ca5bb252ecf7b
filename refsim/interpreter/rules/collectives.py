"""Interpreter rules for every collective primitive of jax/_src/lax/parallel.py (0.10 - 0.12).

Each rule takes the equation's params exactly as JAX binds them and calls the
primitive's kernel in `refsim.collectives` with `ctx.mesh`; values carry
`ctx.nm == ctx.mesh.ndim` leading mesh dims. Names that changed between JAX
versions (`vary_unreduced_cast_p` -> `vary_unreduced_cast`, `reduced_vary_cast_p` ->
`reduced_vary_cast`) are registered under both.
"""
from __future__ import annotations

from refsim.collectives import asyncs, p2p
from refsim.collectives import alltoall as _a2a
from refsim.collectives import gather as _gather
from refsim.collectives import permute as _permute
from refsim.collectives import ragged as _ragged
from refsim.collectives import reductions as _red
from refsim.collectives import scatter as _scatter
from refsim.collectives.vma import identity_cast
from refsim.interpreter.registry import register


def _mesh(ctx, name):
    if ctx.mesh is None or ctx.nm != ctx.mesh.ndim:
        raise NameError(
            f"{name} needs a manual mesh context (shard_map / pmap), but the interpreter is in "
            f"global view (nm={ctx.nm}); call it under jax.shard_map or jax.pmap.")
    return ctx.mesh


# ---- reductions ------------------------------------------------------------------------------

@register("psum")
def _psum(ctx, x, *, axes, axis_index_groups):
    return _red.psum(x, mesh=_mesh(ctx, "psum"), axes=axes, axis_index_groups=axis_index_groups)


@register("pmax")
def _pmax(ctx, x, *, axes, axis_index_groups):
    return _red.pmax(x, mesh=_mesh(ctx, "pmax"), axes=axes, axis_index_groups=axis_index_groups)


@register("pmin")
def _pmin(ctx, x, *, axes, axis_index_groups):
    return _red.pmin(x, mesh=_mesh(ctx, "pmin"), axes=axes, axis_index_groups=axis_index_groups)


@register("psum_invariant")
def _psum_invariant(ctx, x, *, axes):
    return _red.psum_invariant(x, mesh=_mesh(ctx, "psum_invariant"), axes=axes)


@register("unreduced_psum")
def _unreduced_psum(ctx, x, *, axes):
    return _red.unreduced_psum(x, mesh=_mesh(ctx, "unreduced_psum"), axes=axes)


@register("unreduced_pmax")
def _unreduced_pmax(ctx, x, *, axes):
    return _red.unreduced_pmax(x, mesh=_mesh(ctx, "unreduced_pmax"), axes=axes)


@register("unreduced_pmin")
def _unreduced_pmin(ctx, x, *, axes):
    return _red.unreduced_pmin(x, mesh=_mesh(ctx, "unreduced_pmin"), axes=axes)


# ---- no-op type casts ------------------------------------------------------------------------

@register("pvary", "preduced", "vary_unreduced_cast", "vary_unreduced_cast_p",
          "reduced_vary_cast", "reduced_vary_cast_p")
def _cast(ctx, x, *, axes):
    return identity_cast(x, mesh=_mesh(ctx, "pvary"), axes=axes)


# ---- gather / scatter / all-to-all -----------------------------------------------------------

@register("all_gather")
def _all_gather(ctx, x, *, all_gather_dimension, axis_name, axis_index_groups, axis_size, tiled):
    return _gather.all_gather(x, mesh=_mesh(ctx, "all_gather"), axis_name=axis_name,
                              all_gather_dimension=all_gather_dimension, axis_size=axis_size,
                              axis_index_groups=axis_index_groups, tiled=tiled)


@register("all_gather_invariant")
def _all_gather_invariant(ctx, x, *, all_gather_dimension, axis_name, axis_size, tiled):
    return _gather.all_gather_invariant(x, mesh=_mesh(ctx, "all_gather_invariant"),
                                        axis_name=axis_name, axis_size=axis_size, tiled=tiled,
                                        all_gather_dimension=all_gather_dimension)


@register("all_gather_reduced")
def _all_gather_reduced(ctx, x, *, all_gather_dimension, axis_name, axis_size, tiled):
    return _gather.all_gather_reduced(x, mesh=_mesh(ctx, "all_gather_reduced"),
                                      axis_name=axis_name, axis_size=axis_size, tiled=tiled,
                                      all_gather_dimension=all_gather_dimension)


@register("reduce_scatter")
def _reduce_scatter(ctx, x, *, scatter_dimension, axis_name, axis_index_groups, axis_size, tiled):
    return _scatter.reduce_scatter(x, mesh=_mesh(ctx, "reduce_scatter"), axis_name=axis_name,
                                   scatter_dimension=scatter_dimension, axis_size=axis_size,
                                   axis_index_groups=axis_index_groups, tiled=tiled)


@register("unreduced_reduce_scatter")
def _unreduced_reduce_scatter(ctx, x, *, scatter_dimension, axis_name, axis_size, tiled):
    return _scatter.unreduced_reduce_scatter(
        x, mesh=_mesh(ctx, "unreduced_reduce_scatter"), axis_name=axis_name,
        scatter_dimension=scatter_dimension, axis_size=axis_size, tiled=tiled)


@register("all_to_all")
def _all_to_all(ctx, x, *, split_axis, concat_axis, axis_name, axis_index_groups, tiled):
    return _a2a.all_to_all(x, mesh=_mesh(ctx, "all_to_all"), axis_name=axis_name,
                           split_axis=split_axis, concat_axis=concat_axis,
                           axis_index_groups=axis_index_groups, tiled=tiled)


@register("ragged_all_to_all")
def _ragged_all_to_all(ctx, operand, output, input_offsets, send_sizes, output_offsets,
                       recv_sizes, *, axis_name, axis_index_groups):
    return _ragged.ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets,
                                     recv_sizes, mesh=_mesh(ctx, "ragged_all_to_all"),
                                     axis_name=axis_name, axis_index_groups=axis_index_groups)


# ---- permutations, broadcast, indices, point-to-point ----------------------------------------

@register("ppermute")
def _ppermute(ctx, x, *, axis_name, perm):
    return _permute.ppermute(x, mesh=_mesh(ctx, "ppermute"), axis_name=axis_name, perm=perm)


@register("pbroadcast")
def _pbroadcast(ctx, x, *, axis_name, source):
    return _permute.pbroadcast(x, mesh=_mesh(ctx, "pbroadcast"), axis_name=axis_name,
                               source=source)


@register("pbroadcast_dynamic")
def _pbroadcast_dynamic(ctx, x, source, *, axis_name):
    return _permute.pbroadcast_dynamic(x, source, mesh=_mesh(ctx, "pbroadcast"),
                                       axis_name=axis_name)


@register("axis_index")
def _axis_index(ctx, *, axis_name):
    return _permute.axis_index(mesh=_mesh(ctx, "axis_index"), axis_name=axis_name)


@register("psend")
def _psend(ctx, x, *, axis_name, perm):
    return p2p.psend(x, mesh=_mesh(ctx, "psend"), axis_name=axis_name, perm=perm)


@register("precv")
def _precv(ctx, token, *, out_shape, axis_name, perm):
    return p2p.precv(token, mesh=_mesh(ctx, "precv"), out_shape=out_shape, axis_name=axis_name,
                     perm=perm)


# ---- async start / done pairs: start computes the synchronous op, done resolves it -----------

_SYNC = {
    "all_gather_start": _all_gather,
    "all_gather_reduced_start": _all_gather_reduced,
    "psum_start": _psum,
    "psum_invariant_start": _psum_invariant,
    "unreduced_psum_start": _unreduced_psum,
    "reduce_scatter_start": _reduce_scatter,
    "unreduced_reduce_scatter_start": _unreduced_reduce_scatter,
    "all_to_all_start": _all_to_all,
    "pbroadcast_start": _pbroadcast,
    "ppermute_start": _ppermute,
}


def _make_start(name, sync):
    def rule(ctx, *args, **params):
        return asyncs.start(sync(ctx, *args, **params), name[: -len("_start")])
    rule.__name__ = rule.__qualname__ = "_" + name
    rule.__doc__ = f"`{name}`: the synchronous rule's result, wrapped in a Future."
    return register(name)(rule)


for _name, _sync in _SYNC.items():
    _make_start(_name, _sync)


@register("all_gather_done", "psum_done", "reduce_scatter_done", "all_to_all_done",
          "pbroadcast_done", "ppermute_done")
def _done(ctx, future):
    return asyncs.done(future, "async done")
