"""Primitives that JAX's autodiff leaves in jaxprs of `jax.grad` / `jax.vjp` programs.

`add_any` is `ad.add_jaxvals`: the sum of two cotangent contributions, an elementwise
add of operands with equal shape and dtype (mesh dims broadcast, as every rule does).
"""
from __future__ import annotations

import numpy as np

from refsim.interpreter.registry import register


@register("add_any")
def _add_any(ctx, x, y):
    """`add_jaxvals`: x + y in the operands' dtype (no promotion; JAX guarantees equal types)."""
    with np.errstate(all="ignore"):
        return np.add(x, y, dtype=np.result_type(x))
