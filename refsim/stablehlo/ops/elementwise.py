"""Elementwise StableHLO / CHLO ops, evaluated by refsim's jaxpr kernels.

Each StableHLO op maps to the jaxpr primitive JAX lowers to it, and the rule calls that
primitive's refsim kernel with the device dimension as the one mesh dimension: the
semantics (integer division by zero, NaN-propagating max, shifts past the bit width,
narrow floats computed in f32) are stated once, in `refsim/interpreter/rules/elementwise.py`.
"""
from __future__ import annotations

import numpy as np

from refsim.interpreter.registry import RULES
from refsim.interpreter.rules import elementwise as E
from refsim.interpreter.rules.sorting import total_order_key
from refsim.stablehlo.registry import register

# StableHLO / CHLO op -> jaxpr primitive whose refsim kernel has the same semantics
_SAME = {
    "add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "remainder": "rem",
    "maximum": "max", "minimum": "min", "power": "pow", "atan2": "atan2", "and": "and", "or": "or",
    "xor": "xor", "not": "not", "shift_left": "shift_left", "shift_right_logical": "shift_right_logical",
    "shift_right_arithmetic": "shift_right_arithmetic", "negate": "neg", "abs": "abs", "sign": "sign",
    "exponential": "exp", "exponential_minus_one": "expm1", "log": "log", "log_plus_one": "log1p",
    "logistic": "logistic", "sqrt": "sqrt", "rsqrt": "rsqrt", "cbrt": "cbrt", "sine": "sin",
    "cosine": "cos", "tan": "tan", "tanh": "tanh", "floor": "floor", "ceil": "ceil",
    "is_finite": "is_finite", "popcnt": "population_count", "count_leading_zeros": "clz",
    "real": "real", "imag": "imag", "clamp": "clamp",
}
_CHLO = {
    "erf": "erf", "erfc": "erfc", "erf_inv": "erf_inv", "lgamma": "lgamma", "digamma": "digamma",
    "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "asinh": "asinh",
    "acosh": "acosh", "atanh": "atanh", "bessel_i1e": "bessel_i1e", "igamma": "igamma",
    "igammac": "igammac", "zeta": "zeta", "polygamma": "polygamma", "next_after": "nextafter",
    "square": "square",
}


# Integer (and bool) operands of one dtype and rank: refsim's kernel for these ops is the plain
# ufunc (wrapping arithmetic, bitwise logic, exact max/min), so it is called directly and the
# float-normalisation wrapper is skipped (random-bit generators are hundreds of such ops).
_INT_UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
               "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}


def _make(prim: str):
    kernel = RULES[prim]
    fast = _INT_UFUNCS.get(prim)

    def rule(m, op, env, *xs):
        if fast is not None:
            x, y = xs
            if x.dtype == y.dtype and x.ndim == y.ndim and x.dtype.kind in "iub":
                return fast(x, y)
        return kernel(m.ctx, *xs)

    rule.__name__ = rule.__qualname__ = f"{prim}_rule"
    rule.__doc__ = f"Elementwise, as refsim's `{prim}` kernel."
    return rule


def _register_tables():
    for name, prim in _SAME.items():
        register(f"stablehlo.{name}")(_make(prim))
    for name, prim in _CHLO.items():
        register(f"chlo.{name}")(_make(prim))


_register_tables()


@register("stablehlo.round_nearest_afz", "stablehlo.round_nearest_even")
def round_rule(m, op, env, x):
    """Round half away from zero (afz) or to even."""
    return RULES["round"](m.ctx, x, rounding_method=0 if op.name.endswith("afz") else 1)


@register("stablehlo.convert")
def convert_rule(m, op, env, x):
    """StableHLO convert (float -> int truncates and saturates, as XLA:CPU)."""
    return E.convert(x, op.types[0].dtype)


@register("stablehlo.bitcast_convert")
def bitcast_convert_rule(m, op, env, x):
    return RULES["bitcast_convert_type"](m.ctx, x, new_dtype=op.types[0].dtype)


@register("stablehlo.select")
def select_rule(m, op, env, pred, on_true, on_false):
    """pred ? on_true : on_false, elementwise (a scalar pred selects whole operands)."""
    return RULES["select_n"](m.ctx, pred, on_false, on_true)


@register("stablehlo.complex")
def complex_rule(m, op, env, re, im):
    return RULES["complex"](m.ctx, re, im)


_DIRECTIONS = {"EQ": "eq", "NE": "ne", "LT": "lt", "LE": "le", "GT": "gt", "GE": "ge"}


@register("stablehlo.compare")
def compare_rule(m, op, env, x, y):
    """StableHLO compare; compare_type TOTALORDER orders floats by their total order (-NaN <
    -Inf < ... < -0 < +0 < ... < +Inf < +NaN), as `lax.sort` compares."""
    direction = _DIRECTIONS[op.attrs["comparison_direction"]]
    if op.attrs.get("compare_type") == "TOTALORDER":
        x, y = np.broadcast_arrays(np.asarray(x), np.asarray(y))
        x, y = total_order_key(x), total_order_key(y)
    return RULES[direction](m.ctx, x, y)
