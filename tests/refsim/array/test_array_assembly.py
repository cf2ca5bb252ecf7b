"""refsim.Array's global value from shards held apart (as read off XLA's devices): one copy into
one buffer, equal to a naive per-device loop; a fully replicated value is a read-only view of
its first block; replicas that differ still raise. refsim.array.put(copy=False) lays a value out
as views of it; refsim.evaluate places the results it computed without copying them."""
import jax
import numpy as np
import pytest

import refsim
from refsim import array as refsim_array
from refsim.array import Array, Shard
from refsim.errors import ReplicationError
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec as P

MESH = Mesh((2, 4), ("x", "y"))


def _apart(value, spec):
    """An Array over MESH whose shards are separate copies (not views of one stacked array)."""
    sh = NamedSharding(MESH, spec)
    idx, rid = sh.devices_indices_map(value.shape), sh.device_replica_id_map(value.shape)
    return Array(value.shape, value.dtype, sh, [Shard(d, i, np.array(value[i], copy=True), rid[d])
                                                for d, i in idx.items()])


def _naive_global(arr):
    """Each device's block written at its index by a plain loop over the shards."""
    out = np.full(arr.shape, np.nan, arr.dtype)
    for s in arr.shards:
        out[s.index] = s.data
    return out


@pytest.mark.parametrize("spec", [P("x"), P("y"), P(None, "x"), P("y", "x"), P(("x", "y")), P(None, ("y", "x"))])
def test_global_from_shards_equals_naive_loop(spec):
    value = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    arr = _apart(value, spec)
    got = np.asarray(arr)
    np.testing.assert_array_equal(got, _naive_global(arr))
    np.testing.assert_array_equal(got, value)
    assert not any(np.shares_memory(got, s.data) for s in arr.shards)      # one fresh buffer


def test_fully_replicated_global_is_a_read_only_view():
    value = np.arange(6, dtype=np.int32).reshape(2, 3)
    arr = _apart(value, P())
    got = np.asarray(arr)
    np.testing.assert_array_equal(got, value)
    assert np.shares_memory(got, arr.shards[0].data) and not got.flags.writeable
    assert arr.shards[0].data.flags.writeable                               # the shard itself unchanged


@pytest.mark.parametrize("spec", [P(), P("x")])
def test_differing_replicas_still_raise(spec):
    value = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    arr = _apart(value, spec)
    victim = next(s for s in arr.shards if s.replica_id == 3)
    victim.data[0, 1] = -1.0
    with pytest.raises(ReplicationError, match="replicas disagree"):
        np.asarray(arr)


def test_nan_replicas_agree():
    value = np.array([[np.nan, 1.0]], np.float32)
    np.testing.assert_array_equal(np.asarray(_apart(value, P())), value)


def test_put_without_copy_is_views_and_device_put_copies():
    x = np.arange(16, dtype=np.float32).reshape(8, 2)
    sh = NamedSharding(MESH, P("x"))
    viewed = refsim_array.put(x, sh, copy=False)
    copied = refsim.device_put(x, sh)
    assert all(np.shares_memory(s.data, x) for s in viewed.shards)
    assert not any(np.shares_memory(s.data, x) for s in copied.shards)
    assert x.flags.writeable                                                # the caller's array untouched
    x64 = np.arange(16, dtype=np.float64).reshape(8, 2)                    # canonicalised to float32: new memory
    assert not any(np.shares_memory(s.data, x64) for s in refsim_array.put(x64, sh, copy=False).shards)
    np.testing.assert_array_equal(np.asarray(viewed), np.asarray(copied))


def test_evaluate_places_its_own_results_without_copy_and_inputs_with_one():
    x = np.arange(16, dtype=np.float32).reshape(8, 2)
    out = refsim.evaluate(jax.make_jaxpr(lambda a: (a * 2, a, a.reshape(2, 8)))(x), [x],
                          out_layouts=[NamedSharding(MESH, P("x"))] * 2 + [NamedSharding(MESH, P())])
    doubled, same, reshaped = out
    np.testing.assert_array_equal(np.asarray(doubled), x * 2)
    np.testing.assert_array_equal(np.asarray(same), x)
    np.testing.assert_array_equal(np.asarray(reshaped), x.reshape(2, 8))
    # an output that is (a view of) an input is copied: mutating the input later leaves it as it was
    assert not any(np.shares_memory(s.data, x) for a in (same, reshaped) for s in a.shards)
    x[:] = -1
    np.testing.assert_array_equal(np.asarray(same), np.arange(16, dtype=np.float32).reshape(8, 2))
    assert not doubled.shards[0].data.flags.writeable


def test_evaluate_places_a_view_of_an_assembled_input_without_copy():
    """An input Array held apart is assembled into a buffer of refsim's own: a reshape or
    transpose of it is placed as views of that buffer (no copy), and equals the naive value."""
    value = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    arr = _apart(value, P("x"))
    out = refsim.evaluate(jax.make_jaxpr(lambda a: (a.reshape(8, 4, 4), a.T))(value), [arr],
                          out_layouts=[NamedSharding(MESH, P("x")), NamedSharding(MESH, P(None, "y"))])
    np.testing.assert_array_equal(np.asarray(out[0]), value.reshape(8, 4, 4))
    np.testing.assert_array_equal(np.asarray(out[1]), value.T)
    assert np.shares_memory(out[0].shards[0].data, out[1].shards[0].data)   # both views of one global
    assert not any(np.shares_memory(o.shards[0].data, s.data) for o in out for s in arr.shards)


def test_np_array_of_a_replicated_array_is_a_writable_copy():
    value = np.arange(6, dtype=np.int32).reshape(2, 3)
    arr = _apart(value, P())
    got = np.array(arr)                                                     # copy=True: its own memory
    assert got.flags.writeable and not np.shares_memory(got, arr.shards[0].data)
    got[0, 0] = 99
    np.testing.assert_array_equal(np.asarray(arr), value)
