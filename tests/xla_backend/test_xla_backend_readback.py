"""xla_backend.convert.to_refsim reads every device's shard back; a layout read before reuses
its checked plan, but never for another sharding, device order or shape. Expected values are
hand computed (device at mesh position p holds the block its spec gives p)."""
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding as JNamed
from jax.sharding import PartitionSpec as JP

import xla_backend
from refsim.errors import ReplicationError
from xla_backend import convert


def _jax_mesh(order):
    return xla_backend.jax_mesh(xla_backend.mesh((8,), ("i",), order=order))


def test_same_layout_read_twice_gives_each_device_its_block():
    jsh = JNamed(_jax_mesh("default"), JP("i"))
    for start in (0, 100):
        x = np.arange(start, start + 16, dtype=np.int32)
        arr = convert.to_refsim(jax.device_put(x, jsh))
        assert [(s.device_id, s.index, s.data.tolist()) for s in arr.shards] == \
            [(k, (slice(2 * k, 2 * k + 2),), [start + 2 * k, start + 2 * k + 1]) for k in range(8)]
        np.testing.assert_array_equal(np.asarray(arr), x)


def test_another_device_order_is_not_served_the_first_plan():
    x = np.arange(8, dtype=np.int32)
    default = convert.to_refsim(jax.device_put(x, JNamed(_jax_mesh("default"), JP("i"))))
    rev = convert.to_refsim(jax.device_put(x, JNamed(_jax_mesh("reversed"), JP("i"))))
    # same devices, same block shape; reversed: position k is device 7 - k, holding element k
    assert {s.device_id: (s.index, s.data.tolist()) for s in default.shards} == \
        {k: ((slice(k, k + 1),), [k]) for k in range(8)}
    assert {s.device_id: (s.index, s.data.tolist()) for s in rev.shards} == \
        {7 - k: ((slice(k, k + 1),), [k]) for k in range(8)}
    np.testing.assert_array_equal(np.asarray(rev), x)


def test_another_spec_or_shape_is_not_served_the_first_plan():
    jm = xla_backend.jax_mesh(xla_backend.mesh((2, 4), ("x", "y")))
    x = np.arange(8, dtype=np.float32)
    for spec, shape, block in [(JP("x"), (8,), 4), (JP("y"), (8,), 2), (JP("x"), (16,), 8), (JP(), (8,), 8)]:
        v = np.arange(np.prod(shape), dtype=np.float32)
        arr = convert.to_refsim(jax.device_put(v, JNamed(jm, spec)))
        assert arr.shape == shape
        for (i, j), d in np.ndenumerate(np.arange(8).reshape(2, 4)):
            k = {"x": i, "y": j}.get(spec[0] if len(spec) else None, 0)
            assert arr.shard(int(d)).data.tolist() == v[k * block:(k + 1) * block].tolist(), (spec, shape, d)
        np.testing.assert_array_equal(np.asarray(arr), v)
    assert x.dtype == np.float32


def test_a_changed_dtype_of_the_same_layout_reads_its_own_dtype():
    jsh = JNamed(_jax_mesh("default"), JP("i"))
    a = convert.to_refsim(jax.device_put(np.arange(8, dtype=np.int32), jsh))
    b = convert.to_refsim(jax.device_put(np.arange(8, dtype=np.float32) / 2, jsh))
    assert a.dtype == np.int32 and b.dtype == np.float32
    assert b.shard(3).data.tolist() == [1.5]


@pytest.mark.parametrize("reads", [1, 2, 3])
def test_replicas_that_differ_are_caught_on_every_read(reads):
    # P('x') on a 2x4 mesh: the 4 devices of each row hold one block; give device 5 other data
    jm = xla_backend.jax_mesh(xla_backend.mesh((2, 4), ("x", "y")))
    jsh = JNamed(jm, JP("x"))
    devs = {d.id: d for d in jm.devices.flat}
    for _ in range(reads):
        bufs = []
        for s in jsh.addressable_devices_indices_map((4,)).items():
            d, idx = s
            block = np.arange(4, dtype=np.int32)[idx].copy()
            if d.id == 5:
                block[1] += 10
            bufs.append(jax.device_put(block, devs[d.id]))
        arr = convert.to_refsim(jax.make_array_from_single_device_arrays((4,), jsh, bufs))
        assert arr.shard(5).data.tolist() == [2, 13] and arr.shard(4).data.tolist() == [2, 3]
        with pytest.raises(ReplicationError, match="devices 4 and 5"):
            np.asarray(arr)
