"""Planted disagreements for programs without explicit collectives (a `jax.jit` program that
XLA's SPMD partitioner partitions), used with `conformance.faults.inject` like its registered
collective faults. Not registered in `conformance.faults.FAULTS`: the mutation suite measures
the built-in suites against those, and these target whole-program numerics instead.

>>> with faults.inject(planted.DOT_GENERAL_BF16):        # doctest: +SKIP
...     conformance.check(train_step, params, x, y)         # raises ConformanceError
"""
from __future__ import annotations

from conformance.faults import lowering as faults

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.


def _bf16_operands(orig, env):
    def rule(ctx, lhs, rhs, **params):
        import jax.numpy as jnp

        def rounded(value, aval):
            if not jnp.issubdtype(aval.dtype, jnp.floating) or aval.dtype == jnp.bfloat16:
                return value
            return faults.apply(ctx, lambda a: a.astype(jnp.bfloat16).astype(a.dtype), value, aval, aval)
        a_l, a_r = ctx.avals_in
        return orig(ctx, rounded(lhs, a_l), rounded(rhs, a_r), **params)
    return rule


DOT_GENERAL_BF16 = faults.Fault(
    "dot_general_bf16_operands",
    "dot_general rounds float32 operands to bfloat16 before multiplying (as a default-precision "
    "matmul on TPU does), so results lose about 8 bits",
    ("dot_general",), _bf16_operands)
