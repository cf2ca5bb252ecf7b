"""Values with unreduced axes (each device holds a partial sum) in oracle mode.

They come off XLA's devices with each device's own partial sum (JAX defines no device indices
for them, refsim's equal sharding does). A shard_map's out_specs state each device's partial
value, so those are compared device by device; a jit-level unreduced result states only its
sum (how it is split is the partitioner's choice), so both sides are added up and compared.
Unreduced inputs, `device_put` onto unreduced layouts and custom_partitioning are checked."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as JP

import conformance
from conformance.verdict.compare import compare
from conformance.oracle import intercept
from conformance.oracle import session as sess
from refsim.array import Array, Shard
from xla_backend import convert

A = np.random.default_rng(0).integers(-3, 4, (4, 8)).astype(np.float32)
B = np.random.default_rng(1).integers(-3, 4, (8, 6)).astype(np.float32)


def _matmul_unreduced():
    """XLA's a @ b left unreduced over x on a 2x2 Explicit mesh (a split by columns, b by rows)."""
    mesh = jax.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2, devices=jax.devices()[:4])
    f = jax.jit(lambda a, b: jnp.einsum("ab,bc->ac", a, b, out_sharding=JP(unreduced={"x"})))
    with jax.set_mesh(mesh):
        return mesh, f, (jax.device_put(A, JP(None, "x")), jax.device_put(B, JP("x", None)))


def test_unreduced_result_copied_off_devices_holds_each_partial_sum():
    mesh, f, args = _matmul_unreduced()
    with jax.set_mesh(mesh):
        out = convert.to_refsim(f(*args))
    assert out.sharding.spec.unreduced == {"x"}
    for pos in np.ndindex(2, 2):                      # by hand: device at x=i holds a[:, 4i:4i+4] @ b[4i:4i+4]
        dev = int(mesh.devices[pos].id)
        (shard,) = [s for s in out.shards if s.device_id == dev]
        i = pos[0]
        np.testing.assert_array_equal(shard.data, A[:, 4 * i:4 * i + 4] @ B[4 * i:4 * i + 4])
        assert shard.index == (slice(None), slice(None))  # placed as if replicated over x
    assert len({s.replica_id for s in out.shards}) == 4   # no two devices hold the same partial sum


def test_oracle_checks_an_unreduced_result_and_catches_a_wrong_partial_sum():
    mesh, f, args = _matmul_unreduced()
    session = sess.Session()
    session.context = "unreduced"
    intercept.install(session)
    try:
        g = jax.jit(lambda a, b: jnp.einsum("ab,bc->ac", a, b, out_sharding=JP(unreduced={"x"})))
        with jax.set_mesh(mesh):
            g(*args)
    finally:
        intercept.uninstall()
    (call,) = session.calls
    assert call["outcome"] == "agree", call
    with jax.set_mesh(mesh):
        good = convert.to_refsim(f(*args))
    # the same values with the partial sums of x=0 and x=1 swapped: the total is unchanged,
    # each device's share is not, and device by device that is a disagreement
    by_dev = {s.device_id: s for s in good.shards}
    ids = [[int(mesh.devices[i, j].id) for j in range(2)] for i in range(2)]
    swapped = []
    for s in good.shards:
        i, j = next((i, j) for i in range(2) for j in range(2) if ids[i][j] == s.device_id)
        swapped.append(Shard(s.device_id, s.index, by_dev[ids[1 - i][j]].data, s.replica_id))
    bad = Array(good.shape, good.dtype, good.sharding, swapped)
    assert compare(good, good).ok
    res = compare(good, bad)
    assert not res.ok and "values differ" in res.report(), res.report()


def _explicit(shape, names):
    n = int(np.prod(shape))
    return jax.make_mesh(shape, names, axis_types=(AxisType.Explicit,) * len(shape), devices=jax.devices()[:n])


def test_unreduced_inputs_and_outputs_of_jit_are_checked():
    mesh, f, args = _matmul_unreduced()
    with jax.set_mesh(mesh):
        u = f(*args)
        summed = conformance.check(jax.jit(lambda c: jax.sharding.reshard(c, JP())), u)
        doubled = conformance.check(jax.jit(lambda c: c + c), u)
    assert summed.ok and doubled.ok
    assert "unreduced: the sum of the partial values compared" in doubled.outputs[0].placement


def test_three_operand_einsum_unreduced_is_compared_by_its_sum():
    # JAX's pjit_test: the jaxpr reshards every operand to replicated and the result to
    # unreduced; XLA's partitioner leaves the partial sums where it computed them, not on the
    # devices at position 0 along x, so only the sum is the program's
    mesh = _explicit((2, 2, 1), ("x", "y", "z"))
    with jax.set_mesh(mesh):
        a1 = jax.device_put(np.arange(2), JP("x"))
        a2 = jax.device_put(np.arange(8).reshape(2, 4), JP("x", "y"))
        a3 = jax.device_put(np.arange(2), JP("x"))
        res = conformance.check(jax.jit(lambda a, b, c: jnp.einsum("d,dh,d->h", a, b, c,
                                                                  out_sharding=JP("y", unreduced={"x"}))),
                                a1, a2, a3)
    assert res.ok and res.policies == ["exact"]


def test_device_put_onto_and_off_unreduced_layouts_is_checked():
    mesh = _explicit((2,), ("x",))
    session = sess.Session()
    session.context = "device_put"
    intercept.install(session)
    try:
        with jax.set_mesh(mesh):
            shd = jax.device_put(np.arange(4.0), JP("x"))
            u = jax.device_put(shd, JP(unreduced={"x"}))
            jax.device_put(u, JP(unreduced={"x"}))
    finally:
        intercept.uninstall()
    puts = [c for c in session.calls if c["entry"] == "device_put"]
    assert len(puts) >= 2 and all(c["outcome"] == "agree" for c in puts), session.calls
    assert [np.asarray(s.data).tolist() for s in u.addressable_shards] == [[0, 1, 0, 0], [0, 0, 2, 3]]


def test_custom_partitioning_is_checked_against_its_body():
    from jax.experimental.custom_partitioning import custom_partitioning

    @custom_partitioning
    def twice(x):
        return 2 * x

    def partition(mesh, arg_shapes, result_shape):
        s = arg_shapes[0].sharding
        return mesh, lambda x: 2 * x, s, (s,)

    twice.def_partition(partition=partition, sharding_rule="i j -> i j",
                        infer_sharding_from_operands=lambda mesh, arg_shapes, result_shape: arg_shapes[0].sharding)
    mesh = jax.make_mesh((4,), ("x",), devices=jax.devices()[:4])
    x = jax.device_put(np.arange(32.0, dtype=np.float32).reshape(8, 4), jax.sharding.NamedSharding(mesh, JP("x")))
    res = conformance.check(jax.jit(twice), x)
    assert res.ok and res.provenance["independent"]


def test_a_wrong_sum_of_partial_values_is_a_disagreement():
    from refsim.interpreter.unreduced import all_reduced

    mesh, f, args = _matmul_unreduced()
    with jax.set_mesh(mesh):
        good = convert.to_refsim(f(*args))
    # one partial sum off by one on both replicas of x=1: the total differs by one everywhere
    ids = {int(mesh.devices[1, j].id) for j in range(2)}
    bad = Array(good.shape, good.dtype, good.sharding,
                [Shard(s.device_id, s.index, s.data + (1 if s.device_id in ids else 0), s.replica_id)
                 for s in good.shards])
    assert compare(all_reduced(good), all_reduced(good)).ok
    np.testing.assert_array_equal(np.asarray(all_reduced(good)), A @ B)
    res = compare(all_reduced(good), all_reduced(bad))
    assert not res.ok and "values differ" in res.report(), res.report()


@pytest.mark.skipif(not hasattr(jax.sharding, "UnreducedKind"), reason="unreduced_kind is jax >= 0.12")
@pytest.mark.parametrize("kind", ["max", "min"])
def test_unreduced_max_and_min_are_checked_by_their_combined_value(kind):
    mesh = _explicit((2, 2), ("x", "y"))
    uk = getattr(jax.sharding.UnreducedKind, kind)
    op = jax.lax.reduce_max if kind == "max" else jax.lax.reduce_min
    with jax.set_mesh(mesh):
        x = jax.device_put(np.arange(8.0).reshape(4, 2), JP("x", None))
        f = jax.jit(lambda x: op(x, axes=[0], out_sharding=JP(unreduced={"x"}, unreduced_kind=uk)))
        out = conformance.check(f, x)
        inp = conformance.check(jax.jit(lambda u: jax.sharding.reshard(u, JP())), f(x))
    assert out.ok and inp.ok
    assert f"unreduced: the {kind} of the partial values compared" in out.outputs[0].placement
