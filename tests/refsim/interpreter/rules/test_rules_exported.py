"""`call_exported` (issue 42, point 5): a deserialized `jax.export.Exported` called from a program
runs on refsim through its StableHLO module (refsim/interpreter/rules/exported.py). Expected
values by hand or NumPy."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import refsim

MESH = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
RING = [(i, (i + 1) % 4) for i in range(4)]


def _roundtrip(exp):
    """As a library gets it: serialized and read back (the Exported keeps no jaxpr)."""
    return jax.export.deserialize(exp.serialize())


def _sharded_ring_export():
    body = jax.shard_map(lambda a: jax.lax.ppermute(a, "y", RING), mesh=MESH, in_specs=P("x", "y"),
                         out_specs=P("x", "y"))
    arg = jax.ShapeDtypeStruct((4, 8), np.int32, sharding=NamedSharding(MESH, P("x", "y")))
    return _roundtrip(jax.export.export(jax.jit(body, out_shardings=NamedSharding(MESH, P("y", "x"))))(arg))


def test_an_exported_shard_map_runs_from_its_module():
    exp = _sharded_ring_export()
    x = np.arange(32, dtype=np.int32).reshape(4, 8)
    got = refsim.jit(exp.call)(x)
    # by hand: the device at y=j receives the 4x2 block of y=j-1: the column blocks roll by one (2 columns)
    np.testing.assert_array_equal(np.asarray(got), np.roll(x, 2, axis=1))
    assert jax.make_jaxpr(exp.call)(x).eqns[0].params["call_jaxpr"].eqns[0].primitive.name == "call_exported"


def test_a_shape_polymorphic_export_is_refined_to_the_call_shapes():
    f = jax.jit(lambda a: a.sum(0) * a.shape[0])
    spec, = jax.export.symbolic_args_specs((np.zeros((4, 3), np.int32),), ("b, 3",))
    exp = _roundtrip(jax.export.export(f)(spec))
    for rows in (2, 5):
        x = np.arange(rows * 3, dtype=np.int32).reshape(rows, 3)
        np.testing.assert_array_equal(np.asarray(refsim.jit(exp.call)(x)), x.sum(0) * rows)


def test_an_export_for_several_platforms_takes_the_running_ones_branch():
    exp = _roundtrip(jax.export.export(jax.jit(lambda a: a * 3 - 1), platforms=("tpu", "cpu"))(
        jax.ShapeDtypeStruct((8,), np.int32)))
    x = np.arange(8, dtype=np.int32)
    np.testing.assert_array_equal(np.asarray(refsim.jit(exp.call)(x)), 3 * x - 1)


def test_a_one_device_export_runs_on_each_devices_block_in_a_manual_region():
    block = jax.ShapeDtypeStruct((2, 2), np.int32)
    exp = _roundtrip(jax.export.export(jax.jit(lambda a: jnp.cumsum(a, axis=1)))(block))
    x = np.arange(32, dtype=np.int32).reshape(4, 8)
    spec = refsim.PartitionSpec("x", "y")
    out = refsim.shard_map(lambda a: exp.call(a), mesh=refsim.Mesh((2, 4), ("x", "y")), in_specs=spec, out_specs=spec)(x)
    want = np.concatenate([np.cumsum(x[:, 2 * j:2 * j + 2], axis=1) for j in range(4)], axis=1)  # per 2x2 block
    np.testing.assert_array_equal(np.asarray(out), want)


def test_an_export_for_several_devices_is_refused_inside_a_manual_region():
    exp = _sharded_ring_export()
    with pytest.raises(ValueError, match="exported for 8 devices and is called inside a manual region"):
        refsim.shard_map(lambda a: exp.call(a), mesh=refsim.Mesh((2, 4), ("x", "y")),
                         in_specs=refsim.PartitionSpec(), out_specs=refsim.PartitionSpec())(np.zeros((4, 8), np.int32))
