"""The collective primitives of jax/_src/lax/parallel.py (0.10 - 0.12), one rule each, by name.

Each rule takes the operands as stacked arrays (mesh dims first), the mesh, and the params
exactly as JAX binds the primitive (`axes`, `axis_index_groups`, `axis_name`, `axis_size`,
`all_gather_dimension`, `tiled`, `perm`, `source`, ...), so a parameter renamed in a new JAX
fails loudly instead of being ignored. It calls the primitive's kernel (reductions, gather,
scatter, alltoall, ragged, permute, p2p, vma).

This table is the one semantics of refsim's collectives: the jaxpr interpreter registers a
rule per entry (refsim/interpreter/rules/collectives.py, with the region's mesh), and the
eager functions of `refsim.collectives` do what the `jax.lax` wrapper does before it binds,
then `bind` here. Async `*_start` rules compute their synchronous primitive and wrap it in a
Future; `*_done` resolves it (refsim.collectives.asyncs). Names that changed between JAX
versions (`vary_unreduced_cast_p` -> `vary_unreduced_cast`, `reduced_vary_cast_p` ->
`reduced_vary_cast`) are listed under both.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from refsim.collectives import asyncs, p2p
from refsim.collectives import alltoall as _a2a
from refsim.collectives import gather as _gather
from refsim.collectives import permute as _permute
from refsim.collectives import ragged as _ragged
from refsim.collectives import reductions as _red
from refsim.collectives import scatter as _scatter
from refsim.collectives.vma import identity_cast

#: {primitive name: rule(*operands, mesh, **params)}
PRIMITIVES: dict[str, Callable[..., Any]] = {}


def primitive(*names: str):
    """Decorator adding a rule to `PRIMITIVES` under one or more primitive names."""

    def deco(fn):
        for name in names:
            if name in PRIMITIVES:
                raise ValueError(f"collective primitive {name!r} already has a rule ({PRIMITIVES[name].__qualname__}); "
                                 "remove one of the two.")
            PRIMITIVES[name] = fn
        return fn

    return deco


def bind(name: str, *operands, mesh, **params):
    """Run collective primitive `name` on stacked `operands` over `mesh`, with `params` as JAX
    binds them: what an equation `name[**params] operands` computes in a manual region."""
    try:
        rule = PRIMITIVES[name]
    except KeyError:
        raise ValueError(f"{name!r} is not a collective primitive refsim knows; known: "
                         f"{', '.join(sorted(PRIMITIVES))}.") from None
    return rule(*operands, mesh=mesh, **params)


# ---- reductions ------------------------------------------------------------------------------

# Two families of one shape each, built from their kernels: the grouped reductions bind
# (axes, axis_index_groups), the ungrouped ones (psum_invariant, unreduced_*) bind only axes.
def _grouped(kernel):
    def rule(x, *, mesh, axes, axis_index_groups):
        return kernel(x, mesh=mesh, axes=axes, axis_index_groups=axis_index_groups)
    rule.__name__ = rule.__qualname__ = kernel.__name__
    return primitive(kernel.__name__)(rule)


def _ungrouped(kernel):
    def rule(x, *, mesh, axes):
        return kernel(x, mesh=mesh, axes=axes)
    rule.__name__ = rule.__qualname__ = kernel.__name__
    return primitive(kernel.__name__)(rule)


psum = _grouped(_red.psum)
pmax = _grouped(_red.pmax)
pmin = _grouped(_red.pmin)
psum_invariant = _ungrouped(_red.psum_invariant)
unreduced_psum = _ungrouped(_red.unreduced_psum)
unreduced_pmax = _ungrouped(_red.unreduced_pmax)
unreduced_pmin = _ungrouped(_red.unreduced_pmin)


# ---- no-op type casts ------------------------------------------------------------------------

@primitive("pvary", "preduced", "vary_unreduced_cast", "vary_unreduced_cast_p",
           "reduced_vary_cast", "reduced_vary_cast_p")
def cast(x, *, mesh, axes):
    return identity_cast(x, mesh=mesh, axes=axes)


# ---- gather / scatter / all-to-all -----------------------------------------------------------

@primitive("all_gather")
def all_gather(x, *, mesh, all_gather_dimension, axis_name, axis_index_groups, axis_size, tiled):
    return _gather.all_gather(x, mesh=mesh, axis_name=axis_name, all_gather_dimension=all_gather_dimension,
                              axis_size=axis_size, axis_index_groups=axis_index_groups, tiled=tiled)


@primitive("all_gather_invariant")
def all_gather_invariant(x, *, mesh, all_gather_dimension, axis_name, axis_size, tiled):
    return _gather.all_gather_invariant(x, mesh=mesh, axis_name=axis_name, axis_size=axis_size, tiled=tiled,
                                        all_gather_dimension=all_gather_dimension)


@primitive("all_gather_reduced")
def all_gather_reduced(x, *, mesh, all_gather_dimension, axis_name, axis_size, tiled):
    return _gather.all_gather_reduced(x, mesh=mesh, axis_name=axis_name, axis_size=axis_size, tiled=tiled,
                                      all_gather_dimension=all_gather_dimension)


def _non_negative(api: str, **dims) -> None:
    """A dimension param of a traced program must be >= 0: jax >= 0.12 normalises a negative one
    when it binds the primitive, jax 0.10 binds it as given and its lowering then fails StableHLO's
    verifier ("attribute 'scatter_dimension' failed to satisfy constraint: ... non-negative"), a
    ValueError. refsim refuses it the same way instead of counting it from the end."""
    for name, d in dims.items():
        if isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d < 0:
            raise ValueError(
                f"{api}: {name}={d} is negative in the traced program, and XLA's {api} needs a non-negative "
                f"dimension (StableHLO's verifier: '{name}' must be non-negative; this JAX passes it as "
                f"given). Count the dimension from the front: {name}=x.ndim - {-d}.")


@primitive("reduce_scatter")
def reduce_scatter(x, *, mesh, scatter_dimension, axis_name, axis_index_groups, axis_size, tiled,
                   api="reduce_scatter"):
    """`api`, not a JAX param, names the function in error messages: the eager `psum_scatter`
    passes its own name, as a user of it never sees the primitive's (and counts a negative
    dimension from the end, as jax.lax.psum_scatter does from jax 0.12 on)."""
    if api == "reduce_scatter":
        _non_negative(api, scatter_dimension=scatter_dimension)
    return _scatter.reduce_scatter(x, mesh=mesh, axis_name=axis_name, scatter_dimension=scatter_dimension,
                                   axis_size=axis_size, axis_index_groups=axis_index_groups, tiled=tiled, api=api)


@primitive("unreduced_reduce_scatter")
def unreduced_reduce_scatter(x, *, mesh, scatter_dimension, axis_name, axis_size, tiled):
    return _scatter.unreduced_reduce_scatter(x, mesh=mesh, axis_name=axis_name, scatter_dimension=scatter_dimension,
                                             axis_size=axis_size, tiled=tiled)


@primitive("all_to_all")
def all_to_all(x, *, mesh, split_axis, concat_axis, axis_name, axis_index_groups, tiled):
    _non_negative("all_to_all", split_axis=split_axis, concat_axis=concat_axis)
    return _a2a.all_to_all(x, mesh=mesh, axis_name=axis_name, split_axis=split_axis, concat_axis=concat_axis,
                           axis_index_groups=axis_index_groups, tiled=tiled)


@primitive("ragged_all_to_all")
def ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, mesh,
                      axis_name, axis_index_groups):
    return _ragged.ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes,
                                     mesh=mesh, axis_name=axis_name, axis_index_groups=axis_index_groups)


# ---- permutations, broadcast, indices, point-to-point ----------------------------------------

@primitive("ppermute")
def ppermute(x, *, mesh, axis_name, perm):
    return _permute.ppermute(x, mesh=mesh, axis_name=axis_name, perm=perm)


@primitive("pbroadcast")
def pbroadcast(x, *, mesh, axis_name, source):
    return _permute.pbroadcast(x, mesh=mesh, axis_name=axis_name, source=source)


@primitive("pbroadcast_dynamic")
def pbroadcast_dynamic(x, source, *, mesh, axis_name):
    return _permute.pbroadcast_dynamic(x, source, mesh=mesh, axis_name=axis_name)


@primitive("axis_index")
def axis_index(*, mesh, axis_name):
    return _permute.axis_index(mesh=mesh, axis_name=axis_name)


@primitive("psend")
def psend(x, *, mesh, axis_name, perm):
    return p2p.psend(x, mesh=mesh, axis_name=axis_name, perm=perm)


@primitive("precv")
def precv(token, *, mesh, out_shape, axis_name, perm):
    return p2p.precv(token, mesh=mesh, out_shape=out_shape, axis_name=axis_name, perm=perm)


# ---- async start / done pairs: start computes the synchronous op, done resolves it -----------

_SYNC = {
    "all_gather_start": all_gather,
    "all_gather_reduced_start": all_gather_reduced,
    "psum_start": psum,
    "psum_invariant_start": psum_invariant,
    "unreduced_psum_start": unreduced_psum,
    "reduce_scatter_start": reduce_scatter,
    "unreduced_reduce_scatter_start": unreduced_reduce_scatter,
    "all_to_all_start": all_to_all,
    "pbroadcast_start": pbroadcast,
    "ppermute_start": ppermute,
}


def _make_start(name, sync):
    def rule(*operands, mesh, **params):
        return asyncs.start(sync(*operands, mesh=mesh, **params), name[: -len("_start")])
    rule.__name__ = rule.__qualname__ = name
    rule.__doc__ = f"`{name}`: the synchronous `{sync.__name__}` rule's result, wrapped in a Future."
    return primitive(name)(rule)


for _name, _sync in _SYNC.items():
    _make_start(_name, _sync)


@primitive("all_gather_done", "psum_done", "reduce_scatter_done", "all_to_all_done",
           "pbroadcast_done", "ppermute_done")
def done(future, *, mesh):
    return asyncs.done(future, "async done")
