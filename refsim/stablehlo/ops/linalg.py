"""dot_general and dot, evaluated by refsim's dot_general kernel (the device dim is a batch dim)."""
from __future__ import annotations

from refsim.interpreter.registry import RULES
from refsim.stablehlo.registry import register


@register("stablehlo.dot_general")
def dot_general_rule(m, op, env, lhs, rhs):
    """Result dims: batch, lhs free, rhs free; accumulated in the result type (f32 for bf16)."""
    d = op.attrs["dot_dimension_numbers"]
    dn = ((d["lhs_contracting_dimensions"], d["rhs_contracting_dimensions"]),
          (d["lhs_batching_dimensions"], d["rhs_batching_dimensions"]))
    return RULES["dot_general"](m.ctx, lhs, rhs, dimension_numbers=dn, precision=None,
                                preferred_element_type=op.types[0].dtype)


@register("stablehlo.dot")
def dot_rule(m, op, env, lhs, rhs):
    """HLO dot: the last lhs dim contracts with the first rhs dim (vector or matrix operands)."""
    dn = (((lhs.ndim - 2,), (0,)), ((), ()))
    return RULES["dot_general"](m.ctx, lhs, rhs, dimension_numbers=dn, precision=None,
                                preferred_element_type=op.types[0].dtype)
