"""Primitives whose CPU lowering JAX builds by tracing a Python implementation.

JAX lowers `random_gamma` (Marsaglia-Tsang rejection sampling), `regularized_incomplete_beta`
and `igamma_grad_a` (series / continued fractions) and, on CPU, `ragged_dot_general` (groups
expanded to masked dense operands) with `mlir.lower_fun(fn)`, and a hijax `call_hi_primitive`
through its `expand` (jax 0.12's jnp.searchsorted is one), and jax 0.12's `polynomial` (Horner):
XLA runs the
jaxpr of `fn`. refsim traces the same `fn` (`refsim.compat.lowering_decomposition`) at the
operands' local shapes and evaluates that jaxpr with its own rules, so the algorithm, its
key splitting and its rounding steps are JAX's, and every primitive in it is refsim's.
Traces are cached per (primitive, operand types, params).
"""
from __future__ import annotations

import functools

import numpy as np

from refsim import compat
from refsim.interpreter import core
from refsim.interpreter.registry import register


@functools.lru_cache(maxsize=256)
def decomposition_jaxpr(name: str, types: tuple, params: tuple):
    """The closed jaxpr of the function JAX's lowering of `name` traces, at operand `types` ((shape,
    dtype) each) and `params` (sorted items); cached. The value rule below and the bound walk's rule
    (`refsim.bounds.rules.control`) both run it."""
    import jax

    fn = compat.lowering_decomposition(name)
    kw = dict(params)
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in types]
    return jax.make_jaxpr(lambda *a: fn(*a, **kw))(*args)


_MULTIPLE = {"call_hi_primitive": True}  # primitives with multiple results


def _jax_dtype(x: np.ndarray):
    return compat.jax_key_dtype(x.dtype) or x.dtype


def _decomposed(name: str):
    def rule(ctx, *args, **params):
        nm = ctx.nm
        types = tuple((tuple(np.shape(a)[nm:]), _jax_dtype(np.asarray(a))) for a in args)
        closed = decomposition_jaxpr(name, types, tuple(sorted(params.items())))
        outs = core.eval_closed_jaxpr(closed, *args, ctx=ctx)
        return outs if _MULTIPLE.get(name) else outs[0]

    rule.__name__ = rule.__qualname__ = f"{name}_rule"
    rule.__doc__ = f"`{name}`: the jaxpr of the function JAX's CPU lowering traces, run by refsim's rules."
    return rule


for _name in ("random_gamma", "regularized_incomplete_beta", "igamma_grad_a", "ragged_dot_general",
              "call_hi_primitive", "polynomial"):
    register(_name)(_decomposed(_name))
