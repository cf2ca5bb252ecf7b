"""dot_general and conv_general_dilated rules against JAX on CPU and the mesh-dims convention."""
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax import lax

from rules_harness import assert_close, assert_exact, jax_eval, refsim_eval, stacked_matches_loop

BF16 = np.dtype(ml_dtypes.bfloat16)


def _ints(rng, shape, dtype):
    return rng.integers(-3, 4, shape).astype(dtype)  # small integers: every order sums exactly


DOTS = [  # (lhs shape, rhs shape, ((lc, rc), (lb, rb)))
    ((3, 4), (4, 5), (((1,), (0,)), ((), ()))),
    ((2, 3, 4), (2, 4, 5), (((2,), (1,)), ((0,), (0,)))),
    ((4, 2, 3), (3, 2, 6), (((2,), (0,)), ((1,), (1,)))),
    ((5,), (5,), (((0,), (0,)), ((), ()))),
    ((2, 3), (4,), (((), ()), ((), ()))),
]


@pytest.mark.parametrize("case", range(len(DOTS)))
@pytest.mark.parametrize("types", [(np.float32, None), (np.int8, np.int32), (BF16, np.float32),
                                   (np.int32, None), (np.float16, None)], ids=str)
def test_dot_general_matches_jax(case, types):
    ls, rs, dn = DOTS[case]
    dtype, pref = types
    rng = np.random.default_rng(case)
    x, y = _ints(rng, ls, dtype), _ints(rng, rs, dtype)
    fn = lambda a, b: lax.dot_general(a, b, dn, preferred_element_type=pref)  # noqa: E731
    assert_exact(jax_eval(fn, x, y), refsim_eval(fn, x, y), call=f"dot_general {ls}x{rs} {dn} {types}")


@given(data=st.data())
def test_dot_random_floats_close(data):
    n = data.draw(st.integers(1, 16))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, y = rng.normal(size=(3, n)).astype(np.float32), rng.normal(size=(n, 2)).astype(np.float32)
    fn = lambda a, b: a @ b  # noqa: E731
    assert_close(jax_eval(fn, x, y), refsim_eval(fn, x, y), ulps=64, call="matmul")


def test_int8_dot_wraps_without_preferred_type():
    x = np.full((1, 4), 100, np.int8)
    y = np.full((4, 1), 1, np.int8)
    got = refsim_eval(lambda a, b: a @ b, x, y)[0]
    assert got.dtype == np.int8 and got[0, 0] == np.int8(400 - 512)


CONVS = [
    dict(window_strides=(1, 1), padding="SAME"),
    dict(window_strides=(2, 1), padding=((1, 2), (0, -1)), lhs_dilation=(1, 2), rhs_dilation=(2, 1)),
    dict(window_strides=(1, 2), padding="VALID", feature_group_count=2),
    dict(window_strides=(1, 1), padding=((0, 1), (1, 0)), batch_group_count=2),
    dict(window_strides=(1, 1), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
]


@pytest.mark.parametrize("case", range(len(CONVS)))
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int32], ids=str)
def test_conv_general_dilated_matches_jax(case, dtype):
    kw = dict(CONVS[case])
    rng = np.random.default_rng(case)
    fg, bg = kw.get("feature_group_count", 1), kw.get("batch_group_count", 1)
    lhs_shape, rhs_shape = (2 * bg, 2 * fg, 6, 5), (2 * fg * bg, 2, 3, 2)
    if kw.get("dimension_numbers"):
        lhs_shape, rhs_shape = (2, 6, 5, 2), (3, 2, 2, 4)
    x, w = _ints(rng, lhs_shape, dtype), _ints(rng, rhs_shape, dtype)
    fn = lambda a, b: lax.conv_general_dilated(a, b, **kw)  # noqa: E731
    assert_exact(jax_eval(fn, x, w), refsim_eval(fn, x, w), call=f"conv {kw} {dtype}")


def test_conv_hand_1d():
    # cross-correlation, no kernel flip: out[i] = sum_k x[i + k] w[k]
    x = np.float32([1, 2, 3, 4]).reshape(1, 1, 4)
    w = np.float32([1, 10]).reshape(1, 1, 2)
    got = refsim_eval(lambda a, b: lax.conv_general_dilated(a, b, (1,), "VALID"), x, w)[0]
    np.testing.assert_array_equal(got.reshape(-1), [21, 32, 43])


@pytest.mark.parametrize("m", [(2,), (2, 2)])
def test_stacked_linalg_equals_per_device_loop(m):
    rng = np.random.default_rng(7)

    def fn(a, b, k):
        return [a @ b, jnp.einsum("ij,kj->ik", a, a), lax.conv_general_dilated(a[None, None], k, (1, 1), "SAME")]

    stacked_matches_loop(fn, [lambda pos: _ints(rng, (3, 4), np.float32), lambda pos: _ints(rng, (4, 2), np.float32),
                              lambda pos: _ints(rng, (1, 1, 2, 2), np.float32)], m, call="linalg")
