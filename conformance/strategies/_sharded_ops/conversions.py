"""Conversions: convert_element_type / astype and bitcast_convert_type."""
from __future__ import annotations

import math

from conformance.strategies._sharded_graph import BOOL, F32, I32, Builder, float_result, int_result
from conformance.strategies._sharded_ops.common import jnp_dtype, keep_spec


def _convert(b: Builder) -> bool:
    a = b.pick(lambda v: not v.manual and v.fine)
    if a is None:
        return False
    if a.dtype == BOOL:
        to = b.choice([F32, I32])
        b.emit("convert", f"{a.name}.astype({jnp_dtype(to)})", a.shape, to, main=a, spec=keep_spec(b, a),
               lo=0.0, hi=1.0, frac=0, err=0.0)
        return True
    kinds = ["bfloat16", "float16", "bool"]
    if a.dtype == F32 and a.exact and a.mag < 2.0 ** 30:
        kinds.append("int32")
    if a.dtype == I32:
        kinds.append("float32")
    kind = b.choice(kinds)
    if kind == "bool":
        if not a.exact:
            return False
        b.emit("convert", f"{a.name}.astype(jnp.bool_)", a.shape, BOOL, main=a, spec=keep_spec(b, a), lo=0.0, hi=1.0)
    elif kind == "int32":
        b.emit("convert", f"{a.name}.astype(jnp.int32)", a.shape, I32, main=a, spec=keep_spec(b, a),
               **int_result(math.floor(a.lo), math.ceil(a.hi)))
    elif kind == "float32":
        b.emit("convert", f"{a.name}.astype(jnp.float32)", a.shape, F32, main=a, spec=keep_spec(b, a),
               **float_result(a.lo, a.hi, 0, 0.0))
    else:
        bits = 8 if kind == "bfloat16" else 11
        if a.dtype == I32:
            back, dt = "jnp.int32", I32
        else:
            back, dt = "jnp.float32", F32
        if kind == "float16" and a.mag > 60000:
            return False
        mag = a.mag
        exact = a.exact and a.frac is not None and mag * 2.0 ** a.frac <= 2.0 ** bits and (kind != "float16" or
                                                                                          a.frac <= 14)
        if dt == I32 and not exact:
            return False   # float -> int of a rounded value: a step function of the rounding
        err = 0.0 if exact else a.err + mag * 2.0 ** -(bits - 1)
        b.emit("convert", f"{a.name}.astype(jnp.{kind}).astype({back})", a.shape, dt, main=a,
               spec=keep_spec(b, a), lo=a.lo, hi=a.hi, frac=a.frac, err=err)
    return True


def _bitcast(b: Builder) -> bool:
    a = b.pick(lambda v: not v.manual and v.dtype in (F32, I32) and v.exact)
    if a is None:
        return False
    if a.dtype == F32:
        # zeros normalised first: the sign of a zero is left open by several ops (x + 0 folding)
        expr = f"jax.lax.bitcast_convert_type(jnp.where({a.name} == 0, jnp.float32(0), {a.name}), jnp.int32)"
        b.emit("bitcast", expr, a.shape, I32, main=a, spec=keep_spec(b, a), **int_result(-2.0 ** 31, 2.0 ** 31))
    else:
        # mantissa bits under exponent 0: floats in [1, 2) with 23 fraction bits
        expr = f"jax.lax.bitcast_convert_type(({a.name} & 0x7FFFFF) | 0x3F800000, jnp.float32)"
        b.emit("bitcast", expr, a.shape, F32, main=a, spec=keep_spec(b, a), lo=1.0, hi=2.0, frac=23, err=0.0)
    return True


#: This family's ops, by the name programs and the coverage table use.
OPS = {"convert": _convert, "bitcast": _bitcast}
