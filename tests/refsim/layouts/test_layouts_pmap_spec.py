"""The pmap layout family: ShardingSpec / spec_to_indices / PmapSharding / SingleDeviceSharding.

Expected values are hand-computed from the statement of the semantics in docs/arrays.md, a
naive implementation written here (enumerate shards, broadcast the replicas,
transpose the mesh), or JAX's own placement of jax.pmap results.
"""
import itertools
import math

import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st

from refsim import IndivisibleError
from refsim.layouts import (
    Chunked, NoSharding, PmapSharding, Replicated, ShardedAxis, ShardingSpec, SingleDeviceSharding, Unstacked,
    pmap_sharding_spec, spec_to_indices,
)

S = slice(None)


# -- hand-computed cases ----------------------------------------------------------

def test_unstacked_one_device_per_row():
    spec = ShardingSpec([Unstacked(4), NoSharding()], [ShardedAxis(0)])
    assert spec.mesh_shape == (4,)
    assert spec_to_indices((4, 3), spec) == ((0, S), (1, S), (2, S), (3, S))


def test_replication_is_an_inner_mesh_dimension():
    # JAX's sharding_specs comment: [1,2,3,4] cut 4 ways, replicated twice: [1,1],[2,2],[3,3],[4,4]
    spec = ShardingSpec([Unstacked(4)], [ShardedAxis(0), Replicated(2)])
    assert spec_to_indices((4,), spec) == ((0,), (0,), (1,), (1,), (2,), (2,), (3,), (3,))


def test_replicated_outer_dimension():
    spec = ShardingSpec([Chunked([2])], [Replicated(2), ShardedAxis(0)])
    assert spec_to_indices((4,), spec) == ((slice(0, 2),), (slice(2, 4),), (slice(0, 2),), (slice(2, 4),))


def test_chunk_factors_major_to_minor_with_permuted_mesh():
    # mesh dim 0 enumerates factor 1 (minor), mesh dim 1 factor 0 (major): device (m0, m1) -> block 2*m1 + m0
    spec = ShardingSpec([Chunked([2, 2]), NoSharding()], [ShardedAxis(1), ShardedAxis(0)])
    assert spec.mesh_shape == (2, 2)
    assert spec_to_indices((8, 3), spec) == (
        (slice(0, 2), S), (slice(4, 6), S), (slice(2, 4), S), (slice(6, 8), S))


def test_two_unstacked_dimensions_transposed():
    spec = ShardingSpec([Unstacked(2), Unstacked(3)], [ShardedAxis(1), ShardedAxis(0)])
    assert spec.mesh_shape == (3, 2)
    assert spec_to_indices((2, 3), spec) == ((0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2))


def test_single_chunk_reads_like_jax_on_both_routes():
    no_unstacked = ShardingSpec([Chunked([1]), NoSharding()], [ShardedAxis(0)])
    assert spec_to_indices((5, 2), no_unstacked) == ((S, S),)
    with_unstacked = ShardingSpec([Unstacked(2), Chunked([1])], [ShardedAxis(0), ShardedAxis(1)])
    assert spec_to_indices((2, 5), with_unstacked) == ((0, slice(0, 5)), (1, slice(0, 5)))


def test_pmap_sharding_spec_shapes():
    assert pmap_sharding_spec(4, 4, (3,), 0) == ShardingSpec([Unstacked(4), NoSharding()], [ShardedAxis(0)])
    assert pmap_sharding_spec(8, 4, (3,), 1) == ShardingSpec(
        [NoSharding(), Unstacked(4)], [ShardedAxis(0), Replicated(2)])
    assert pmap_sharding_spec(4, 4, (3, 2), None) == ShardingSpec([NoSharding()] * 2, [Replicated(4)])
    assert spec_to_indices((3, 4), pmap_sharding_spec(8, 4, (3,), 1))[:4] == ((S, 0), (S, 0), (S, 1), (S, 1))


# -- against a naive implementation ----------------------------------------------------

def naive_indices(shape, sharding, mesh_mapping):
    """Enumerate shards in row-major order of the sharded axes, broadcast replicas, transpose to the mesh."""
    per_dim, axes_shape = [], []
    has_unstacked = any(isinstance(s, Unstacked) for s in sharding)
    for n, s in zip(shape, sharding):
        if isinstance(s, NoSharding):
            per_dim.append([S])
        elif isinstance(s, Unstacked):
            per_dim.append(list(range(n)))
            axes_shape.append(n)
        else:
            k = math.prod(s.chunks)
            b = n // k
            per_dim.append([slice(i * b, (i + 1) * b) if (k > 1 or has_unstacked) else S for i in range(k)])
            axes_shape.extend(s.chunks)
    shards = list(itertools.product(*per_dim))
    # index of each shard by its sharded-axis coordinates
    grid = {}
    for coords, idx in zip(itertools.product(*[range(a) for a in axes_shape]), shards):
        grid[coords] = idx
    mesh_shape = [axes_shape[m.axis] if isinstance(m, ShardedAxis) else m.replicas for m in mesh_mapping]
    out = []
    for pos in itertools.product(*[range(m) for m in mesh_shape]):
        coords = [0] * len(axes_shape)
        for p, m in zip(pos, mesh_mapping):
            if isinstance(m, ShardedAxis):
                coords[m.axis] = p
        out.append(grid[tuple(coords)])
    return tuple(out)


@st.composite
def sharding_specs(draw):
    ndim = draw(st.integers(0, 3))
    sharding, shape, factors = [], [], []
    for _ in range(ndim):
        kind = draw(st.sampled_from(["none", "chunked", "unstacked"]))
        if kind == "none":
            sharding.append(NoSharding())
            shape.append(draw(st.integers(1, 4)))
        elif kind == "unstacked":
            n = draw(st.integers(1, 3))
            sharding.append(Unstacked(n))
            shape.append(n)
            factors.append(n)
        else:
            chunks = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))
            sharding.append(Chunked(chunks))
            shape.append(math.prod(chunks) * draw(st.integers(1, 2)))
            factors.extend(chunks)
    mapping = [ShardedAxis(k) for k in draw(st.permutations(range(len(factors))))]
    for _ in range(draw(st.integers(0, 2))):
        mapping.insert(draw(st.integers(0, len(mapping))), Replicated(draw(st.integers(1, 3))))
    return tuple(shape), sharding, mapping


@given(sharding_specs())
def test_spec_to_indices_matches_naive(case):
    shape, sharding, mapping = case
    spec = ShardingSpec(sharding, mapping)
    got = spec_to_indices(shape, spec)
    assert got == naive_indices(shape, sharding, mapping)
    assert len(got) == math.prod(spec.mesh_shape)


@given(sharding_specs(), st.randoms())
def test_pmap_sharding_blocks_are_what_indices_select(case, rnd):
    shape, sharding, mapping = case
    spec = ShardingSpec(sharding, mapping)
    ids = list(range(spec.num_devices))
    rnd.shuffle(ids)
    ps = PmapSharding(np.array(ids).reshape(spec.mesh_shape), spec)
    x = np.arange(math.prod(shape)).reshape(shape)
    dim = ps.devices_indices_map(shape)
    assert list(dim) == ids
    for idx in dim.values():
        assert x[idx].shape == ps.shard_shape(shape)


# -- PmapSharding against jax.pmap ----------------------------------------------------------

@pytest.mark.parametrize("n,out_axis,order", [
    (8, 0, list(range(8))), (4, 0, [3, 2, 1, 0]), (4, 1, [7, 5, 3, 1]), (2, 2, [6, 2]),
])
def test_pmap_sharding_matches_jax_pmap_results(n, out_axis, order):
    devices = [jax.devices()[i] for i in order]
    x = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3)
    out = jax.pmap(lambda v: v + 0, out_axes=out_axis, devices=devices)(x)
    ps = PmapSharding.default(out.shape, out_axis, devices)
    assert list(ps.devices_indices_map(out.shape)) == order
    want = np.moveaxis(x, 0, out_axis)
    from refsim import device_put
    ours = device_put(want, ps)
    for shard in out.addressable_shards:
        mine = ours.shard(shard.device.id)
        k = mine.index[out_axis]
        assert shard.index[out_axis] == slice(k, k + 1)  # JAX 0.5+ keeps the mapped dim as size 1
        np.testing.assert_array_equal(np.squeeze(np.asarray(shard.data), out_axis), mine.data)
        assert mine.data.shape == ps.shard_shape(out.shape)


def test_pmap_sharding_default_and_facts():
    ps = PmapSharding.default((4, 3), 0, [3, 2, 1, 0])
    assert ps.devices_indices_map((4, 3)) == {3: (0, S), 2: (1, S), 1: (2, S), 0: (3, S)}
    assert ps.shard_shape((4, 3)) == (3,)
    assert not ps.is_fully_replicated and ps.num_devices == 4 and ps.device_set == {0, 1, 2, 3}
    rep = PmapSharding.default((5,), None, [4, 6])
    assert rep.is_fully_replicated
    assert rep.devices_indices_map((5,)) == {4: (S,), 6: (S,)}
    assert rep.device_replica_id_map((5,)) == {4: 0, 6: 1}
    inner = PmapSharding(np.arange(8).reshape(4, 2), pmap_sharding_spec(8, 4, (3,), 0))
    assert inner.device_replica_id_map((4, 3)) == {0: 0, 1: 1, 2: 0, 3: 1, 4: 0, 5: 1, 6: 0, 7: 1}
    assert ps == PmapSharding.default((4, 3), 0, [3, 2, 1, 0]) and hash(ps) == hash(PmapSharding.default((4, 3), 0, [3, 2, 1, 0]))
    assert ps != PmapSharding.default((4, 3), 0)


def test_pmap_sharding_takes_jax_devices():
    ps = PmapSharding.default((2,), 0, jax.devices()[2:4])
    assert list(ps.devices_indices_map((2,))) == [2, 3]


# -- errors ------------------------------------------------------------------------------

def test_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"exactly once with ShardedAxis"):
        ShardingSpec([Unstacked(2), Chunked([2])], [ShardedAxis(0)])
    with pytest.raises(TypeError, match="NoSharding"):
        ShardingSpec(["x"], [])
    with pytest.raises(ValueError, match=r"Chunked\(chunks=\(0,\)\)"):
        Chunked([0])
    spec = ShardingSpec([Unstacked(4)], [ShardedAxis(0)])
    with pytest.raises(ValueError, match="The sharded dimension must be equal to the number of devices"):
        PmapSharding(np.arange(4), spec).shard_shape((5,))
    with pytest.raises(ValueError, match="has rank 2"):
        spec_to_indices((4, 1), spec)
    with pytest.raises(IndivisibleError, match="cannot cut into 2 equal pieces"):
        spec_to_indices((5,), ShardingSpec([Chunked([2])], [ShardedAxis(0)]))
    with pytest.raises(ValueError, match="got 3 devices"):
        PmapSharding([0, 1, 2], spec)
    with pytest.raises(ValueError, match="not unique"):
        PmapSharding([0, 1, 1, 2], spec)
    with pytest.raises(ValueError, match="One of sharded_dim or devices must be set"):
        PmapSharding.default((4,), None)


# -- SingleDeviceSharding -------------------------------------------------------------------

def test_single_device_sharding_matches_jax():
    dev = jax.devices()[5]
    ours, theirs = SingleDeviceSharding(5), jax.sharding.SingleDeviceSharding(dev)
    for shape in [(), (3,), (2, 4)]:
        assert ours.devices_indices_map(shape) == {d.id: i for d, i in theirs.devices_indices_map(shape).items()}
        assert ours.shard_shape(shape) == theirs.shard_shape(shape)
    assert ours.is_fully_replicated == theirs.is_fully_replicated
    assert ours.num_devices == theirs.num_devices == 1
    assert ours.device_set == {5} and ours.device_replica_id_map((3,)) == {5: 0}
    assert SingleDeviceSharding(dev) == ours
    with pytest.raises(TypeError, match="device_id must be an int"):
        SingleDeviceSharding("cpu:0")
