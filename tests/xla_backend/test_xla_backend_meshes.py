"""xla_backend meshes and conversions on the 8 virtual CPU devices."""
import jax
import numpy as np
import pytest

import xla_backend
from refsim import Mesh, NamedSharding, P
from refsim.array import Array, Shard


def test_device_orders_hand_computed():
    assert xla_backend.device_order((2, 4), "default").tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert xla_backend.device_order((2, 4), "reversed").tolist() == [[7, 6, 5, 4], [3, 2, 1, 0]]
    # transposed: first axis fastest
    assert xla_backend.device_order((2, 4), "transposed").tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert xla_backend.device_order((8,), "transposed").tolist() == list(range(8))
    r = xla_backend.device_order((2, 2, 2), ("random", 3))
    assert sorted(r.ravel().tolist()) == list(range(8))
    assert r.tolist() == xla_backend.device_order((2, 2, 2), ("random", 3)).tolist()


def test_mesh_ids_are_jax_device_ids():
    m = xla_backend.mesh((2, 4), ("x", "y"), order="reversed")
    assert isinstance(m, Mesh)
    assert m.device_ids.tolist() == [[7, 6, 5, 4], [3, 2, 1, 0]]
    jm = xla_backend.jax_mesh(m)
    assert jm.axis_names == ("x", "y")
    assert [[d.id for d in row] for row in jm.devices] == m.device_ids.tolist()
    assert Mesh.from_jax(jm) == m


def test_mesh_explicit_ids():
    ids = [[3, 1, 0, 2], [7, 6, 5, 4]]
    m = xla_backend.mesh((2, 4), ("x", "y"), order=ids)
    assert m.device_ids.tolist() == ids
    assert xla_backend.mesh((4,), "x", order=[5, 6, 7, 0]).device_ids.tolist() == [5, 6, 7, 0]


def test_mesh_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"16 devices are needed but JAX has 8 cpu devices.*XLA_BACKEND_DEVICES=16"):
        xla_backend.mesh((4, 4), ("x", "y"))
    with pytest.raises(ValueError, match=r"device ids \[99\] are not JAX devices"):
        xla_backend.mesh((2,), ("x",), order=[0, 99])
    with pytest.raises(ValueError, match=r"order has 3 device ids but mesh shape \(4,\) needs 4"):
        xla_backend.mesh((4,), ("x",), order=[0, 1, 2])
    with pytest.raises(ValueError, match=r"order='random' needs a seed"):
        xla_backend.mesh((4,), ("x",), order="random")
    with pytest.raises(ValueError, match=r"order='sideways' is not a device order"):
        xla_backend.mesh((4,), ("x",), order="sideways")
    with pytest.raises(TypeError, match="mesh must be a refsim.Mesh"):
        xla_backend.jax_mesh("x")
    with pytest.raises(ValueError, match=r"device ids \[8, 9\] are not JAX devices"):
        xla_backend.jax_mesh(Mesh((2, 2), ("x", "y"), device_ids=[[0, 8], [9, 1]]))


def test_to_refsim_copies_every_shard():
    m = xla_backend.mesh((2, 4), ("x", "y"), order=("random", 0))
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    ja = jax.device_put(x, jax.sharding.NamedSharding(xla_backend.jax_mesh(m), jax.sharding.PartitionSpec("y", None)))
    arr = xla_backend.to_refsim(ja)
    assert isinstance(arr, Array)
    assert arr.sharding == NamedSharding(m, P("y", None))
    assert len(arr.shards) == 8
    for s in arr.shards:
        pos = m.device_position(s.device_id)
        # hand layout: dim 0 cut in 4 by 'y'; block number = position along y
        np.testing.assert_array_equal(s.data, x[2 * pos[1]:2 * pos[1] + 2])
        assert s.replica_id == pos[0]
        assert s.data.flags.owndata or s.data.base is not None
    np.testing.assert_array_equal(np.asarray(arr), x)


def test_from_refsim_keeps_per_device_data():
    m = xla_backend.mesh((2, 4), ("x", "y"), order="transposed")
    stacked = np.arange(8, dtype=np.int32).reshape(2, 4, 1, 1)  # differs along 'x': replicas disagree
    arr = Array.from_stacked(stacked, m, P(None, "y"))
    ja = xla_backend.from_refsim(arr)
    got = {s.device.id: np.asarray(s.data) for s in ja.addressable_shards}
    for pos, dev in np.ndenumerate(m.device_ids):
        assert got[int(dev)].tolist() == [[pos[0] * 4 + pos[1]]]
    back = xla_backend.to_refsim(ja)
    for s in back.shards:
        np.testing.assert_array_equal(s.data, arr.shard(s.device_id).data)


def test_sharding_conversions_round_trip():
    m = xla_backend.mesh((2, 4), ("x", "y"), order="reversed")
    for spec in (P(), P("x"), P(("y", "x")), P(None, "y")):
        s = NamedSharding(m, spec)
        js = xla_backend.to_jax_sharding(s)
        assert js.devices_indices_map((8, 8)) and {
            d.id: i for d, i in js.devices_indices_map((8, 8)).items()
        } == s.devices_indices_map((8, 8))
        assert xla_backend.from_jax_sharding(js) == s
    from refsim.layouts.single_device import SingleDeviceSharding

    js = xla_backend.to_jax_sharding(SingleDeviceSharding(5))
    assert [d.id for d in js.device_set] == [5]
    assert xla_backend.from_jax_sharding(js) == SingleDeviceSharding(5)
    with pytest.raises(TypeError, match="wrap it as refsim.NamedSharding"):
        xla_backend.to_jax_sharding(P("x"))


def test_gspmd_sharding_converts_to_the_same_placement():
    # JAX's GSPMDSharding (an HloSharding over a device assignment) is the independent
    # implementation: every device's block and replica id must be the ones JAX gives.
    from jax._src.sharding_impls import GSPMDSharding

    jm = jax.make_mesh((4, 2), ("x", "y"))
    shape = (8, 4)
    x = np.arange(32, dtype=np.float32).reshape(shape)
    for spec in (jax.P("y", "x"), jax.P("x"), jax.P(None, "y"), jax.P(("x", "y")), jax.P(), jax.P("y")):
        hlo = jax.sharding.NamedSharding(jm, spec)._to_xla_hlo_sharding(2)
        gs = GSPMDSharding(tuple(jm.devices.flat)[::-1], hlo)      # a reversed device assignment
        ref = xla_backend.from_jax_sharding(gs)
        want = {d.id: tuple((s.start, s.stop) for s in i) for d, i in gs.devices_indices_map(shape).items()}
        got = {d: tuple((s.start, s.stop) for s in i) for d, i in ref.devices_indices_map(shape).items()}
        assert got == want, (spec, str(hlo))
        replicas = {s.device.id: s.replica_id for s in jax.device_put(x, gs).addressable_shards}
        assert dict(ref.device_replica_id_map(shape)) == replicas, (spec, str(hlo))


def test_gspmd_sharding_without_a_named_equivalent_is_a_type_error():
    from jax._src.sharding_impls import GSPMDSharding
    from jax._src.lib import xla_client as xc

    gs = GSPMDSharding(tuple(jax.devices()[:2]), xc.HloSharding.manual())
    with pytest.raises(TypeError, match="has no refsim equivalent"):
        xla_backend.from_jax_sharding(gs)


def test_equal_jax_shardings_convert_to_one_refsim_object():
    jm = jax.make_mesh((4, 2), ("x", "y"))
    a = xla_backend.from_jax_sharding(jax.sharding.NamedSharding(jm, jax.P("x")))
    b = xla_backend.from_jax_sharding(jax.sharding.NamedSharding(jm, jax.P("x")))
    c = xla_backend.from_jax_sharding(jax.sharding.NamedSharding(jm, jax.P("y")))
    assert a is b and a != c and c.spec == P("y")
