"""slice / dynamic_slice / dynamic_update_slice / gather / scatter rules against JAX on CPU."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp
from jax import lax

from rules_harness import assert_exact, jax_eval, refsim_eval, stacked_matches_loop

X = np.arange(24, dtype=np.float32).reshape(4, 6) - 7


def _dyn(x, i, j):
    return [lax.dynamic_slice(x, (i, j), (2, 3)), lax.dynamic_update_slice(x, jnp.ones((3, 2), x.dtype), (j, i)),
            lax.dynamic_slice_in_dim(x, i, 1, axis=0), lax.dynamic_index_in_dim(x, j, 1, keepdims=False)]


@given(i=st.integers(-9, 9), j=st.integers(-9, 9))
def test_dynamic_slices_clamp(i, j):
    args = (X, np.int32(i), np.int32(j))
    assert_exact(jax_eval(_dyn, *args), refsim_eval(_dyn, *args), call=f"dynamic slices at {i}, {j}")


def test_dynamic_slice_clamp_hand():
    # lax.dynamic_slice wraps a negative start once (-3 -> 1), then StableHLO clamps it to
    # [0, dim - size] (9 -> 3); the raw primitive clamps -3 to 0
    got = refsim_eval(lambda x: lax.dynamic_slice(x, (-3, 9), (2, 3)), X)[0]
    np.testing.assert_array_equal(got, X[1:3, 3:6])
    from refsim.interpreter.registry import Context, lookup
    raw = lookup("dynamic_slice")(Context(), X, np.int32(-3), np.int32(9), slice_sizes=(2, 3))
    np.testing.assert_array_equal(raw, X[0:2, 3:6])


def _gathers(x, idx):
    return [jnp.take(x, idx, axis=0, mode="clip"), jnp.take(x, idx, axis=1, mode="fill", fill_value=-1),
            x.at[idx].get(mode="fill"), x.at[idx % 4, 2].get(mode="promise_in_bounds"),
            jnp.take_along_axis(x[: idx.shape[0]] if idx.shape[0] <= 4 else x, (jnp.abs(idx)[:, None] % 6)[:4], axis=1),
            x[idx % 4, ::2],
            x.at[idx].get(mode="clip")]


@given(idx=hnp.arrays(np.int32, st.integers(1, 5), elements=st.integers(-8, 8)))
def test_gather_modes_match_jax(idx):
    assert_exact(jax_eval(_gathers, X, idx), refsim_eval(_gathers, X, idx), call=f"gathers at {idx!r}")


def _scatters(x, idx, upd):
    return [x.at[idx].set(upd, mode="drop"), x.at[idx].add(upd, mode="clip"), x.at[idx].mul(upd),
            x.at[idx].min(upd, mode="drop"), x.at[idx].max(upd), x.at[idx, 1].add(upd[:, 0]),
            x.at[idx].apply(lambda v: v * 2 + 1), x.at[idx].subtract(upd)]


@given(idx=hnp.arrays(np.int32, 3, elements=st.integers(-6, 6)),
       upd=hnp.arrays(np.float32, (3, 6), elements=st.sampled_from([0.0, 1.0, -2.0, 0.5, 4.0])))
def test_scatter_family_matches_jax(idx, upd):
    assert_exact(jax_eval(_scatters, X, idx, upd), refsim_eval(_scatters, X, idx, upd),
                 call=f"scatters at {idx!r}")


def test_scatter_duplicates_combine_and_drop_out_of_bounds():
    x = np.zeros(4, np.float32)
    idx = np.int32([1, 1, 3, 9, -9])
    upd = np.float32([1, 2, 4, 8, 16])
    add = refsim_eval(lambda a, i, u: a.at[i].add(u, mode="drop"), x, idx, upd)[0]
    np.testing.assert_array_equal(add, [0, 3, 0, 4])
    clip = refsim_eval(lambda a, i, u: a.at[i].add(u, mode="clip"), x, idx, upd)[0]
    np.testing.assert_array_equal(clip, [16, 3, 0, 12])
    g = refsim_eval(lambda a, i: a.at[i].get(mode="fill"), np.float32([1, 2, 3, 4]), idx)[0]
    np.testing.assert_array_equal(g[:3], [2, 2, 4])
    assert np.isnan(g[3:]).all()  # JAX's default fill for floats is NaN


def test_gather_scatter_with_batching_dims():
    operand = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
    idx = np.int32([[[1], [4]], [[0], [2]]])  # (batch 2, 2 lookups, index vector 1)
    gd = lax.GatherDimensionNumbers(offset_dims=(2,), collapsed_slice_dims=(1,), start_index_map=(1,),
                                    operand_batching_dims=(0,), start_indices_batching_dims=(0,))
    sd = lax.ScatterDimensionNumbers(update_window_dims=(2,), inserted_window_dims=(1,),
                                     scatter_dims_to_operand_dims=(1,), operand_batching_dims=(0,),
                                     scatter_indices_batching_dims=(0,))

    def fn(o, i):
        g = lax.gather(o, i, gd, slice_sizes=(1, 1, 3), mode="clip")
        s = lax.scatter_add(o, i, jnp.ones((2, 2, 3), o.dtype), sd, mode="drop")
        return [g, s]

    got = refsim_eval(fn, operand, idx)
    assert_exact(jax_eval(fn, operand, idx), got, call="batching dims")
    # hand check: batch b row idx[b, k]
    np.testing.assert_array_equal(got[0][1, 1], operand[1, 2])


@pytest.mark.parametrize("m", [(4,), (2, 2)])
def test_stacked_indexing_with_per_device_indices(m):
    rng = np.random.default_rng(3)

    def fn(x, i, u):
        return [lax.dynamic_slice(x, (i, 1), (2, 2)), lax.dynamic_update_slice(x, u, (i, i)),
                jnp.take(x, jnp.stack([i, i + 1, -i]), axis=0, mode="fill", fill_value=0.0),
                x.at[jnp.stack([i, 0, i])].add(u[0, 0]), x[1:3, ::2]]

    stacked_matches_loop(fn, [lambda pos: rng.integers(-5, 5, (4, 5)).astype(np.float32),
                              lambda pos: np.int32(rng.integers(-2, 6)),
                              lambda pos: rng.integers(0, 3, (2, 2)).astype(np.float32)], m, call="indexing")


def test_scatter_max_with_duplicates_on_a_transposed_operand():
    # found by the sharded-programs hunt: vmap moves the batch axis, so the scatter's operand is a
    # transposed view; the combine-in-rounds path wrote into a copy and returned the operand unchanged.
    # By hand: row 1 of each batch is max(0, both updates), the updates being u[:, b, :].
    f = lambda a, u: a.at[jnp.array([1, -1])].max(u, mode="promise_in_bounds")  # noqa: E731
    a = np.zeros((2, 2, 3), np.int32)
    u = np.arange(12, dtype=np.int32).reshape(2, 2, 3) - 5
    got = refsim_eval(jax.vmap(f, in_axes=(1, 1)), a, u)[0]
    assert np.asarray(got).tolist() == [[[0, 0, 0], [1, 2, 3]], [[0, 0, 0], [4, 5, 6]]]
    g = lambda a, u: a.at[jnp.array([0, 0])].min(u)  # noqa: E731   # scatter-min, same path
    got = refsim_eval(jax.vmap(g, in_axes=(1, 1)), a, u)[0]
    assert np.asarray(got).tolist() == [[[-5, -4, -3], [0, 0, 0]], [[-2, -1, 0], [0, 0, 0]]]


def test_scatter_into_a_0d_operand():
    # x.at[()].set / add / mul / max on a scalar (flax's nnx.Rngs counter in an eager scatter): a
    # scatter with no index dimension at all; by hand 3 -> 5, 3 + 5, 3 * 5, max(3, 5)
    x, v = np.uint32(3), np.uint32(5)
    fns = [lambda a, b: jnp.asarray(a).at[()].set(b), lambda a, b: jnp.asarray(a).at[()].add(b),
           lambda a, b: jnp.asarray(a).at[()].mul(b), lambda a, b: jnp.asarray(a).at[()].max(b)]
    got = [refsim_eval(f, x, v)[0] for f in fns]
    assert [int(g) for g in got] == [5, 8, 15, 5] and all(np.shape(g) == () for g in got)
