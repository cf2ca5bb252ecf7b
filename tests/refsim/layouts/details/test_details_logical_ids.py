"""Part 2: NamedSharding `_logical_device_ids` (devices permuted over the mesh), against JAX."""
import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax.sharding import NamedSharding as JNS, PartitionSpec as JP

import refsim
from refsim import Mesh, NamedSharding, P

DEVS = np.array(jax.devices()[:8])
SPECS = [(), ("x",), ("y",), ("x", "y"), ("y", "x"), (None, "x"), (("x", "y"),), (("y", "x"), None)]


def _meshes(order):
    jm = jax.sharding.Mesh(DEVS[np.asarray(order)].reshape(2, 4), ("x", "y"))
    return Mesh.from_jax(jm), jm


@given(order=st.permutations(range(8)), ldi=st.permutations(range(8)), spec=st.sampled_from(SPECS))
def test_placement_and_hlo_follow_logical_ids_as_jax(order, ldi, spec):
    rm, jm = _meshes(order)
    ours = NamedSharding(rm, P(*spec), _logical_device_ids=tuple(ldi))
    theirs = JNS(jm, JP(*spec), _logical_device_ids=tuple(ldi))
    assert ours.devices_indices_map((8, 8)) == {d.id: i for d, i in theirs.devices_indices_map((8, 8)).items()}
    assert str(ours.to_hlo(2)) == str(theirs._to_xla_hlo_sharding(2))


def test_hand_example_reversed_ids():
    # ids (7..0): flat position k is played by device 7-k, so device 7 holds block (0, 0).
    s = NamedSharding(Mesh((2, 4), ("x", "y")), P("x", "y"), _logical_device_ids=tuple(range(7, -1, -1)))
    m = s.devices_indices_map((4, 8))
    assert m[7] == (slice(0, 2), slice(0, 2)) and m[0] == (slice(2, 4), slice(6, 8))
    assert s.placement_ids.tolist() == [[7, 6, 5, 4], [3, 2, 1, 0]]
    assert s.device_set == frozenset(range(8))  # the same devices, another placement


def test_device_put_places_and_replica_ids_follow_jax():
    rm, jm = _meshes(range(8))
    ldi = (1, 0, 3, 2, 5, 4, 7, 6)
    x = np.arange(32.0, dtype=np.float32).reshape(4, 8)
    arr = refsim.device_put(x, NamedSharding(rm, P("y"), _logical_device_ids=ldi))
    jarr = jax.device_put(x, JNS(jm, JP("y"), _logical_device_ids=ldi))
    theirs = {s.device.id: (s.index, np.asarray(s.data), s.replica_id) for s in jarr.addressable_shards}
    for sh in arr.shards:
        idx, data, rid = theirs[sh.device_id]
        assert sh.index == idx and np.array_equal(sh.data, data) and sh.replica_id == rid
    assert np.array_equal(np.asarray(arr), x)


def test_equality_includes_logical_ids():
    m = Mesh((2, 4), ("x", "y"))
    a = NamedSharding(m, P("x"))
    b = NamedSharding(m, P("x"), _logical_device_ids=tuple(range(8)))
    assert a != b and b == a.update(_logical_device_ids=tuple(range(8)))
    assert b.with_spec(P("y")).logical_device_ids == tuple(range(8))


def test_bad_logical_ids_raise_like_jax():
    rm, jm = _meshes(range(8))
    with pytest.raises(ValueError):  # JAX: cannot reshape array of size 3 into shape (2,4)
        JNS(jm, JP("x"), _logical_device_ids=(0, 1, 2)).devices_indices_map((4,))
    with pytest.raises(ValueError, match=r"has 3 entries but the mesh has 8 devices"):
        NamedSharding(rm, P("x"), _logical_device_ids=(0, 1, 2))
    with pytest.raises(IndexError):
        JNS(jm, JP("x"), _logical_device_ids=tuple(range(1, 9))).devices_indices_map((4,))
    with pytest.raises(IndexError, match=r"contains 8, outside 0..7"):
        NamedSharding(rm, P("x"), _logical_device_ids=tuple(range(1, 9)))
    # JAX accepts a repeated id and leaves a device without a block; refsim refuses
    with pytest.raises(ValueError, match="names position 0 more than once"):
        NamedSharding(rm, P("x"), _logical_device_ids=(0, 0, 1, 2, 3, 4, 5, 6))
