"""Elementwise rules: against JAX on CPU, hand-computed XLA semantics, and the mesh-dims convention."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp
from jax import lax

from rules_harness import assert_close, assert_exact, jax_eval, refsim_eval, stacked_matches_loop

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float32), BF16, np.dtype(np.float16)]
INTS = [np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.uint32), np.dtype(np.uint8)]
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=5)
# Multi-op programs take seconds to compile; one shape per dtype keeps XLA's cache warm
# (elementwise semantics do not depend on the shape; hypothesis varies the values).
OP_SHAPE = st.just((2, 6))


def _no_tiny(a):
    # XLA:CPU flushes subnormal results to zero (FTZ/DAZ); refsim follows IEEE arithmetic.
    # Magnitudes below 1e-3 are drawn as zero so no operation here lands in that range.
    return np.where(np.abs(a) < 1e-3, np.float32(0), a)


def float_arrays(dtype, shape, lo=-10.0, hi=10.0):
    lo, hi = float(np.float32(lo)), float(np.float32(hi))
    return hnp.arrays(np.float32, shape, elements=st.floats(lo, hi, width=32)).map(
        lambda a: _no_tiny(a).astype(dtype))


def int_arrays(dtype, shape):
    return hnp.arrays(dtype, shape, elements=st.integers(int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)))


# unary float ops, each with a domain; tolerance in ulps of the result dtype
UNARY = {
    "exp": (lax.exp, -10, 10, 4), "exp2": (lax.exp2, -10, 10, 4), "log": (lax.log, 0.01, 100, 4),
    "log1p": (lax.log1p, -0.9, 100, 4), "expm1": (lax.expm1, -5, 5, 4), "sin": (lax.sin, -6, 6, 4),
    "cos": (lax.cos, -6, 6, 4), "tan": (lax.tan, -1.4, 1.4, 8), "tanh": (lax.tanh, -5, 5, 4),
    "asin": (lax.asin, -1, 1, 4), "acos": (lax.acos, -1, 1, 4), "atan": (lax.atan, -9, 9, 4),
    "sinh": (lax.sinh, -5, 5, 4), "cosh": (lax.cosh, -5, 5, 4), "asinh": (lax.asinh, -9, 9, 4),
    "acosh": (lax.acosh, 1, 9, 4), "atanh": (lax.atanh, -0.9, 0.9, 4), "sqrt": (lax.sqrt, 0, 99, 2),
    "rsqrt": (lax.rsqrt, 0.01, 99, 4), "cbrt": (lax.cbrt, -99, 99, 4),
    "logistic": (lax.logistic, -9, 9, 4), "erf": (lax.erf, -3, 3, 4), "erfc": (lax.erfc, -3, 3, 8),
    "erf_inv": (lax.erf_inv, -0.99, 0.99, 8), "lgamma": (lax.lgamma, 0.1, 20, 16),
    "digamma": (lax.digamma, 0.1, 20, 16), "floor": (lax.floor, -9, 9, 0), "ceil": (lax.ceil, -9, 9, 0),
    "neg": (lax.neg, -9, 9, 0), "abs": (lax.abs, -9, 9, 0), "sign": (lax.sign, -9, 9, 0),
    "square": (lax.square, -9, 9, 1), "is_finite": (lax.is_finite, -9, 9, 0),
    "round_even": (lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN), -9, 9, 0),
    "round_away": (lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO), -9, 9, 0),
    "bessel_i0e": (lax.bessel_i0e, -9, 9, 8), "bessel_i1e": (lax.bessel_i1e, -9, 9, 8),
}


def _unary_program(*args):
    return [UNARY[n][0](a) for n, a in zip(sorted(UNARY), args)]


def _binary_int_program(a, b):
    return [BINARY_INT[n](a, b) for n in sorted(BINARY_INT)]


def _binary_float_program(a, b, ap):
    return [BINARY_FLOAT[n][0](ap if n == "pow" else a, b) for n in sorted(BINARY_FLOAT)]


def _scaled(u, lo, hi, dtype):
    """Uniform [0, 1) draws mapped into an op's domain, in `dtype`."""
    return (np.float32(lo) + (np.float32(hi) - np.float32(lo)) * u).astype(dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@given(data=st.data())
def test_unary_float_ops_match_jax(dtype, data):
    """Every unary op in one traced program (one XLA compile per dtype)."""
    shape = data.draw(OP_SHAPE)
    u = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(0, 1, width=32, exclude_max=True)))
    names = sorted(UNARY)
    xs = [_scaled(u, UNARY[n][1], UNARY[n][2], dtype) for n in names]
    want, got = jax_eval(_unary_program, *xs), refsim_eval(_unary_program, *xs)
    for n, x, w, g in zip(names, xs, want, got):
        ulps = UNARY[n][3]
        if ulps == 0:
            assert_exact([w], [g], call=f"{n}({x!r})")
        else:
            assert_close([w], [g], ulps=ulps + (2 if dtype != np.float32 else 0), call=f"{n}({x!r})")


BINARY_INT = {
    "add": lax.add, "sub": lax.sub, "mul": lax.mul, "div": lax.div, "rem": lax.rem,
    "max": lax.max, "min": lax.min, "and": lax.bitwise_and, "or": lax.bitwise_or,
    "xor": lax.bitwise_xor, "shift_left": lax.shift_left,
    "shift_right_logical": lax.shift_right_logical,
    "shift_right_arithmetic": lax.shift_right_arithmetic, "eq": lax.eq, "ne": lax.ne,
    "lt": lax.lt, "le": lax.le, "gt": lax.gt, "ge": lax.ge, "not": lambda a, b: lax.bitwise_not(a),
    "population_count": lambda a, b: lax.population_count(a), "clz": lambda a, b: lax.clz(a),
    "sign": lambda a, b: lax.sign(a), "neg": lambda a, b: lax.neg(a),
    "integer_pow": lambda a, b: lax.integer_pow(a, 5),
}


@pytest.mark.parametrize("dtype", INTS, ids=str)
@given(data=st.data())
def test_binary_int_ops_exact(dtype, data):
    shape = data.draw(OP_SHAPE)
    x = data.draw(int_arrays(dtype, shape), label="x")
    y = data.draw(st.one_of(int_arrays(dtype, shape),
                            hnp.arrays(dtype, shape, elements=st.integers(-1 if dtype.kind == "i" else 0, 9))),
                  label="y")
    names = sorted(BINARY_INT)
    outs = zip(names, jax_eval(_binary_int_program, x, y), refsim_eval(_binary_int_program, x, y))
    for n, w, g in outs:
        assert_exact([w], [g], call=f"{n}({x!r}, {y!r})")


# div: refsim divides correctly rounded (IEEE 754, as lax.div documents); XLA:CPU may divide by a
# broadcast or repeated divisor as a multiplication by its reciprocal, which is up to 1 ulp off
# (test_float_division_is_correctly_rounded pins refsim's value by hand).
BINARY_FLOAT = {
    "add": (lax.add, 0), "sub": (lax.sub, 0), "mul": (lax.mul, 0), "div": (lax.div, 1),
    "rem": (lax.rem, 0), "max": (lax.max, 0), "min": (lax.min, 0), "pow": (lax.pow, 8),
    "atan2": (lax.atan2, 4), "nextafter": (lax.nextafter, 0), "lt": (lax.lt, 0), "eq": (lax.eq, 0),
    "ge": (lax.ge, 0), "ne": (lax.ne, 0),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@given(data=st.data())
def test_binary_float_ops_match_jax(dtype, data):
    shape = data.draw(OP_SHAPE)
    x = data.draw(float_arrays(dtype, shape, -20.0, 20.0), label="x")
    y = data.draw(float_arrays(dtype, shape, -3.0, 3.0), label="y")
    names = sorted(BINARY_FLOAT)
    xp = np.abs(x) + np.array(0.5).astype(dtype)  # pow: a positive base
    outs = zip(names, jax_eval(_binary_float_program, x, y, xp),
               refsim_eval(_binary_float_program, x, y, xp))
    for n, w, g in outs:
        if BINARY_FLOAT[n][1] == 0:
            assert_exact([w], [g], call=f"{n}({x!r}, {y!r})")
        else:
            assert_close([w], [g], ulps=BINARY_FLOAT[n][1], call=f"{n}({x!r}, {y!r})")


CAST_DTYPES = [np.float32, BF16, np.float16, np.int8, np.int32, np.uint32, np.uint8, np.bool_, np.complex64]


@given(data=st.data())
def test_convert_element_type_matches_jax(data):
    src = np.dtype(data.draw(st.sampled_from(CAST_DTYPES), label="src"))
    dst = np.dtype(data.draw(st.sampled_from(CAST_DTYPES), label="dst"))
    shape = data.draw(st.sampled_from([(), (5,)]))
    if src.kind in "iu":
        x = data.draw(int_arrays(src, shape))
    elif src == bool:
        x = data.draw(hnp.arrays(bool, shape))
    else:
        x = data.draw(hnp.arrays(np.float32, shape, elements=st.one_of(
            st.floats(-1e10, 1e10, width=32), st.sampled_from([np.nan, np.inf, -np.inf, -0.0, 0.5, -2.5]))))
        x = x.astype(src)
    fn = _CONVERT[dst]
    assert_exact(jax_eval(fn, x), refsim_eval(fn, x), call=f"convert {src}->{dst} {x!r}")


_CONVERT = {np.dtype(d): (lambda v, d=d: lax.convert_element_type(v, d)) for d in CAST_DTYPES}


# --- XLA semantics that NumPy does not share (hand-computed expectations) ------------------

def _ref(fn, *args):
    return refsim_eval(fn, *args)[0]


def test_float_division_is_correctly_rounded():
    # 7 / 3 = 2.333...: the float32 neighbours are 0x40155555 = 2.3333332538604736 (7.9e-8 below)
    # and 0x40155556 = 2.3333334922790527 (1.6e-7 above); correct rounding picks the first.
    got = _ref(lax.div, np.float32([7.0, 1.0, -7.0]), np.float32([3.0, 3.0, 3.0]))
    assert got.view(np.uint32).tolist() == [0x40155555, 0x3EAAAAAB, 0xC0155555]
    # XLA:CPU's reciprocal multiply (7 * fl(1/3)) may give the other neighbour: within 1 ulp
    from conformance.verdict.compare import ulp_distance

    xla = np.asarray(jax.jit(lambda v: v / np.float32(3))(np.float32([7.0, 1.0, -7.0])))
    assert (ulp_distance(xla, got) <= 1).all()


def test_integer_divide_and_remainder_follow_xla():
    x = np.array([7, -7, 7, -7, -2**31, 5, 0, -2**31], np.int32)
    y = np.array([2, 2, -2, -2, -1, 0, 0, 0], np.int32)
    # StableHLO: truncating quotient; XLA: x/0 = -1, INT_MIN/-1 = INT_MIN; x%0 = x, INT_MIN%-1 = 0
    np.testing.assert_array_equal(_ref(lax.div, x, y), [3, -3, -3, 3, -2**31, -1, -1, -1])
    np.testing.assert_array_equal(_ref(lax.rem, x, y), [1, -1, 1, -1, 0, 5, 0, -2**31])
    u = np.array([7, 0, 9], np.uint32)
    np.testing.assert_array_equal(_ref(lax.div, u, np.zeros(3, np.uint32)), [2**32 - 1] * 3)
    np.testing.assert_array_equal(_ref(lax.rem, u, np.zeros(3, np.uint32)), [7, 0, 9])
    f = _ref(lax.rem, np.float32([5.5, -5.5, 1.0]), np.float32([2, 2, 0]))
    np.testing.assert_array_equal(f[:2], [1.5, -1.5])
    assert np.isnan(f[2])


def test_shifts_by_bit_width_or_more():
    x = np.array([-8, 8, 1, -1], np.int8)
    s = np.array([9, 8, -1, 3], np.int8)  # -1 is 255 as an unsigned shift amount
    np.testing.assert_array_equal(_ref(lax.shift_left, x, s), [0, 0, 0, -8])
    np.testing.assert_array_equal(_ref(lax.shift_right_logical, x, s), [0, 0, 0, 0x1F])
    np.testing.assert_array_equal(_ref(lax.shift_right_arithmetic, x, s), [-1, 0, 0, -1])
    np.testing.assert_array_equal(_ref(lax.shift_left, np.uint32([1]), np.uint32([31])), [2**31])


def test_integer_overflow_wraps():
    np.testing.assert_array_equal(_ref(lax.add, np.int8([127]), np.int8([1])), [-128])
    np.testing.assert_array_equal(_ref(lax.mul, np.uint8([16]), np.uint8([17])), [16])
    np.testing.assert_array_equal(_ref(lax.abs, np.int8([-128])), [-128])
    np.testing.assert_array_equal(_ref(lambda v: lax.integer_pow(v, 3), np.int8([7, -5])), [87, -125])


def test_subnormals_are_kept_ieee():
    # IEEE (the StableHLO spec) keeps subnormals; XLA:CPU flushes them to zero. refsim
    # follows the spec, and the conformance suite reports the platform difference.
    tiny = np.float32(np.finfo(np.float32).tiny)
    assert _ref(lax.mul, np.float32([0.5]), np.array([tiny]))[0] == tiny / 2


def test_float_to_int_saturates_and_nan_is_zero():
    # XLA:CPU (checked with jax 0.10.2 and 0.12 on CPU): truncate, saturate, NaN -> 0
    f = np.float32([np.nan, np.inf, -np.inf, 3e9, -3e9, 2.7, -2.7, 300, -1])
    np.testing.assert_array_equal(_ref(lambda v: lax.convert_element_type(v, np.int32), f),
                                  [0, 2**31 - 1, -2**31, 2**31 - 1, -2**31, 2, -2, 300, -1])
    np.testing.assert_array_equal(_ref(lambda v: lax.convert_element_type(v, np.int8), f),
                                  [0, 127, -128, 127, -128, 2, -2, 127, -1])
    np.testing.assert_array_equal(_ref(lambda v: lax.convert_element_type(v, np.uint8), f),
                                  [0, 255, 0, 255, 0, 2, 0, 255, 0])
    np.testing.assert_array_equal(_ref(lambda v: lax.convert_element_type(v, bool),
                                       np.float32([np.nan, 0, -0.0, 2])), [True, False, False, True])


def test_max_min_nan_and_signed_zero():
    a, b = np.float32([-0.0, 0.0, np.nan, 1]), np.float32([0.0, -0.0, 1, np.nan])
    mx, mn = _ref(lax.max, a, b), _ref(lax.min, a, b)
    assert np.isnan(mx[2:]).all() and np.isnan(mn[2:]).all()
    assert not np.signbit(mx[:2]).any()  # max(-0, +0) = +0
    assert np.signbit(mn[:2]).all()      # min(-0, +0) = -0
    z = np.complex64([1 + 5j, 1 + 1j])
    np.testing.assert_array_equal(_ref(lax.max, z, np.complex64([1 + 2j, 0 + 9j])), [1 + 5j, 1 + 1j])


def test_round_methods_sign_clamp():
    x = np.float32([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997])
    np.testing.assert_array_equal(_ref(lambda v: lax.round(v, 0), x), [1, 2, 3, -1, -3, 0])
    np.testing.assert_array_equal(_ref(lambda v: lax.round(v, 1), x), [0, 2, 2, -0.0, -2, 0])
    s = _ref(lax.sign, np.float32([-0.0, 0.0, np.nan, -3]))
    assert np.signbit(s[0]) and not np.signbit(s[1]) and np.isnan(s[2]) and s[3] == -1
    c = _ref(lax.clamp, np.float32(0), np.float32([np.nan, -1, 2, 0.5]), np.float32(1))
    assert np.isnan(c[0])
    np.testing.assert_array_equal(c[1:], [0, 1, 0.5])


def test_integer_pow_nextafter_popcount_clz():
    np.testing.assert_array_equal(_ref(lambda v: lax.integer_pow(v, -2), np.float32([2, 4])), [0.25, 0.0625])
    np.testing.assert_array_equal(_ref(lambda v: lax.integer_pow(v, 0), np.float32([0, 7])), [1, 1])
    n = _ref(lax.nextafter, np.float32([1, 0]), np.float32([2, -1]))
    assert n[0] == np.float32(1) + np.finfo(np.float32).eps and n[1] == -np.float32(1.4e-45)
    nb = _ref(lax.nextafter, np.array([1], BF16), np.array([2], BF16))
    assert nb.dtype == BF16 and float(nb[0]) == 1 + 2.0**-7  # bf16 has 7 mantissa bits
    np.testing.assert_array_equal(_ref(lax.population_count, np.int8([-1, 3, 0])), [8, 2, 0])
    np.testing.assert_array_equal(_ref(lax.clz, np.int8([-1, 1, 0])), [0, 7, 8])
    np.testing.assert_array_equal(_ref(lax.clz, np.uint32([1, 0, 2**31])), [31, 32, 0])


def test_reduce_precision_to_half():
    # f16: 10 mantissa bits, max 65504, smallest normal 2**-14; below it flushes to zero
    x = np.float32([1.0 + 2**-11, 1.0 + 3 * 2**-11, 7e4, 65504, 2**-14, 2**-15, np.nan, -np.inf])
    got = _ref(lambda v: lax.reduce_precision(v, exponent_bits=5, mantissa_bits=10), x)
    np.testing.assert_array_equal(got[:6], [1.0, 1.0 + 2**-9, np.inf, 65504, 2**-14, 0])
    assert np.isnan(got[6]) and got[7] == -np.inf
    got0 = _ref(lambda v: lax.reduce_precision(v, exponent_bits=8, mantissa_bits=0), np.float32([1.5, 3.0, 1.25]))
    np.testing.assert_array_equal(got0, [2, 2, 1])  # ties to even exponent


def test_select_n_int_selector_and_complex_parts():
    which = np.int32([0, 1, 2, 1])
    cases = [np.float32([1, 1, 1, 1]), np.float32([2, 2, 2, 2]), np.float32([3, 3, 3, 3])]
    np.testing.assert_array_equal(_ref(lax.select_n, which, *cases), [1, 2, 3, 2])
    z = np.complex64([3 + 4j])
    assert _ref(lax.real, z)[0] == 3 and _ref(lax.imag, z)[0] == 4 and _ref(lax.abs, z)[0] == 5
    assert _ref(lax.conj, z)[0] == 3 - 4j
    assert _ref(lax.complex, np.float32([1]), np.float32([2]))[0] == 1 + 2j


def test_bitcast_convert_type_keeps_a_scalar_a_scalar():
    # found by the sharded-programs generator: a rank-0 operand came back with shape (1,)
    # 1.0f is 0x3F800000; -2.0f is 0xC0000000 (sign, exponent 128, zero mantissa)
    for value, bits in ((1.0, 0x3F800000), (-2.0, -0x40000000)):
        out = refsim_eval(lambda v: lax.bitcast_convert_type(v, np.int32), np.float32(value))[0]
        assert np.shape(out) == () and np.asarray(out).dtype == np.int32 and int(out) == bits, (value, out)
    out = refsim_eval(lambda v: lax.bitcast_convert_type(v, np.uint8), np.float32(1.0))[0]
    assert np.asarray(out).tolist() == [0, 0, 0x80, 0x3F]   # little-endian bytes, as XLA orders them


def test_bitcast_convert_type_matches_jax():
    x = np.float32([1.0, -2.5, np.inf])
    for dt in (np.int32, np.uint16, np.uint8):
        fn = lambda v: lax.bitcast_convert_type(v, dt)  # noqa: E731
        assert_exact(jax_eval(fn, x), refsim_eval(fn, x), call=f"bitcast f32->{dt}")
    u = np.arange(8, dtype=np.uint8).reshape(2, 4)
    fn = lambda v: lax.bitcast_convert_type(v, np.float32)  # noqa: E731
    assert_exact(jax_eval(fn, u), refsim_eval(fn, u), call="bitcast u8[2,4]->f32")


def test_unexpected_param_is_loud():
    from refsim.interpreter.registry import Context, lookup

    with pytest.raises(TypeError, match="unexpected params \\['bogus'\\]"):
        lookup("add")(Context(), np.ones(2), np.ones(2), bogus=1)


# --- mesh dims ------------------------------------------------------------------------------

@pytest.mark.parametrize("m", [(4,), (2, 4)])
def test_stacked_elementwise_equals_per_device_loop(m):
    def fn(x, y, i):
        return [jnp.exp(x) * y + 1.0, jnp.where(x > y, x, y), i // 3, i >> 2, lax.clamp(-1.0, x, 1.0),
                lax.convert_element_type(x * 100, jnp.int8), x.astype(jnp.bfloat16) * 2]

    rng = np.random.default_rng(1)
    dev = lambda shape, dt: (lambda pos: rng.normal(size=shape).astype(dt) * 5)  # noqa: E731
    stacked_matches_loop(fn, [dev((3, 2), np.float32), dev((3, 2), np.float32),
                              lambda pos: rng.integers(-50, 50, (3, 2)).astype(np.int32)], m, call="elementwise")


def test_invariant_operands_keep_size_one_mesh_dims():
    from refsim.interpreter.core import eval_closed_jaxpr
    from refsim.interpreter.registry import Context

    closed = jax.make_jaxpr(lambda a, b: (a + b, a * 2.0))(np.float32([1, 2]), np.float32([1, 2]))
    a = np.ones((1, 1, 2), np.float32)
    b = np.ones((4, 1, 2), np.float32)
    s, d = eval_closed_jaxpr(closed, a, b, ctx=Context(nm=2))
    assert s.shape == (4, 1, 2) and d.shape == (1, 1, 2)


def test_bitcast_convert_type_packs_int4_nibbles_element_0_lowest():
    # XLA packs sub-byte types: int4[4] -> float16 is one 16-bit word. By hand, the nibbles
    # of [-7, 1, 4, -1] are 0x9, 0x1, 0x4, 0xf and element 0 is the low nibble: 0xf419.
    x = np.array([-7, 1, 4, -1], dtype=ml_dtypes.int4)
    fn = lambda v: lax.bitcast_convert_type(v, np.float16)  # noqa: E731
    (got,) = refsim_eval(fn, x)
    assert got.shape == () and got.dtype == np.float16 and int(got.view(np.uint16)) == 0xF419
    # and back: uint16 0xf419 -> int4[4] splits the word the same way
    back = lambda v: lax.bitcast_convert_type(v, ml_dtypes.int4)  # noqa: E731
    (parts,) = refsim_eval(back, np.uint16(0xF419))
    assert parts.shape == (4,) and parts.dtype == np.dtype(ml_dtypes.int4)
    np.testing.assert_array_equal(parts.astype(np.int8), [-7, 1, 4, -1])


def test_bitcast_convert_type_float4_hand_value():
    if not hasattr(ml_dtypes, "float4_e2m1fn"):
        pytest.skip("ml_dtypes has no float4_e2m1fn")
    # e2m1 (bias 1): 1.0 = 0b0010, 2.0 = 0b0100, 3.0 = 0b0101, 4.0 = 0b0110 -> word 0x6542
    x = np.array([1, 2, 3, 4], dtype=ml_dtypes.float4_e2m1fn)
    (got,) = refsim_eval(lambda v: lax.bitcast_convert_type(v, np.uint16), x)
    assert got.shape == () and int(got) == 0x6542


SUB_BYTE_CASES = [
    # (operand, new dtype): XLA:CPU is the independent oracle for the packing
    (np.array([[1, 2], [3, -4]], ml_dtypes.int4), np.uint8),
    (np.array([1, 2, 3, 4, 5, 6, 7, -8], ml_dtypes.int4), np.float32),
    (np.array([[1, 15, 3, 4]] * 2, ml_dtypes.uint4), ml_dtypes.bfloat16),
    (np.uint8(0x12), ml_dtypes.uint4),
    (np.uint32(0x12345678), ml_dtypes.int4),
    (np.array([0xF419, 0x1234], np.uint16), ml_dtypes.uint4),
    (np.array(3, ml_dtypes.int4), ml_dtypes.uint4),
    (np.array([-1, 7], ml_dtypes.int4), ml_dtypes.uint4),
]


@pytest.mark.parametrize("x,dt", SUB_BYTE_CASES,
                         ids=[f"{np.asarray(x).dtype}{list(np.shape(x))}->{np.dtype(d)}" for x, d in SUB_BYTE_CASES])
def test_bitcast_convert_type_sub_byte_matches_xla(x, dt):
    fn = lambda v: lax.bitcast_convert_type(v, dt)  # noqa: E731
    exp, got = jax_eval(fn, x), refsim_eval(fn, x)
    assert exp[0].dtype == got[0].dtype and exp[0].shape == got[0].shape, (exp, got)
    np.testing.assert_array_equal(np.atleast_1d(got[0]).view(np.uint8), np.atleast_1d(exp[0]).view(np.uint8))


def test_bitcast_convert_type_0d_operand():
    # float32 1.5 = 0x3fc00000; little-endian bytes 00 00 c0 3f (by hand)
    (b,) = refsim_eval(lambda v: lax.bitcast_convert_type(v, np.uint8), np.float32(1.5))
    np.testing.assert_array_equal(b, [0x00, 0x00, 0xC0, 0x3F])
    (i,) = refsim_eval(lambda v: lax.bitcast_convert_type(v, np.int32), np.float32(1.5))
    assert i.shape == () and int(i) == 0x3FC00000
    (one,) = refsim_eval(lambda v: lax.bitcast_convert_type(v, np.int8), np.uint8(255))
    assert one.shape == () and int(one) == -1


def test_bitcast_convert_type_sub_byte_on_stacked_mesh_dims():
    # two devices on one mesh dim: [1, 2, 3, 4] packs to 0x4321 by hand
    x = np.array([[-7, 1, 4, -1], [1, 2, 3, 4]], dtype=ml_dtypes.int4)
    fn = lambda v: lax.bitcast_convert_type(v, np.uint16)  # noqa: E731
    (got,) = refsim_eval(fn, x[0], nm=1, stacked=[x])
    np.testing.assert_array_equal(got, np.uint16([0xF419, 0x4321]))
