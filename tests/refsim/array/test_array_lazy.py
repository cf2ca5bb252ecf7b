"""Arrays built from stacked values: lazy Shards, cached layouts, and the replica check's cost."""
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, strategies as st

import refsim
from refsim import Array, Mesh, NamedSharding, P, ReplicationError
from refsim.layouts import stacking
from tests.refsim.array.test_array import layouts


@given(layouts(), st.booleans())
def test_lazy_shards_equal_the_sharding_maps(case, one_first):
    """Shards built on first read carry devices_indices_map's index and replica id, in mesh order."""
    mesh, spec, shape = case
    s = NamedSharding(mesh, spec)
    x = np.arange(int(np.prod(shape))).reshape(shape)
    arr = refsim.device_put(x, s)
    dim, rid = s.devices_indices_map(shape), s.device_replica_id_map(shape)
    order = mesh.device_ids.ravel().tolist()
    if one_first:  # one device's shard before the whole list is built
        d = order[-1]
        sh = arr.shard(d)
        assert (sh.device_id, sh.index, sh.replica_id) == (d, dim[d], rid[d])
        np.testing.assert_array_equal(sh.data, x[dim[d]])
    shards = arr.shards
    assert [sh.device_id for sh in shards] == order
    for sh in shards:
        assert sh.index == dim[sh.device_id] and sh.replica_id == rid[sh.device_id]
        np.testing.assert_array_equal(sh.data, x[sh.index])
        assert np.shares_memory(sh.data, arr.to_stacked(mesh)) or sh.data.size == 0


def naive_mismatch(y, nm, axes):
    """The first (pos_a, pos_b, local) in row-major order, one device pair at a time."""
    for pos in np.ndindex(*y.shape[:nm]):
        ref = tuple(0 if k in axes else p for k, p in enumerate(pos))
        a, b = y[ref], y[pos]
        ne = (a != b) & ~(np.isnan(a) & np.isnan(b))
        if ne.any():
            return ref, pos, tuple(int(i) for i in np.argwhere(ne)[0])
    return None


@given(st.data())
def test_chunked_replica_check_finds_the_first_difference(data):
    """Small chunks find the same first differing replica as a device-by-device loop."""
    mesh_shape = data.draw(st.sampled_from([(4,), (2, 3), (3, 2, 2)]))
    local = data.draw(st.sampled_from([(), (3,), (2, 2)]))
    y = np.zeros(mesh_shape + local)
    for _ in range(data.draw(st.integers(0, 3))):
        pos = tuple(data.draw(st.integers(0, n - 1)) for n in mesh_shape + local)
        y[pos] = data.draw(st.sampled_from([1.0, np.nan, -0.0]))
    nm = len(mesh_shape)
    axes = data.draw(st.lists(st.integers(0, nm - 1), unique=True))
    chunk = data.draw(st.sampled_from([1, 8, 64, 1 << 20]))
    assert stacking.replica_mismatch(y, nm, axes, chunk_bytes=chunk) == naive_mismatch(y, nm, axes)


def test_broadcast_replicas_are_not_compared():
    """A replicated result held once (stride-0 mesh dims) reads back without a per-replica pass."""
    mesh = Mesh((256, 256), ("x", "y"))
    block = np.arange(4096, dtype=np.float32)  # 16 KiB per device, 1 GiB if compared replica by replica
    arr = Array.from_stacked(block.reshape(1, 1, 4096), mesh, P())
    tracemalloc.start()
    try:
        got = np.asarray(arr)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(got, block)
    assert peak < 1 << 18, f"np.asarray of a broadcast replicated Array allocated {peak} bytes"


def test_real_replicas_are_still_checked_after_a_broadcast_axis():
    """A copy along one replica axis is compared even when another replica axis is a broadcast."""
    mesh = Mesh((2, 3), ("x", "y"))
    stacked = np.zeros((2, 1, 4))
    stacked[1, 0, 2] = 5.0  # the x-replicas differ; y is invariant (broadcast)
    arr = Array.from_stacked(stacked, mesh, P())
    with pytest.raises(ReplicationError, match=r"devices 0 and 3 .* global index \(2,\)"):
        np.asarray(arr)


def test_shard_map_result_checked_once():
    """An out_specs replication claim found false is still raised by np.asarray (lazily built Array)."""
    from jax import lax

    mesh = Mesh((2, 2), ("x", "y"))
    f = refsim.shard_map(lambda a: a * lax.axis_index("x"), mesh=mesh, in_specs=P(), out_specs=P(),
                         check_vma=False)
    out = f(np.ones(3, np.float32))
    assert out.info["replication"]
    with pytest.raises(ReplicationError):
        np.asarray(out)
    ok = refsim.shard_map(lambda a: lax.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())(np.ones(4))
    np.testing.assert_array_equal(np.asarray(ok), [2.0, 2.0])
