"""Helpers every op family uses: operand predicates, literals, the elementwise result's spec
and model, a partner operand, and the small shape rules two families share."""
from __future__ import annotations

import math

from conformance.strategies._sharded_graph import (
    BOOL, F32, I32, Builder, Val, float_result, int_result, spec_text, sum_result,
)

MAX_RANK = 4


def numeric(v: Val) -> bool:
    return v.dtype in (F32, I32) and v.fine and not v.manual


def floating(v: Val) -> bool:
    return v.dtype == F32 and v.fine and not v.manual


def exact_numeric(v: Val) -> bool:
    return numeric(v) and v.exact


def power_fits(mag: float, n: int, bits: int = 20) -> bool:
    """mag ** n stays below 2**bits (n <= 8), computed without overflowing a float."""
    return n <= 8 and (mag <= 1 or n * math.log2(mag) <= bits)


def literal(x, dtype: str) -> str:
    """A scalar literal of `dtype` (weak-typed Python scalars would follow the operand anyway)."""
    if dtype == F32:
        return repr(float(x))
    if dtype == I32:
        return repr(int(x))
    return repr(bool(x))


def jnp_dtype(dtype: str) -> str:
    return {F32: "jnp.float32", I32: "jnp.int32", BOOL: "jnp.bool_"}[dtype]


def fits(b: Builder, shape) -> bool:
    return len(shape) <= MAX_RANK and all(s >= 1 for s in shape) and math.prod(shape) <= b.max_elements


def keep_spec(b: Builder, v: Val):
    """The spec an elementwise result of `v` has: `v`'s (a type on Explicit, a hint on Auto)."""
    return v.spec


def result_model(dtype: str, lo, hi, frac=0, err=0.0, rounds=False) -> dict:
    if dtype == F32:
        return float_result(lo, hi, frac, err, rounds=rounds)
    if dtype == I32:
        return int_result(lo, hi)
    return dict(lo=0.0, hi=1.0, frac=0, err=0.0)


def partner(b: Builder, a: Val, *, exact: bool = False) -> tuple[str, Val | None]:
    """A second operand for an elementwise op on `a`: a value of the same shape and dtype, a
    scalar value, or a small literal (then the Val is None)."""
    ok = (lambda v: v is not a and v.dtype == a.dtype and (v.shape == a.shape or v.shape == ())
          and v.fine and not v.manual and (v.exact or not exact))
    v = b.pick(ok) if b.draw_int(0, 2) and any(ok(v) for v in b.pool) else None
    if v is not None:
        v = b.same_spec(v, a)
        return v.name, v
    c = b.choice([1, 2, -1, 3, 0.5, -0.25] if a.dtype == F32 else [1, 2, -1, 3, -5])
    return literal(c, a.dtype), None


def const_model(text: str, dtype: str) -> Val:
    x = float(text == "True") if text in ("True", "False") else float(text)
    frac = 0 if x == int(x) else 2
    return Val(text, (), dtype, x, x, frac, 0.0, ())


def max_frac(a: Val, o: Val):
    return None if a.frac is None or o.frac is None else max(a.frac, o.frac)


def dot_model(a: Val, o: Val, k: int) -> dict:
    """A dot product's result: sums of `k` products of `a`'s and `o`'s elements, in any order."""
    if a.dtype == I32:
        return int_result(-a.mag * o.mag * k, a.mag * o.mag * k)
    prod = Val("p", (), F32, -a.mag * o.mag, a.mag * o.mag,
               None if a.frac is None or o.frac is None else a.frac + o.frac,
               a.mag * o.err + o.mag * a.err + a.err * o.err)
    return sum_result(prod, k)


def draw_out_sharding(b: Builder, shape: tuple):
    """On an Explicit mesh: a drawn ``out_sharding=`` (the ops that take it) and the result's type."""
    if not b.explicit or not b.boolean():
        return "", None
    spec = b.draw_spec(shape, dividing=True)
    return f", out_sharding={spec_text(spec)}", spec


def window_out_size(n: int, w: int, s: int, lo: int, hi: int, bd: int, wd: int) -> int:
    padded = (n - 1) * bd + 1 + lo + hi
    eff = (w - 1) * wd + 1
    return 0 if padded < eff else (padded - eff) // s + 1
