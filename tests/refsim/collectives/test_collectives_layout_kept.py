"""Kernels that keep their operand's memory order: results equal per-device loops, and a
shard_map operand's global layout survives to `np.asarray` without a transposing copy."""
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax import lax

import refsim
from refsim import Mesh, P
from refsim.collectives.reductions import ordered_reduce


@given(st.data())
def test_strided_reduce_is_a_left_fold(data):
    """ordered_reduce over axis 0 of any memory layout is ((x0 + x1) + x2) + ... in float32."""
    nd = data.draw(st.integers(2, 4))
    shape = (data.draw(st.integers(2, 24)),) + tuple(data.draw(st.integers(1, 5)) for _ in range(nd - 1))
    perm = data.draw(st.permutations(range(nd)))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    vals = (rng.standard_normal(shape) * 10.0 ** rng.integers(-7, 8, size=shape)).astype(np.float32)
    x = np.ascontiguousarray(vals.transpose(perm)).transpose(np.argsort(perm))  # same values, other layout
    want = x[0].copy()
    for i in range(1, shape[0]):
        want = want + x[i]
    np.testing.assert_array_equal(ordered_reduce(np.add, x), want)


def _blocks(a, X, Y):
    r, c = a.shape[0] // X, a.shape[1] // Y
    return [[a[i * r:(i + 1) * r, j * c:(j + 1) * c] for j in range(Y)] for i in range(X)]


def _assemble(blocks):
    return np.block([[b for b in row] for row in blocks])


@pytest.mark.parametrize("X,Y,r,c", [(4, 8, 8, 16), (8, 4, 64, 256)])  # the second takes the tiled copy
def test_all_to_all_over_the_major_axis_keeps_the_global_layout(X, Y, r, c):
    mesh = Mesh((X, Y), ("x", "y"))
    a = np.arange(X * r * Y * c, dtype=np.float32).reshape(X * r, Y * c)
    f = refsim.shard_map(lambda v: lax.all_to_all(v, "x", 0, 1, tiled=True), mesh=mesh,
                         in_specs=P("x", "y"), out_specs=P("x", "y"))
    out = f(a)
    B = _blocks(a, X, Y)
    # device (s, j) gets row block s of every sender (i, j), side by side in sender order
    want = [[np.concatenate([np.split(B[i][j], X, axis=0)[s] for i in range(X)], axis=1) for j in range(Y)]
            for s in range(X)]
    got = np.asarray(out)
    np.testing.assert_array_equal(got, _assemble(want))
    assert np.shares_memory(got, out.to_stacked(mesh)), "the result was not kept in the global layout"


@pytest.mark.parametrize("axis", ["x", "y"])
def test_ppermute_keeps_the_global_layout(axis):
    X, Y, r, c = 4, 8, 4, 6
    mesh = Mesh((X, Y), ("x", "y"))
    a = np.arange(X * r * Y * c, dtype=np.float32).reshape(X * r, Y * c) + 1
    k = X if axis == "x" else Y
    perm = [(i, (i + 1) % k) for i in range(k - 1)]  # the last one sends nothing: 0 receives zeros
    f = refsim.shard_map(lambda v: lax.ppermute(v, axis, perm), mesh=mesh, in_specs=P("x", "y"),
                         out_specs=P("x", "y"))
    out = f(a)
    B = _blocks(a, X, Y)
    src = {t: s for s, t in perm}
    want = [[None] * Y for _ in range(X)]
    for i in range(X):
        for j in range(Y):
            me = i if axis == "x" else j
            if me not in src:
                want[i][j] = np.zeros_like(B[i][j])
            else:
                want[i][j] = B[src[me]][j] if axis == "x" else B[i][src[me]]
    got = np.asarray(out)
    np.testing.assert_array_equal(got, _assemble(want))
    assert np.shares_memory(got, out.to_stacked(mesh))
