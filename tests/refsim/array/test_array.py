"""refsim.Array, Shard, device_put, make_array_from_* and the stacked form, against JAX on 8 CPU devices."""
import math

import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax.sharding import NamedSharding as JNS, PartitionSpec as JP

import refsim
from refsim import Array, Mesh, NamedSharding, P, ReplicationError, Shard
from refsim.layouts import PmapSharding, SingleDeviceSharding

MESH_SHAPES = [(8,), (2, 4), (4, 2), (1, 8), (2, 2, 2), (2, 1, 4), (1, 2, 1)]


@st.composite
def layouts(draw, max_devices=8):
    """(refsim mesh, spec, global shape): 1-3 mesh axes, permuted device ids, any valid spec."""
    shape = draw(st.sampled_from([s for s in MESH_SHAPES if math.prod(s) <= max_devices]))
    names = ("x", "y", "z")[:len(shape)]
    ids = np.array(draw(st.permutations(range(math.prod(shape))))).reshape(shape)
    mesh = Mesh(shape, names, device_ids=ids)
    ndim = draw(st.integers(1, 3))
    free = list(names)
    entries = []
    for _ in range(draw(st.integers(0, ndim))):
        k = draw(st.integers(0, min(2, len(free))))
        picked = draw(st.permutations(free))[:k]
        for a in picked:
            free.remove(a)
        entries.append(None if not picked else picked[0] if len(picked) == 1 else tuple(picked))
    spec = P(*entries)
    counts = NamedSharding(mesh, spec).num_shards(ndim)
    gshape = tuple(c * draw(st.integers(1, 3)) for c in counts)
    return mesh, spec, gshape


def jax_sharding(mesh, spec):
    devs = np.array(jax.devices())[mesh.device_ids]
    return JNS(jax.sharding.Mesh(devs, mesh.axis_names), JP(*spec))


def assert_same_shards(ours, theirs):
    """Device by device: same index, same data, same replica id."""
    got = {s.device_id: s for s in ours.shards}
    assert len(got) == len(theirs.addressable_shards)
    for t in theirs.addressable_shards:
        s = got[t.device.id]
        assert s.index == t.index, (t.device.id, s.index, t.index)
        np.testing.assert_array_equal(s.data, np.asarray(t.data))
        assert s.replica_id == t.replica_id, (t.device.id, s.replica_id, t.replica_id)


# -- against JAX ------------------------------------------------------------------------

@given(layouts())
def test_device_put_matches_jax(case):
    mesh, spec, shape = case
    x = np.arange(math.prod(shape), dtype=np.int32).reshape(shape)
    ours = refsim.device_put(x, NamedSharding(mesh, spec))
    assert_same_shards(ours, jax.device_put(x, jax_sharding(mesh, spec)))
    assert [s.device_id for s in ours.shards] == mesh.device_ids.ravel().tolist()
    np.testing.assert_array_equal(np.asarray(ours), x)


@given(layouts())
def test_make_array_from_callback_matches_jax(case):
    mesh, spec, shape = case
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    calls_ours, calls_jax = [], []
    ours = refsim.make_array_from_callback(shape, NamedSharding(mesh, spec), lambda i: calls_ours.append(i) or x[i])
    theirs = jax.make_array_from_callback(shape, jax_sharding(mesh, spec), lambda i: calls_jax.append(i) or x[i])
    assert_same_shards(ours, theirs)
    assert len(calls_ours) == len(calls_jax)  # once when fully replicated, else once per device


def test_device_put_accepts_a_jax_sharding_and_other_layouts():
    mesh = Mesh((2, 4), ("x", "y"), device_ids=np.array([[3, 1, 0, 2], [7, 6, 5, 4]]))
    x = np.arange(24.0).reshape(8, 3)
    a = refsim.device_put(x, jax_sharding(mesh, P("y")))
    assert a.sharding == NamedSharding(mesh, P("y"))
    single = refsim.device_put(x, SingleDeviceSharding(6))
    assert [s.device_id for s in single.shards] == [6]
    np.testing.assert_array_equal(np.asarray(single), x)
    pm = refsim.device_put(x, PmapSharding.default((8, 3), 0))
    assert pm.shard(5).index == (5, slice(None)) and pm.shard(5).data.tolist() == [15.0, 16.0, 17.0]
    np.testing.assert_array_equal(np.asarray(pm), x)


def test_reshard_through_device_put():
    mesh = Mesh((2, 4), ("x", "y"))
    x = np.arange(32).reshape(8, 4)
    a = refsim.device_put(x, NamedSharding(mesh, P("x", "y")))
    b = refsim.device_put(a, NamedSharding(mesh, P(None, "x")))
    assert b.shard(5).index == (slice(None), slice(2, 4))
    np.testing.assert_array_equal(b.shard(5).data, x[:, 2:4])


def test_device_put_copies_and_is_read_only():
    x = np.arange(8.0)
    a = refsim.device_put(x, NamedSharding(Mesh((4,), ("x",)), P("x")))
    x[0] = 100.0
    assert a.shard(0).data[0] == 0.0
    with pytest.raises(ValueError):
        a.shard(0).data[0] = 1.0


def test_indivisible_raises_value_error_like_jax():
    mesh = Mesh((2, 4), ("x", "y"))
    with pytest.raises(ValueError):
        jax.device_put(np.zeros(7), jax_sharding(mesh, P("x")))
    with pytest.raises(ValueError, match="array axis 0 is partitioned 2 times"):
        refsim.device_put(np.zeros(7), NamedSharding(mesh, P("x")))


# -- make_array_from_single_device_arrays ------------------------------------------------------

def test_single_device_arrays_in_order_dict_shards_and_jax_arrays():
    mesh = Mesh((2, 2), ("x", "y"), device_ids=np.array([[2, 0], [3, 1]]))
    s = NamedSharding(mesh, P("x", "y"))
    x = np.arange(16).reshape(4, 4)
    dim = s.devices_indices_map(x.shape)
    in_order = refsim.make_array_from_single_device_arrays(x.shape, s, [x[i] for i in dim.values()])
    as_dict = refsim.make_array_from_single_device_arrays(x.shape, s, {d: x[i] for d, i in reversed(dim.items())})
    as_shards = refsim.make_array_from_single_device_arrays(x.shape, s, [Shard(d, i, x[i]) for d, i in dim.items()][::-1])
    jax_arrays = [jax.device_put(x[i], jax.devices()[d]) for d, i in reversed(dim.items())]
    from_jax = refsim.make_array_from_single_device_arrays(x.shape, s, jax_arrays)
    for a in (in_order, as_dict, as_shards, from_jax):
        np.testing.assert_array_equal(np.asarray(a), x)
        assert [sh.device_id for sh in a.shards] == [2, 0, 3, 1]
        np.testing.assert_array_equal(a.shard(0).data, x[0:2, 2:4])


def test_single_device_arrays_errors_match_jax_classes():
    mesh = Mesh((8,), ("x",))
    s = NamedSharding(mesh, P("x"))
    js = jax_sharding(mesh, P("x"))
    blocks = [np.full((2,), i, np.float32) for i in range(8)]
    with pytest.raises(ValueError):
        jax.make_array_from_single_device_arrays((16,), js, [jax.device_put(b, d) for b, d in zip(blocks[:7], jax.devices())])
    with pytest.raises(ValueError, match=r"Expected 8 per-device arrays .* but got 7"):
        refsim.make_array_from_single_device_arrays((16,), s, blocks[:7])
    with pytest.raises(ValueError, match=r"Expected shard shape \(2,\) doesn't match the single device array shape \(3,\)"):
        refsim.make_array_from_single_device_arrays((16,), s, blocks[:7] + [np.zeros(3, np.float32)])
    with pytest.raises(ValueError, match="must have matching dtypes"):
        refsim.make_array_from_single_device_arrays((16,), s, blocks[:7] + [np.zeros(2, np.int32)])
    with pytest.raises(ValueError, match="it must match the dtype"):
        refsim.make_array_from_single_device_arrays((16,), s, blocks, dtype=np.int8)
    with pytest.raises(TypeError, match="must be a list or tuple"):
        refsim.make_array_from_single_device_arrays((16,), s, iter(blocks))
    with pytest.raises(ValueError, match=r"Sharding contains devices \{7\}"):
        refsim.make_array_from_single_device_arrays((16,), s, {d: blocks[d % 8] for d in [0, 1, 2, 3, 4, 5, 6, 9]})


def test_array_constructor_validates_indices():
    s = NamedSharding(Mesh((2,), ("x",)), P("x"))
    good = [Shard(0, (slice(0, 2),), np.zeros(2)), Shard(1, (slice(2, 4),), np.ones(2))]
    a = Array((4,), np.float64, s, good[::-1])
    assert [sh.device_id for sh in a.shards] == [0, 1] and a.info == {"backend": "refsim"}
    assert (a.shape, a.dtype, a.ndim, a.size, len(a)) == ((4,), np.float64, 1, 4, 4)
    with pytest.raises(ValueError, match=r"device 1 has index \(slice\(0, 2, None\),\)"):
        Array((4,), np.float64, s, [good[0], Shard(1, (slice(0, 2),), np.ones(2))])
    with pytest.raises(ValueError, match="holds no shard"):
        a.shard(9)


# -- replicas -------------------------------------------------------------------------------

def test_replication_error_names_devices_and_first_index():
    mesh = Mesh((2, 4), ("x", "y"), device_ids=np.array([[3, 1, 0, 2], [7, 6, 5, 4]]))
    x = np.arange(24.0).reshape(8, 3)
    stacked = refsim.device_put(x, NamedSharding(mesh, P("y"))).to_stacked(mesh).copy()
    stacked[1, 2, 0, 1] = 99.0  # device 5, a replica (along 'x') of device 0's block rows 4:6
    stacked[1, 3, 1, 2] = -1.0  # a later difference must not be the one reported
    arr = Array.from_stacked(stacked, mesh, P("y"))
    with pytest.raises(ReplicationError, match=r"devices 0 and 5 .* first at global index \(4, 1\): device 0 has 13.0, device 5 has 99.0") as e:
        np.asarray(arr)
    assert e.value.devices == (0, 5) and e.value.index == (4, 1)


def test_replication_error_for_pmap_replicas():
    ps = PmapSharding(np.array([[0, 1], [2, 3]]), refsim.layouts.pmap_sharding_spec(4, 2, (3,), 0))
    shards = [Shard(d, i, np.full(3, float(d >= 2)) if d != 3 else np.array([1.0, 1.0, 7.0]))
              for d, i in ps.devices_indices_map((2, 3)).items()]
    arr = Array((2, 3), np.float64, ps, shards)
    with pytest.raises(ReplicationError, match=r"devices 2 and 3 .* global index \(1, 2\)"):
        np.asarray(arr)


def test_nan_replicas_agree():
    mesh = Mesh((2,), ("x",))
    arr = Array.from_stacked(np.array([[np.nan, 1.0], [np.nan, 1.0]]), mesh, P())
    np.testing.assert_array_equal(np.asarray(arr), [np.nan, 1.0])


# -- stacked form -------------------------------------------------------------------------------

@st.composite
def stacked_cases(draw):
    mesh, spec, shape = draw(layouts())
    counts = NamedSharding(mesh, spec).num_shards(len(shape))
    local = tuple(n // c for n, c in zip(shape, counts))
    used = set(spec.used_axes())
    # invariant (size 1) along unused axes (replicas agree); sometimes along used ones too
    lead = tuple(1 if a not in used or draw(st.booleans()) else s
                 for a, s in zip(mesh.axis_names, mesh.axis_sizes))
    stacked = np.array(draw(st.lists(st.integers(-50, 50), min_size=math.prod(lead + local),
                                     max_size=math.prod(lead + local)))).reshape(lead + local)
    return mesh, spec, shape, stacked


def naive_global(stacked_full, mesh, spec, shape):
    """Place each device's block at its devices_indices_map index."""
    out = np.empty(shape, stacked_full.dtype)
    dim = NamedSharding(mesh, spec).devices_indices_map(shape)
    for pos in np.ndindex(*mesh.axis_sizes):
        out[dim[int(mesh.device_ids[pos])]] = stacked_full[pos]
    return out


@given(stacked_cases())
def test_from_stacked_to_stacked_round_trip(case):
    mesh, spec, shape, stacked = case
    arr = Array.from_stacked(stacked, mesh, spec)
    assert arr.shape == shape
    full = np.broadcast_to(stacked, mesh.axis_sizes + stacked.shape[mesh.ndim:])
    back = arr.to_stacked(mesh)
    np.testing.assert_array_equal(back, full)
    for pos in np.ndindex(*mesh.axis_sizes):
        shard = arr.shard(int(mesh.device_ids[pos]))
        assert np.shares_memory(shard.data, stacked) or stacked.size == 0  # views, no copy
        np.testing.assert_array_equal(shard.data, full[pos])
    g = np.asarray(arr)
    np.testing.assert_array_equal(g, naive_global(full, mesh, spec, shape))
    np.testing.assert_array_equal(refsim.device_put(g, NamedSharding(mesh, spec)).to_stacked(mesh), full)


@given(stacked_cases(), st.randoms())
def test_to_stacked_on_another_arrangement_of_the_devices(case, rnd):
    mesh, spec, shape, stacked = case
    arr = Array.from_stacked(stacked, mesh, spec)
    ids = mesh.device_ids.ravel().tolist()
    rnd.shuffle(ids)
    other = Mesh((mesh.size,), ("d",), device_ids=np.array(ids))
    got = arr.to_stacked(other)
    for k, d in enumerate(ids):
        np.testing.assert_array_equal(got[k], arr.shard(d).data)


def test_from_stacked_errors():
    mesh = Mesh((2, 4), ("x", "y"))
    with pytest.raises(ValueError, match=r"must match the mesh axis sizes \(2, 4\)"):
        Array.from_stacked(np.zeros((2, 3, 5)), mesh, P())
    with pytest.raises(ValueError, match="UNCONSTRAINED"):
        Array.from_stacked(np.zeros((2, 4, 5)), mesh, P(P.UNCONSTRAINED))
    with pytest.raises(ValueError, match="have rank 1"):
        Array.from_stacked(np.zeros((2, 4, 5)), mesh, P("x", "y"))
    with pytest.raises(ValueError, match="not found in mesh"):  # as JAX's NamedSharding
        Array.from_stacked(np.zeros((2, 4, 5)), mesh, P("q"))
    with pytest.raises(ValueError, match="exactly this Array's devices"):
        Array.from_stacked(np.zeros((2, 4, 5)), mesh, P()).to_stacked(Mesh((8,), ("d",), device_ids=np.arange(1, 9)))


def test_asarray_dtype_and_copy():
    arr = refsim.device_put(np.arange(4, dtype=np.int32), SingleDeviceSharding(0))
    assert np.asarray(arr, dtype=np.float32).dtype == np.float32


def test_make_array_from_callback_takes_a_spec_longer_by_trailing_nones_as_jax_does():
    # jax.make_array_from_callback((8,), NamedSharding(mesh, P('i', None)), cb) and lax.full(...,
    # sharding=) built on it place an 8-vector as P('i') would (device_put and jit reject that spec)
    mesh = Mesh((4, 2), ("i", "j"))
    x = np.arange(8.0, dtype=np.float32)
    a = refsim.make_array_from_callback((8,), NamedSharding(mesh, P("i", None, None)), lambda idx: x[idx])
    assert a.sharding.spec == P("i")
    got = {s.device_id: np.asarray(s.data).tolist() for s in a.shards}
    # mesh (4, 2) over ids 0..7: device 2r + c holds block r of 2 elements (by hand)
    assert got == {d: [2.0 * (d // 2), 2.0 * (d // 2) + 1] for d in range(8)}
    with pytest.raises(ValueError, match="only valid for values of rank at least 2"):
        refsim.make_array_from_callback((8,), NamedSharding(mesh, P(None, "i")), lambda idx: x[idx])
    with pytest.raises(ValueError, match="only valid for values of rank at least 2"):
        refsim.device_put(x, NamedSharding(mesh, P("i", None)))       # as jax.device_put: an error
