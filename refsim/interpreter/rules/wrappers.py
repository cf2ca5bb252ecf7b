"""Primitives that wrap a sub-jaxpr or only order / annotate values.

`lax.composite`, `compute_on`, `custom_vmap_call` and `custom_partitioning` run their jaxpr
(the composite's decomposition is what XLA:CPU executes; compute_on only chooses where;
custom_vmap's call is the unbatched function; custom_partitioning's call is the function's
global meaning, which its partition rule only computes shard by shard). `tie(x, y)` is y, `dce_sink` keeps a value alive,
`create_token` / `after_all` make ordering tokens, `lax.empty` / `empty2` an array whose
contents XLA leaves undefined (refsim: zeros).
"""
from __future__ import annotations

import numpy as np

from refsim import compat
from refsim.interpreter import core
from refsim.interpreter.registry import register


def _run(ctx, jaxpr, args):
    if hasattr(jaxpr, "consts"):
        return core.eval_closed_jaxpr(jaxpr, *args, ctx=ctx)
    return core.eval_jaxpr(jaxpr, (), *args, ctx=ctx)


@register("composite")
def composite_rule(ctx, *args, name, attributes, version, jaxpr=None, call_jaxpr=None):
    """`lax.composite`: its decomposition (the jaxpr), as XLA:CPU inlines it. jax 0.10 binds it
    as `jaxpr`, jax 0.12 as `call_jaxpr`; exactly one is present."""
    return _run(ctx, jaxpr if jaxpr is not None else call_jaxpr, args)


@register("compute_on")
def compute_on_rule(ctx, *args, jaxpr, compute_type, out_memory_spaces=None, **params):
    """`compute_on(...)`: the body's values (it only picks the host or device that computes them)."""
    return _run(ctx, jaxpr, args)


@register("custom_partitioning")
def custom_partitioning_rule(ctx, *args, call, in_tree, out_tree, propagate_user_sharding, partition,
                             infer_sharding_from_operands, decode_shardings, sharding_rule, static_args):
    """`jax.experimental.custom_partitioning`: the decorated function's own body (`call`, as
    JAX's impl rule evaluates it). The user's `partition` rule only says how XLA computes the
    same value sharded; refsim checks that the sharded computation gives the global meaning.
    `call` is a ClosedJaxpr in jax 0.10 and a Jaxpr in 0.12."""
    return _run(ctx, call, args)


@register("custom_vmap_call")
def custom_vmap_call_rule(ctx, *args, call, rule, in_tree, out_tree):
    """`jax.custom_batching.custom_vmap`, unbatched: the function itself (JAX's impl)."""
    return _run(ctx, call, args)


@register("program_order")
def program_order_rule(ctx, *args, call_jaxpr, enforce, strict_in, strict_out, exclude_mask, **params):
    """jax 0.12 `program_order`: the body's values (it only constrains XLA's schedule)."""
    return _run(ctx, call_jaxpr, args)


@register("xla_metadata_call")
def xla_metadata_call_rule(ctx, *args, jaxpr, xla_metadata, ad_metadata):
    """jax 0.12 `xla_metadata` on a function: the function's values (metadata only tags ops)."""
    return _run(ctx, jaxpr, args)


@register("tie")
def tie_rule(ctx, x, y):
    """`tie(x, y)`: y (x only orders the computation)."""
    return y


@register("dce_sink")
def dce_sink_rule(ctx, x, **params):
    return []


@register("create_token")
def create_token_rule(ctx, *operands):
    """A fresh ordering token (refsim is sequential; tokens carry no data)."""
    return core.lift(np.zeros((0,), np.bool_), ctx.nm)


@register("after_all")
def after_all_rule(ctx, *tokens):
    return core.lift(np.zeros((0,), np.bool_), ctx.nm)


@register("empty")
def empty_rule(ctx, *, shape, dtype, out_sharding=None):
    """`lax.empty`: contents undefined in XLA; refsim gives zeros."""
    return core.lift(np.zeros(tuple(shape), compat.physical_dtype(dtype)), ctx.nm)


@register("empty2")
def empty2_rule(ctx, *, dtype, memory_space=None):
    return core.lift(np.zeros((), compat.physical_dtype(dtype)), ctx.nm)


@register("xla_metadata_value")
def xla_metadata_value_rule(ctx, x, *, xla_metadata_kvs):
    """`jax.experimental.xla_metadata`: the value (the metadata only annotates XLA's op)."""
    return x
