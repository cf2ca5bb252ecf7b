"""Structural, reduction and sorting rules against JAX on CPU and the mesh-dims convention."""
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp
from jax import lax

from rules_harness import assert_close, assert_exact, jax_eval, refsim_eval, stacked_matches_loop

DTYPES = [np.float32, np.int8, np.uint32, np.bool_, ml_dtypes.bfloat16]


def arrays(dtype, shape, signed_zero=True):
    dtype = np.dtype(dtype)
    if dtype == bool:
        return hnp.arrays(bool, shape)
    if dtype.kind in "iu":
        return hnp.arrays(dtype, shape, elements=st.integers(-5 if dtype.kind == "i" else 0, 9))
    vals = st.sampled_from([0.0, -0.0, 1.0, -2.0, 0.5, 3.0, np.nan, np.inf, -np.inf, 7.0][
        0 if signed_zero else 2:] + ([] if signed_zero else [0.0]))
    return hnp.arrays(np.float32, shape, elements=vals).map(lambda a: a.astype(dtype))


# A few fixed rank-3 shapes (incl. size-1 dims) keep XLA's compile cache warm; hypothesis
# varies the values, which is where NaN / signed-zero / overflow semantics live.
shapes3 = st.sampled_from([(1, 1, 1), (2, 3, 4), (3, 1, 2), (4, 2, 1)])


def _programs(x):
    """Data movement on a rank-3 value, every op's params drawn from the value's shape."""
    a, b, c = x.shape
    return [
        lax.broadcast_in_dim(x, (2, a, b, c), (1, 2, 3)),
        lax.broadcast_in_dim(x[:, :1], (a, 3, c, 2), (0, 1, 2)),
        lax.reshape(x, (a * b * c,)), lax.reshape(x, (c, b * a), dimensions=(2, 1, 0)),
        lax.transpose(x, (2, 0, 1)), lax.squeeze(x[:1], (0,)), lax.rev(x, (0, 2)),
        lax.concatenate([x, x[:, :1]], 1), lax.pad(x, jnp.zeros((), x.dtype), ((1, -1, 1), (0, 2, 0), (-1, 1, 2))),
        lax.slice(x, (0, 0, 0), (a, b, c), (2, 1, 2)), jnp.stack([x, x], axis=1),
        jnp.tile(x, (1, 2, 1)), *lax.split(x, (1, a - 1), axis=0),
        jnp.expand_dims(x, (0, 3)), lax.select_n(x == x, x, jnp.zeros_like(x)),
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_data_movement_exact(dtype, data):
    x = data.draw(arrays(dtype, data.draw(shapes3)))
    assert_exact(jax_eval(_programs, x), refsim_eval(_programs, x), call=f"data movement on {x!r}")


def _reductions(x):
    a = x.dtype == jnp.bool_
    out = [lax.reduce_max(x, (0, 2)), lax.reduce_min(x, (1,))]
    if not a:
        out += [lax.reduce_sum(x, (1,)), lax.reduce_prod(x, (0,)), lax.cumsum(x, 0, reverse=True),
                lax.cumprod(x, 2), lax.argmax(x, 1, jnp.int32), lax.argmin(x, 0, jnp.int32),
                lax.cummax(x, 1), lax.cummin(x, 2, reverse=True)]
    if x.dtype.kind in "biu" or a:
        out += [lax.reduce_and(x, (0,)), lax.reduce_or(x, (1, 2)), lax.reduce_xor(x, (2,))]
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8, np.uint32, np.bool_], ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_reductions_match_jax(dtype, data):
    # the sign of a zero sum depends on XLA's reduction order (it drops size-1 reductions),
    # so -0.0 is drawn only in the max/min hand cases
    x = data.draw(arrays(dtype, data.draw(shapes3), signed_zero=False))
    want, got = jax_eval(_reductions, x), refsim_eval(_reductions, x)
    assert_exact(want, got, call=f"reductions on {x!r}")


def test_reduce_identities_and_nan_argmax():
    f = refsim_eval(lambda v: [lax.reduce_max(v, (0,)), lax.reduce_min(v, (0,)), lax.reduce_sum(v, (0,))],
                    np.zeros((0, 2), np.float32))
    np.testing.assert_array_equal(f[0], [-np.inf, -np.inf])
    np.testing.assert_array_equal(f[1], [np.inf, np.inf])
    np.testing.assert_array_equal(f[2], [0, 0])
    i = refsim_eval(lambda v: lax.reduce_max(v, (0,)), np.zeros((0,), np.int8))[0]
    assert i == -128
    x = np.float32([1, np.nan, 3, np.nan, -1])
    assert refsim_eval(lambda v: lax.argmax(v, 0, jnp.int32), x)[0] == 1  # first NaN
    assert refsim_eval(lambda v: lax.argmin(v, 0, jnp.int32), x)[0] == 1
    cm = refsim_eval(lambda v: lax.cummax(v, 0), np.float32([-0.0, 0.0, -0.0]))[0]
    np.testing.assert_array_equal(np.signbit(cm), [True, False, False])  # +0 > -0


@given(data=st.data())
def test_float_sums_within_bound(data):
    x = data.draw(hnp.arrays(np.float32, data.draw(shapes3), elements=st.floats(-100, 100, width=32)))
    fn = lambda v: [lax.reduce_sum(v, (0, 1)), lax.cumsum(v, 2), lax.cumlogsumexp(v, 1), jnp.mean(v)]  # noqa: E731
    assert_close(jax_eval(fn, x), refsim_eval(fn, x), ulps=64, call=f"sums of {x!r}")


def test_iota_and_reduce_window():
    fn = lambda v: [lax.iota(jnp.int32, 5), lax.broadcasted_iota(jnp.float32, (2, 3), 1),  # noqa: E731
                    lax.reduce_window(v, 0.0, lax.add, (2, 2), (1, 2), ((1, 0), (0, 1))),
                    lax.reduce_window(v, -jnp.inf, lax.max, (2, 1), (1, 1), "SAME", window_dilation=(2, 1)),
                    lax.reduce_window(v, jnp.inf, lax.min, (1, 2), (2, 1), "VALID", base_dilation=(1, 2))]
    x = np.arange(20, dtype=np.float32).reshape(4, 5) * np.float32([1, -1, 2, -2, 1])
    assert_exact(jax_eval(fn, x), refsim_eval(fn, x), call="iota/reduce_window")


# --- sorting ---------------------------------------------------------------------------

@given(data=st.data())
def test_sort_multi_operand_matches_jax(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=6))
    k1 = data.draw(arrays(np.float32, shape))
    k2 = data.draw(arrays(np.int32, shape))
    v = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
    fn = lambda a, b, c: [*lax.sort((a, b, c), dimension=0, num_keys=2), *lax.sort((a, c), dimension=-1),  # noqa: E731
                          *lax.top_k(a, min(2, a.shape[-1])), *lax.top_k(b, 1)]
    assert_exact(jax_eval(fn, k1, k2, v), refsim_eval(fn, k1, k2, v), call=f"sort {k1!r} {k2!r}")


def test_sort_nan_and_zero_order():
    # lax.sort: -0.0 == +0.0 (stable: input order kept), every NaN after +inf
    x = np.float32([np.nan, 0.0, -np.inf, -0.0, 1.0, -np.nan])
    out, idx = refsim_eval(lambda v: lax.sort((v, jnp.arange(6)), num_keys=1), x)
    np.testing.assert_array_equal(idx, [2, 1, 3, 4, 0, 5])
    # top_k: IEEE total order, largest first: +NaN > ... > +0 > -0 > ... > -NaN
    vals, ids = refsim_eval(lambda v: lax.top_k(v, 6), x)
    np.testing.assert_array_equal(ids, [0, 4, 1, 3, 2, 5])


# --- mesh dims ---------------------------------------------------------------------------

@pytest.mark.parametrize("m", [(3,), (2, 2)])
def test_stacked_structural_equals_per_device_loop(m):
    rng = np.random.default_rng(0)

    def fn(x, y, pv):
        return [lax.pad(x, pv, ((1, -1, 1), (2, 0, 0))), lax.concatenate([x, y], 0), lax.rev(x, (1,)),
                lax.broadcast_in_dim(y, (2, 2, 4), (1, 2)), lax.transpose(x, (1, 0)),
                lax.reduce_max(x, (1,)), lax.argmin(y, 1, jnp.int32), lax.cumsum(x, 1, reverse=True),
                *lax.sort((x, x * 2), dimension=1, num_keys=1), *lax.top_k(y, 2), jnp.sum(x), x.reshape(-1)]

    dev = lambda shape: (lambda pos: rng.integers(-4, 4, shape).astype(np.float32))  # noqa: E731
    stacked_matches_loop(fn, [dev((3, 4)), dev((2, 4)), lambda pos: np.float32(rng.integers(9))], m,
                         call="structural")


def test_reshape_of_a_contiguous_value_is_a_view_on_mesh_dims_too():
    # XLA's reshape is free; NumPy can reshape a C-contiguous array without a copy, with or
    # without leading mesh dims. (The oracle timed refsim's reshape of float32[1024, 4096, 32]:
    # it is this view; the copies were in the comparison.)
    from refsim.interpreter.registry import Context, RULES, load_rules

    load_rules()
    rule = RULES["reshape"]
    x = np.arange(2 * 8 * 6, dtype=np.float32).reshape(2, 8, 6)
    for nm, new_sizes in ((0, (16, 2, 3)), (1, (4, 2, 6))):
        out = rule(Context(nm=nm), x, new_sizes=new_sizes, dimensions=None, sharding=None)
        assert out.shape == x.shape[:nm] + new_sizes and np.shares_memory(out, x)
    flat = rule(Context(nm=1), x, new_sizes=(48,), dimensions=None, sharding=None)
    np.testing.assert_array_equal(flat[1], np.arange(48, 96, dtype=np.float32))     # row-major, by hand
    # `dimensions` transposes first: the row-major order of the transpose needs a copy
    t = rule(Context(nm=0), x[0], new_sizes=(48,), dimensions=(1, 0), sharding=None)
    np.testing.assert_array_equal(t[:3], [0.0, 6.0, 12.0])
