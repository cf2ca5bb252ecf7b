"""Interpreter rules for every collective primitive of jax/_src/lax/parallel.py (0.10 - 0.12).

The rules themselves live in one table, `refsim.collectives.primitives.PRIMITIVES` (params
exactly as JAX binds them), which refsim.collectives' eager functions bind through too: this
module registers each entry with the manual region's mesh, `ctx.mesh`. Values carry
`ctx.nm == ctx.mesh.ndim` leading mesh dims. A reduction whose axes are all positional
(`jax.vmap(f, axis_name=...)` of psum / pmax / pmin) reduces array dimensions and needs no
mesh: it runs in global view too.
"""
from __future__ import annotations

from refsim.collectives.primitives import PRIMITIVES
from refsim.collectives.reductions import is_positional, positional_reduce
from refsim.interpreter.registry import register


def _mesh(ctx, name):
    if ctx.mesh is None or ctx.nm != ctx.mesh.ndim:
        raise NameError(
            f"{name} needs a manual mesh context (shard_map / pmap), but the interpreter is in "
            f"global view (nm={ctx.nm}); call it under jax.shard_map or jax.pmap.")
    return ctx.mesh


#: Reductions JAX's vmap binds with positional (int) axes: {primitive name: op}.
POSITIONAL = {"psum": "sum", "pmax": "max", "pmin": "min", "psum_invariant": "sum"}


def _in_region(name, rule):
    op = POSITIONAL.get(name)

    def interpreted(ctx, *operands, **params):
        if op is not None and (ctx.mesh is None or ctx.nm != ctx.mesh.ndim) and is_positional(params["axes"]):
            # vmap(f, axis_name=...) of a collective outside a manual region: a local reduction
            return positional_reduce(*operands, op=op, api=name, nm=ctx.nm, **params)
        return rule(*operands, mesh=_mesh(ctx, name), **params)
    interpreted.__name__ = interpreted.__qualname__ = "_" + name
    interpreted.__doc__ = f"`{name}`: refsim.collectives.primitives.{rule.__name__} on the region's mesh."
    return interpreted


for _name, _rule in PRIMITIVES.items():
    register(_name)(_in_region(_name, _rule))
