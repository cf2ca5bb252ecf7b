"""Unreduced values in refsim's global view: jit inputs and outputs, reshard into and out of
unreduced layouts, reductions into more unreduced axes, custom_partitioning.

Expected values are computed by hand (or by NumPy on the global value); the property test
compares every device's partial sum with what XLA holds on 8 virtual CPU devices.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax.sharding import AxisType, PartitionSpec as JP

import refsim
from refsim import Mesh, NamedSharding, P, compat

pytestmark = pytest.mark.skipif(not compat.supports_unreduced_specs(),
                                reason="this JAX's PartitionSpec has no unreduced / reduced axes")


def _explicit(shape, names):
    return (jax.make_mesh(shape, names, axis_types=(AxisType.Explicit,) * len(shape),
                          devices=jax.devices()[:int(np.prod(shape))]),
            Mesh(shape, names, axis_types=(refsim.AxisType.Explicit,) * len(shape)))


def _unreduced_array(rmesh, spec, blocks: dict, shape):
    """A refsim.Array whose device at mesh position p holds blocks[p] (its own partial sum)."""
    sh = NamedSharding(rmesh, spec)
    index = sh.devices_indices_map(shape)
    ids = [int(rmesh.device_ids[p]) for p in blocks]
    return refsim.Array(shape, np.float32, sh, [refsim.Shard(d, index[d], np.asarray(b, np.float32))
                                                for d, b in zip(ids, blocks.values())])


def _shards(arr) -> dict:
    if isinstance(arr, refsim.Array):
        return {s.device_id: np.asarray(s.data) for s in arr.shards}
    return {s.device.id: np.asarray(s.data) for s in arr.addressable_shards}


def test_unreduced_input_is_read_as_its_partial_sums():
    _, rmesh = _explicit((2,), ("x",))
    arr = _unreduced_array(rmesh, P(unreduced={"x"}), {(0,): [1, 2], (1,): [10, 20]}, (2,))
    total = refsim.jit(lambda c: jax.sharding.reshard(c, JP()))(arr)
    np.testing.assert_array_equal(np.asarray(total), [11, 22])
    doubled = refsim.jit(lambda c: c + c)(arr)       # linear: stays unreduced, per device
    assert doubled.sharding.spec.unreduced == {"x"} and not doubled.sharding.spec.used_axes()
    assert [s.data.tolist() for s in doubled.shards] == [[2, 4], [20, 40]]


def test_reshard_into_unreduced_keeps_what_each_device_holds():
    _, rmesh = _explicit((2,), ("x",))

    def f(v):
        return jax.sharding.reshard(v, JP(unreduced={"x"}))

    sharded = refsim.jit(f, in_shardings=NamedSharding(rmesh, P("x")))(np.arange(4.0))
    assert [s.data.tolist() for s in sharded.shards] == [[0, 1, 0, 0], [0, 0, 2, 3]]
    replicated = refsim.jit(f, in_shardings=NamedSharding(rmesh, P()))(np.arange(4.0))
    assert [s.data.tolist() for s in replicated.shards] == [[0, 1, 2, 3], [0, 0, 0, 0]]
    out = refsim.jit(lambda v: v, out_shardings=NamedSharding(rmesh, P(unreduced={"x"})),
                     in_shardings=NamedSharding(rmesh, P("x")))(np.arange(4.0))
    assert [s.data.tolist() for s in out.shards] == [[0, 1, 0, 0], [0, 0, 2, 3]]


def test_reduce_sum_of_unreduced_operand_into_more_unreduced_axes():
    # a = arange(16).reshape(8, 2) on P('x', 'y'), b = arange(8).reshape(2, 4) on P('y', None):
    # a @ b unreduced over y is a[:, j] (outer) b[j] on y=j; summing rows (sharded over x) into
    # unreduced {x, y}: device (i, j) holds a[4i:4i+4, j].sum() * b[j] (JAX's pjit_test numbers).
    _, rmesh = _explicit((2, 2), ("x", "y"))
    a, b = np.arange(16.0).reshape(8, 2), np.arange(8.0).reshape(2, 4)

    def f(a, b):
        u = jnp.dot(a, b, out_sharding=JP("x", unreduced={"y"}))
        return jax.lax.reduce_sum(u, axes=[0], out_sharding=JP(unreduced={"x", "y"}))

    sh = (NamedSharding(rmesh, P("x", "y")), NamedSharding(rmesh, P("y", None)))
    out = refsim.jit(f, in_shardings=sh)(a, b)
    for (i, j) in np.ndindex(2, 2):
        np.testing.assert_array_equal(out.shard(int(rmesh.device_ids[i, j])).data, a[4 * i:4 * i + 4, j].sum() * b[j])
    assert out.shard(int(rmesh.device_ids[0, 1])).data.tolist() == [64, 80, 96, 112]

    def g(a, b):  # the type drops y: the y partial sums are all-reduced, x's stay
        u = jnp.dot(a, b, out_sharding=JP("x", unreduced={"y"}))
        return jax.lax.reduce_sum(u, axes=[0], out_sharding=JP(unreduced={"x"}))

    out = refsim.jit(g, in_shardings=sh)(a, b)
    for (i, j) in np.ndindex(2, 2):
        np.testing.assert_array_equal(out.shard(int(rmesh.device_ids[i, j])).data, (a[4 * i:4 * i + 4] @ b).sum(axis=0))


@pytest.mark.skipif(not hasattr(jax.sharding, "UnreducedKind"), reason="unreduced_kind is jax >= 0.12")
def test_reduce_max_into_unreduced_max_and_back():
    # rows of arange(8).reshape(4, 2) split over x: device x=i holds the max of its two rows,
    # [2, 3] and [6, 7]; combined by max the value is [6, 7]
    _, rmesh = _explicit((2, 2), ("x", "y"))
    spec = JP(unreduced={"x"}, unreduced_kind=jax.sharding.UnreducedKind.max)

    def f(v):
        u = jax.lax.reduce_max(v, axes=[0], out_sharding=spec)
        return u, jax.sharding.reshard(u, JP())

    u, total = refsim.jit(f, in_shardings=NamedSharding(rmesh, P("x", None)))(np.arange(8.0).reshape(4, 2))
    for (i, j) in np.ndindex(2, 2):
        assert u.shard(int(rmesh.device_ids[i, j])).data.tolist() == [[2, 3], [6, 7]][i]
    np.testing.assert_array_equal(np.asarray(total), [6, 7])


def test_custom_partitioning_is_evaluated_by_its_body():
    from jax.experimental.custom_partitioning import custom_partitioning

    @custom_partitioning
    def twice_plus_one(x):
        return 2 * x + 1

    def partition(mesh, arg_shapes, result_shape):
        s = arg_shapes[0].sharding
        return mesh, lambda x: 2 * x + 1, s, (s,)

    twice_plus_one.def_partition(partition=partition, sharding_rule="i j -> i j",
                                 infer_sharding_from_operands=lambda mesh, arg_shapes, result_shape:
                                 arg_shapes[0].sharding)
    _, rmesh = Mesh, Mesh((4,), ("x",))
    x = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    out = refsim.jit(twice_plus_one, in_shardings=NamedSharding(rmesh, P("x")))(x)
    np.testing.assert_array_equal(np.asarray(out), 2 * x + 1)


# -- against XLA: reshard into an unreduced layout and back, device by device -----------------
_AXES = ("x", "y", "z")
_SOURCES = (P(), P("x"), P("y"), P(None, "z"), P("x", "y"), P(("x", "z"), "y"), P("z", "y"), P(("y", "x")))


@st.composite
def _reshards(draw):
    src = draw(st.sampled_from(_SOURCES))
    unreduced = draw(st.sets(st.sampled_from(_AXES), min_size=1))
    free = [a for a in _AXES if a not in unreduced]
    dim0 = draw(st.sampled_from([None, *free]))
    dim1 = draw(st.sampled_from([None, *(a for a in free if a != dim0)]))
    return src, P(dim0, dim1, unreduced=unreduced)


@given(_reshards())
def test_reshard_to_unreduced_matches_xla_device_by_device(case):
    src, dst = case
    jmesh, rmesh = _explicit((2, 2, 2), _AXES)
    v = np.arange(32.0, dtype=np.float32).reshape(4, 8)

    def f(x):
        u = jax.sharding.reshard(x, dst.to_jax())
        return u, jax.sharding.reshard(u, src.to_jax())

    with jax.set_mesh(jmesh):
        want_u, want_back = jax.jit(f)(jax.device_put(v, src.to_jax()))
    got_u, got_back = refsim.jit(f, in_shardings=NamedSharding(rmesh, src))(v)
    assert got_u.sharding.spec.padded(2) == dst.padded(2)
    w, g = _shards(want_u), _shards(got_u)
    assert w.keys() == g.keys()
    for d in w:
        np.testing.assert_array_equal(g[d], w[d], err_msg=f"device {d}, {src} -> {dst}")
    np.testing.assert_array_equal(np.asarray(got_back), v)
    np.testing.assert_array_equal(np.asarray(want_back), v)


def test_jit_out_shardings_lay_an_unreduced_shard_map_output_out_anew():
    _, rmesh = _explicit((2, 2), ("x", "y"))
    a, b = np.arange(8.0).reshape(2, 4), np.arange(8.0).reshape(4, 2)
    sm = jax.shard_map(lambda a, b: jax.lax.pcast(a @ b, "y", to="unreduced"),
                       in_specs=(JP("x", "y"), JP("y", None)), out_specs=JP("x", None, unreduced={"y"}))
    sh = (NamedSharding(rmesh, P("x", "y")), NamedSharding(rmesh, P("y", None)))
    summed = refsim.jit(sm, in_shardings=sh, out_shardings=NamedSharding(rmesh, P("x", None)))(a, b)
    np.testing.assert_array_equal(np.asarray(summed), a @ b)          # the all-reduce of the partial sums
    kept = refsim.jit(sm, in_shardings=sh)(a, b)
    # device (i, j) holds row i of a, contraction block j: a[i, 2j:2j+2] @ b[2j:2j+2]
    for (i, j) in np.ndindex(2, 2):
        np.testing.assert_array_equal(kept.shard(int(rmesh.device_ids[i, j])).data,
                                      a[i:i + 1, 2 * j:2 * j + 2] @ b[2 * j:2 * j + 2])
