"""Elementwise primitives: one table of NumPy kernels, registered in one loop.

Operands are broadcast over their mesh dims (views) and, for rank-0 literals, over the
local dims. Narrow floats (bf16, f16, f8) are computed in float32 and rounded back,
as XLA:CPU does; transcendentals are refsim's own host-independent functions
(`refsim.libm`: computed in float64 and rounded once to the operand's type). Where NumPy and XLA differ, the kernel follows XLA (StableHLO spec
for ``divide``, ``remainder``, ``shift_*``, ``maximum``/``minimum`` and ``clamp``;
XLA:CPU for ``convert`` of out-of-range floats).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import scipy.special as sp

from refsim import libm
from refsim.interpreter.registry import register
from refsim.interpreter.rules import _util as U
from refsim.values import complex_from_parts, quiet_nan


def _operands(ctx, invals):
    return U.bcast_local_rank(ctx.nm, [np.asarray(v) for v in invals])


def _in_dtype_kernel(fn):
    """A kernel computed in the operand's compute dtype (f32 for narrow floats) and cast back
    to the first operand's dtype: the float/complex families and the integer/float ones alike."""

    def kernel(*xs):
        dtype = xs[0].dtype
        cd = U.compute_dtype(dtype)
        with np.errstate(all="ignore"):
            out = fn(*(U.as_dtype(x, cd) for x in xs))
        return U.as_dtype(np.asarray(out), dtype)

    return kernel


def _bool_out(fn):
    def kernel(*xs):
        cd = U.compute_dtype(xs[0].dtype)
        with np.errstate(all="ignore"):
            return np.asarray(fn(*(U.as_dtype(x, cd) for x in xs)), dtype=bool)

    return kernel


# --- XLA semantics that NumPy does not share -------------------------------------------

def _div(x, y):
    """StableHLO divide: integer quotient truncates toward zero; x/0 is -1 (all ones),
    INT_MIN/-1 is INT_MIN (XLA:CPU's documented overflow results)."""
    if not U.is_int(x.dtype):
        return x / y
    safe = np.where(y == 0, 1, y).astype(x.dtype)
    if U.is_signed_int(x.dtype):
        overflow = (x == U.iinfo(x.dtype).min) & (safe == -1)
        safe = np.where(overflow, 1, safe).astype(x.dtype)
        fq = np.floor_divide(x, safe)
        inexact = np.remainder(x, safe) != 0
        q = np.where(inexact & ((x < 0) != (safe < 0)), fq + np.ones((), x.dtype), fq)
        q = np.where(overflow, x, q)
    else:
        q = x // safe
    return np.where(y == 0, np.array(-1).astype(x.dtype), q)


def _rem(x, y):
    """StableHLO remainder: the sign of the dividend (C fmod); x%0 is x, INT_MIN%-1 is 0."""
    if not U.is_int(x.dtype):
        return np.fmod(x, y)
    safe = np.where(y == 0, 1, y).astype(x.dtype)
    if U.is_signed_int(x.dtype):
        safe = np.where(safe == -1, 1, safe).astype(x.dtype)  # x % -1 == 0, avoids overflow
    r = np.fmod(x, safe)
    return np.where(y == 0, x, r)


def _shift_amount(x, y):
    bits = x.dtype.itemsize * 8
    uy = y.astype(np.dtype(f"u{x.dtype.itemsize}"))  # negative amounts are huge unsigned ones
    return uy, uy >= bits, bits


def _shift_left(x, y):
    """Shifts by >= the bit width give 0 (StableHLO shift_left)."""
    uy, big, _ = _shift_amount(x, y)
    ux = x.view(np.dtype(f"u{x.dtype.itemsize}"))
    out = np.left_shift(ux, np.where(big, 0, uy).astype(ux.dtype))
    return np.where(big, 0, out).astype(ux.dtype).view(x.dtype)


def _shift_right_logical(x, y):
    """Logical shift of the bit pattern; shifts by >= the bit width give 0."""
    uy, big, _ = _shift_amount(x, y)
    ux = x.view(np.dtype(f"u{x.dtype.itemsize}"))
    out = np.right_shift(ux, np.where(big, 0, uy).astype(ux.dtype))
    return np.where(big, 0, out).astype(ux.dtype).view(x.dtype)


def _shift_right_arithmetic(x, y):
    """Sign-filling shift; shifts by >= the bit width give all sign bits."""
    uy, big, bits = _shift_amount(x, y)
    sx = x.view(np.dtype(f"i{x.dtype.itemsize}"))
    out = np.right_shift(sx, np.where(big, bits - 1, uy).astype(sx.dtype))
    return out.astype(sx.dtype).view(x.dtype)


def _max(x, y):
    """StableHLO maximum, IEEE 754-2019 maximum: NaN propagates as a quiet NaN (a signalling
    NaN operand gives its quiet form) and +0 > -0 in either operand order (NumPy returns
    either zero and passes a signalling NaN through)."""
    out = np.maximum(x, y)
    if U.is_float(x.dtype):
        both_zero = (x == 0) & (y == 0)
        out = quiet_nan(np.where(both_zero, x + y, out))  # -0 only when both are -0
    return out


def _min(x, y):
    """StableHLO minimum, IEEE 754-2019 minimum: a quiet NaN result and -0 < +0."""
    out = np.minimum(x, y)
    if U.is_float(x.dtype):
        both_zero = (x == 0) & (y == 0)
        out = quiet_nan(np.where(both_zero, -((-x) + (-y)), out))  # +0 only when both are +0
    return out


def _sign(x):
    """sign(-0) = -0, sign(NaN) = NaN, complex sign(z) = z/|z| (0 at 0); ints -1/0/1."""
    if U.is_complex(x.dtype):
        a = np.abs(x)
        return np.where(a == 0, 0, x / np.where(a == 0, 1, a))
    if U.is_float(x.dtype):
        return np.where(x == 0, x, np.sign(x))
    return np.sign(x)


def _round(x, rounding_method):
    """rounding_method 0: half away from zero (XLA round); 1: half to even."""
    if int(rounding_method) == 1:
        return np.round(x)
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)  # x - t is exact


def _clz(x):
    bits = x.dtype.itemsize * 8
    ux = x.view(np.dtype(f"u{x.dtype.itemsize}")).astype(np.uint64)
    n = np.zeros(x.shape, dtype=np.int64)
    for b in range(bits - 1, -1, -1):  # count leading zero bits; loop over bits, not devices
        set_ = (ux >> np.uint64(b)) & np.uint64(1)
        n = np.where((n == bits - 1 - b) & (set_ == 0), n + 1, n)
    return n.astype(x.dtype)


def _population_count(x):
    """Set bits of the two's-complement pattern (np.bitwise_count counts |x| for signed ints)."""
    return np.bitwise_count(x.view(np.dtype(f"u{x.dtype.itemsize}"))).astype(x.dtype)


def _nextafter(x, y):
    return np.nextafter(x, y)


def _one_minus_square(x):
    """jax.lax.one_minus_square (JAX >= 0.12, the JVP of tanh, asin, atanh): 1 - x**2, evaluated
    as (1 + x)(1 - x) in x's dtype, as JAX's docstring states."""
    one = np.ones((), x.dtype)
    return (one + x) * (one - x)


_FLOAT_UNARY = {
    "sqrt": np.sqrt, "floor": np.floor, "ceil": np.ceil, "bessel_i0e": sp.i0e, "bessel_i1e": sp.i1e,
}
_FLOAT_BINARY = {"igamma": sp.gammainc, "igammac": sp.gammaincc, "zeta": sp.zeta}
# transcendentals: refsim.libm's host-independent functions (float64, rounded once);
# pow has its own rule below (an integer exponent)
_LIBM = tuple(n for n in libm.NAMES if n != "pow")
_SAME_UNARY = {
    "neg": np.negative, "sign": _sign, "square": np.square, "population_count": _population_count,
    "clz": _clz, "copy": np.copy, "copy_p": np.copy, "stop_gradient": np.asarray,
    "one_minus_square": _one_minus_square,
}
# computed in the operand's own type: the f32 neighbour of a bf16 value is not its bf16 one
_NATIVE_BINARY = {"nextafter": _nextafter}
_SAME_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div, "rem": _rem,
    "max": _max, "min": _min, "shift_left": _shift_left,
    "shift_right_logical": _shift_right_logical,
    "shift_right_arithmetic": _shift_right_arithmetic,
}
_COMPARE = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}


def _logical(bool_fn, int_fn):
    """and/or/xor/not: logical on bool, bitwise on integers (one primitive for both)."""

    def kernel(*xs):
        return (bool_fn if xs[0].dtype == bool else int_fn)(*xs)

    return kernel


_LOGICAL = {
    "and": _logical(np.logical_and, np.bitwise_and),
    "or": _logical(np.logical_or, np.bitwise_or),
    "xor": _logical(np.logical_xor, np.bitwise_xor),
    "not": _logical(np.logical_not, np.invert),
}


# Params some elementwise primitives carry that do not change refsim's value:
# `accuracy` (a transcendental's requested accuracy; refsim computes in the operand's type).
_VALUE_NEUTRAL_PARAMS = {"accuracy"}


def _make_rule(name, kernel):
    def rule(ctx, *invals, **params):
        unknown = set(params) - _VALUE_NEUTRAL_PARAMS - ({"out_dtype"} if name == "mul" else set())
        if unknown:
            raise TypeError(
                f"refsim rule for {name!r} got unexpected params {sorted(unknown)}; the "
                "installed JAX binds params this rule does not know. Update the rule."
            )
        out = kernel(*_operands(ctx, invals))
        if params.get("out_dtype") is not None:
            out = U.as_dtype(out, params["out_dtype"])
        return out

    rule.__name__ = rule.__qualname__ = f"{name.replace('-', '_')}_rule"
    rule.__doc__ = f"Elementwise `{name}` over stacked operands (mesh dims broadcast)."
    return rule


def _libm_kernel(name):
    def kernel(*xs):
        return libm.evaluate(name, *xs)

    return kernel


def _register_table():
    tables = [
        ({name: name for name in _LIBM}, _libm_kernel),
        (_FLOAT_UNARY, _in_dtype_kernel), (_FLOAT_BINARY, _in_dtype_kernel),
        (_SAME_UNARY, _in_dtype_kernel), (_SAME_BINARY, _in_dtype_kernel),
        (_COMPARE, _bool_out), (_LOGICAL, lambda f: f), (_NATIVE_BINARY, lambda f: f),
    ]
    for table, wrap in tables:
        for name, fn in table.items():
            register(name)(_make_rule(name, wrap(fn)))


_register_table()


# --- elementwise primitives with params or special dtypes ---------------------------------

@register("abs")
def abs_rule(ctx, x):
    """|x|; complex -> its real dtype; integer abs wraps (abs(INT_MIN) == INT_MIN)."""
    cd = U.compute_dtype(x.dtype)
    out = np.abs(U.as_dtype(x, cd))
    return U.as_dtype(out, x.dtype if not U.is_complex(x.dtype) else out.dtype)


@register("pow")
def pow_rule(ctx, x, y):
    """x ** y (StableHLO power); an integer exponent with a float base is converted to the
    base's compute type first; float powers are refsim.libm's."""
    x, y = _operands(ctx, [x, y])
    if U.is_int(x.dtype) and U.is_int(y.dtype):
        return np.power(x, y)
    return libm.evaluate("pow", x, U.as_dtype(y, U.compute_dtype(x.dtype)))


@register("round")
def round_rule(ctx, x, *, rounding_method):
    """lax.round: rounding_method 0 rounds half away from zero, 1 half to even."""
    return _in_dtype_kernel(lambda v: _round(v, rounding_method))(x)


@register("is_finite")
def is_finite_rule(ctx, x):
    return np.isfinite(U.as_dtype(x, U.compute_dtype(x.dtype)))


@register("integer_pow")
def integer_pow_rule(ctx, x, *, y):
    """x ** y by JAX's square-and-multiply chain (so float rounding matches); y < 0 is 1/x**|y|."""
    cd = U.compute_dtype(x.dtype)
    base = U.as_dtype(x, cd)
    with np.errstate(all="ignore"):
        if y == 0:
            return np.ones_like(x)
        n, acc = abs(int(y)), None
        while n > 0:
            if n & 1:
                acc = base if acc is None else U.as_dtype(acc * base, x.dtype).astype(cd)
            n >>= 1
            if n > 0:
                base = U.as_dtype(base * base, x.dtype).astype(cd)
        if y < 0:
            acc = np.ones((), cd) / acc
    return U.as_dtype(np.asarray(acc), x.dtype)


@register("clamp")
def clamp_rule(ctx, lo, x, hi):
    """lax.clamp(min, x, max) = min(max(x, min), max); any NaN operand gives NaN."""
    lo, x, hi = _operands(ctx, [lo, x, hi])
    cd = U.compute_dtype(x.dtype)
    out = _min(_max(U.as_dtype(x, cd), U.as_dtype(lo, cd)), U.as_dtype(hi, cd))
    return U.as_dtype(np.asarray(out), x.dtype)


@register("select_n")
def select_n_rule(ctx, which, *cases):
    """StableHLO select generalised: picks cases[which] elementwise (bool or int32 selector)."""
    ops = _operands(ctx, [which, *cases])
    which, cases = ops[0], ops[1:]
    if len(cases) == 1:
        return np.broadcast_to(cases[0], np.broadcast_shapes(which.shape, cases[0].shape))
    if which.dtype == bool:
        return np.where(which, cases[1], cases[0])
    out = cases[-1]
    for i in range(len(cases) - 2, -1, -1):
        out = np.where(which == i, cases[i], out)
    return out


@register("real")
def real_rule(ctx, x):
    return np.real(x).copy()


@register("imag")
def imag_rule(ctx, x):
    return np.imag(x).copy()


@register("conj")
def conj_rule(ctx, x, *, input_dtype):
    """Complex conjugate; a real input becomes the complex type JAX assigns (c64 for f32)."""
    out = np.conj(x)
    if not U.is_complex(out.dtype):
        out = out.astype(np.complex128 if out.dtype == np.float64 else np.complex64)
    return out


@register("complex")
def complex_rule(ctx, x, y):
    x, y = _operands(ctx, [x, y])
    dtype = np.complex128 if x.dtype == np.float64 else np.complex64
    return complex_from_parts(x, y, dtype)


@register("polygamma")
def polygamma_rule(ctx, m, x):
    m, x = _operands(ctx, [m, x])
    return _in_dtype_kernel(lambda a, b: sp.polygamma(np.round(a), b))(m, x)


@register("mulhi")
def mulhi_rule(ctx, x, y):
    """High half of the double-width integer product (lax.mul_hi)."""
    x, y = _operands(ctx, [x, y])
    bits = x.dtype.itemsize * 8
    if bits == 64:
        ux, uy = x.view(np.uint64).astype(object), y.view(np.uint64).astype(object)
        if U.is_signed_int(x.dtype):
            ux, uy = x.astype(object), y.astype(object)
        hi = (ux * uy) >> 64
        return np.array(hi, dtype=object).astype(np.int64 if U.is_signed_int(x.dtype) else np.uint64)
    wide = np.int64 if U.is_signed_int(x.dtype) else np.uint64
    return ((x.astype(wide) * y.astype(wide)) >> bits).astype(x.dtype)


@register("reduce_precision")
def reduce_precision_rule(ctx, x, *, exponent_bits, mantissa_bits):
    """XLA ReducePrecision: round the mantissa to nearest-even, overflow to inf, flush
    values below the reduced type's smallest normal to signed zero, keep NaN a NaN."""
    dtype = x.dtype
    src = U.as_dtype(x, np.float64 if dtype == np.float64 else np.float32)
    ibits = {4: np.uint32, 8: np.uint64}[src.dtype.itemsize]
    nbits = src.dtype.itemsize * 8
    src_mant = 23 if nbits == 32 else 52
    src_exp = nbits - 1 - src_mant
    one = ibits(1)
    v = src.view(ibits)
    if mantissa_bits < src_mant:
        drop = ibits(src_mant - mantissa_bits)
        last_kept = (v >> drop) & one
        bias = (one << (drop - one)) - one + last_kept
        v = (v + bias) & ~((one << drop) - one)
    if exponent_bits < src_exp:
        sign = v & (one << ibits(nbits - 1))
        exp = (v >> ibits(src_mant)) & ((one << ibits(src_exp)) - one)
        src_bias = (1 << (src_exp - 1)) - 1
        dst_bias = (1 << (exponent_bits - 1)) - 1
        max_exp = ibits(src_bias + dst_bias)
        min_exp = ibits(src_bias - dst_bias)
        inf_bits = ibits(((1 << src_exp) - 1) << src_mant)
        v = np.where(exp > max_exp, sign | inf_bits, v)
        v = np.where(exp <= min_exp, sign, v)
    out = np.where(np.isnan(src), src, v.view(src.dtype))
    return U.as_dtype(out, dtype)


# --- conversions ---------------------------------------------------------------------------

def _float_to_int(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """XLA:CPU float->int: truncate toward zero, saturate out-of-range values, NaN -> 0."""
    info = U.iinfo(dtype)
    t = np.trunc(U.as_dtype(x, np.float64) if x.dtype != np.float64 else x)
    too_big = t >= float(info.max) + 1.0  # exact: a power of two
    too_small = t < float(info.min)
    nan = np.isnan(t)
    safe = np.where(too_big | too_small | nan, 0, t)
    out = safe.astype(dtype)
    out = np.where(too_big, info.max, out)
    out = np.where(too_small, info.min, out)
    return out.astype(dtype)


def convert(x: np.ndarray, new_dtype) -> np.ndarray:
    """lax.convert_element_type semantics (StableHLO convert, XLA:CPU for float->int)."""
    new = np.dtype(new_dtype)
    src = x.dtype
    if src == new:
        return x
    if new == bool:
        return x != 0
    if U.is_complex(src) and not U.is_complex(new):
        x, src = np.real(x), np.real(x).dtype
    if U.is_float(src) and U.is_int(new):
        return _float_to_int(U.as_dtype(x, U.compute_dtype(src)), new)
    if U.is_int(src) and U.is_narrow_float(new):
        # integers reach narrow floats by one rounding from an exact wider value
        return x.astype(np.float64).astype(new)
    with np.errstate(all="ignore"):
        return x.astype(new)


@register("convert_element_type")
def convert_element_type_rule(ctx, x, *, new_dtype, weak_type, sharding):
    """lax.convert_element_type; the sharding param only places the global value."""
    return convert(x, new_dtype)


def _nbits(dtype: np.dtype) -> int:
    """Bits per element as jax.dtypes.itemsize_bits counts them: int4/uint4/float4 are
    4 bits although NumPy (ml_dtypes) stores each in a whole byte."""
    if dtype.itemsize == 1 and dtype != np.dtype(bool):
        # ml_dtypes' int4 is not an np.integer subtype, so ask iinfo first
        try:
            return int(ml_dtypes.iinfo(dtype).bits)
        except ValueError:
            return int(ml_dtypes.finfo(dtype).bits)
    return 8 * dtype.itemsize


def _bits_of(x: np.ndarray, nbits: int) -> np.ndarray:
    """The bit pattern of each element, shape ``x.shape + (nbits,)``, least significant first."""
    raw = np.ascontiguousarray(x).view(np.uint8).reshape(x.shape + (x.dtype.itemsize,))
    return np.unpackbits(raw, axis=-1, bitorder="little")[..., :nbits]


def _from_bits(bits: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Inverse of _bits_of: a sub-byte element sits in the low bits of its byte (ml_dtypes)."""
    pad = 8 * dtype.itemsize - bits.shape[-1]
    if pad:
        bits = np.concatenate([bits, np.zeros(bits.shape[:-1] + (pad,), np.uint8)], axis=-1)
    raw = np.packbits(bits, axis=-1, bitorder="little")
    return np.ascontiguousarray(raw).view(dtype)[..., 0]


@register("bitcast_convert_type")
def bitcast_convert_type_rule(ctx, x, *, new_dtype):
    """StableHLO bitcast_convert: a wider source gains a trailing dim of its bit-width ratio,
    a narrower source loses its trailing dim, element 0 in the least significant bits (as
    XLA). Widths follow jax's _bitcast_convert_type_shape_rule: int4/uint4/float4 pack
    two to a byte (int4[4] -> float16 is one 16-bit word), not one byte each as NumPy."""
    new = np.dtype(new_dtype)
    old_bits, new_bits = _nbits(x.dtype), _nbits(new)
    if x.dtype == new:
        return x
    if old_bits % 8 or new_bits % 8:
        bits = _bits_of(x, old_bits)
        if old_bits > new_bits:
            bits = bits.reshape(x.shape + (old_bits // new_bits, new_bits))
        elif old_bits < new_bits:
            bits = bits.reshape(x.shape[:-1] + (new_bits,))
        return _from_bits(bits, new)
    # np.ascontiguousarray makes a 0-d operand 1-d; keep its rank
    x = np.ascontiguousarray(x).reshape(x.shape)
    if new.itemsize == x.dtype.itemsize:
        return x.view(new)
    if new.itemsize < x.dtype.itemsize:
        return x[..., None].view(new)
    return x.view(new)[..., 0]
