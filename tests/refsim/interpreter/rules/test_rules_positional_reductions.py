"""psum / pmax / pmin over positional axes (issue 42, point 5): `jax.vmap(f, axis_name=...)` of a
collective leaves `psum[axes=(0,)]` in a jaxpr outside any manual region; refsim reduces those
array dimensions (refsim.collectives.reductions.positional_reduce). Expected values by NumPy."""
from __future__ import annotations

import jax
import numpy as np
import pytest

import refsim
from refsim.collectives.reductions import positional_reduce


def test_vmap_of_psum_pmax_pmin_pmean_in_global_view():
    x = np.array([[1., 5., -2.], [4., np.nan, 0.], [-3., 2., 7.]], np.float32)

    def f(a):
        return jax.lax.psum(a, "i"), jax.lax.pmax(a, "i"), jax.lax.pmin(a, "i"), jax.lax.pmean(a, "i")

    g = jax.vmap(f, axis_name="i")
    eqns = jax.make_jaxpr(g)(x).eqns
    assert {e.params["axes"] for e in eqns if e.primitive.name in ("psum", "pmax", "pmin")} == {(0,)}
    s, mx, mn, mean = (np.asarray(o) for o in refsim.jit(g)(x))
    # by hand, column by column: [1+4-3, NaN, -2+0+7]; NaN propagates through max / min
    np.testing.assert_array_equal(s, np.broadcast_to([2., np.nan, 5.], (3, 3)))
    np.testing.assert_array_equal(mx, np.broadcast_to([4., np.nan, 7.], (3, 3)))
    np.testing.assert_array_equal(mn, np.broadcast_to([-3., np.nan, -2.], (3, 3)))
    np.testing.assert_allclose(mean, np.broadcast_to([2 / 3, np.nan, 5 / 3], (3, 3)), rtol=1e-7)


def test_nested_vmaps_reduce_both_positional_axes_and_in_axes_moves_the_axis():
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    g = jax.vmap(jax.vmap(lambda a: jax.lax.psum(a, ("i", "j")), axis_name="j"), axis_name="i")
    np.testing.assert_array_equal(np.asarray(refsim.jit(g)(x)), np.broadcast_to(x.sum((0, 1)), x.shape))
    h = jax.vmap(lambda a: jax.lax.pmax(a, "i"), axis_name="i", in_axes=1, out_axes=1)
    np.testing.assert_array_equal(np.asarray(refsim.jit(h)(x[0])), np.broadcast_to(x[0].max(1, keepdims=True), (3, 4)))


def test_positional_reduce_refuses_named_axes_and_groups():
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(positional_reduce(x, axes=(1,), op="min"), np.ones(2, np.float32))
    with pytest.raises(ValueError, match="names mesh axes"):
        positional_reduce(x, axes=(0, "x"))
    with pytest.raises(ValueError, match="axis_index_groups can only be used with reductions over named axes"):
        positional_reduce(x, axes=(0,), axis_index_groups=[[0, 1]])
