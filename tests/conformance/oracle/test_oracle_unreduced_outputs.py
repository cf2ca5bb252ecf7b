"""Results with unreduced axes (each device holds a partial sum) come off XLA's devices and are
compared device by device: JAX defines no device indices for them, refsim's equal sharding does."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, PartitionSpec as JP

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
