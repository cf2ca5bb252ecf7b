"""Meta-tests of meshes / partition_specs / sharded_shapes / arrays: only valid draws, every option reached."""
import itertools

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.cases import device_order, mesh_id
from conformance.strategies import arrays, meshes, partition_specs, sharded_shapes
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import UNCONSTRAINED, PartitionSpec

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")

DEVICES = {d.id: d for d in jax.devices()}
FAST = settings(max_examples=2000, database=None, phases=(Phase.generate,))  # find() without the shrink phase


def jax_mesh(m: Mesh):
    devs = np.array([DEVICES[int(i)] for i in m.device_ids.ravel()], dtype=object).reshape(m.axis_sizes)
    return jax.sharding.Mesh(devs, m.axis_names)


def norm(idx, shape):
    return tuple(s.indices(n) for s, n in zip(idx, shape))


# -- meshes ---------------------------------------------------------------------------------
@given(meshes())
def test_meshes_are_valid_jax_meshes(m):
    ids = m.device_ids.ravel()
    assert 1 <= m.ndim <= 4 and m.size <= 8 and len(set(ids.tolist())) == ids.size and ids.max() < 8
    jm = jax_mesh(m)
    assert Mesh.from_jax(jm) == Mesh(m.axis_sizes, m.axis_names, device_ids=m.device_ids)
    assert mesh_id(m).startswith("x".join(map(str, m.axis_sizes)) + ":" + device_order(m))


@pytest.mark.parametrize("order", ["default", "reversed", "transposed", "random"])
def test_meshes_reach_every_device_order(order):
    m = find(meshes(device_orders=(order,)),
             lambda m: m.ndim >= 2 and min(m.axis_sizes) >= 2 and device_order(m) == order)
    assert device_order(m) == order


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8])
def test_meshes_reach_every_size(size):
    assert size in find(meshes(), lambda m: size in m.axis_sizes).axis_sizes


@pytest.mark.parametrize("ndim", [1, 2, 3, 4])
def test_meshes_reach_every_rank(ndim):
    assert find(meshes(), lambda m: m.ndim == ndim).ndim == ndim


def test_meshes_shrink_to_the_smallest():
    m = find(meshes(), lambda m: True)
    assert (m.axis_sizes, device_order(m)) == ((1,), "default")


def test_meshes_respect_options():
    m = find(meshes(min_axes=3, max_axes=3, sizes=(2,), max_devices=8, device_orders=("reversed",)), lambda m: True)
    assert m.axis_sizes == (2, 2, 2) and m.device_ids.ravel().tolist() == list(range(8))[::-1]


@pytest.mark.parametrize("kwargs, message", [
    (dict(min_axes=0), "min_axes=0 must be at least 1"),
    (dict(min_axes=3, max_axes=2), "min_axes=3 must not exceed max_axes=2"),
    (dict(device_orders=("sideways",)), "device_orders contains 'sideways'"),
    (dict(sizes=(2,), min_axes=4, max_devices=8), "smallest size in sizes=(2,) on min_axes=4 axes needs 16"),
    (dict(axis_names=("a", "b")), "has 2 names but max_axes=4"),
    (dict(max_devices=0), "max_devices=0 must be at least 1"),
])
def test_meshes_validate_arguments(kwargs, message):
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
        meshes(**kwargs).example()


# -- partition_specs and sharded_shapes --------------------------------------------------------
@given(st.data())
def test_specs_and_shapes_agree_with_jax_named_sharding(data):
    m = data.draw(meshes())
    ndim = data.draw(st.integers(0, 3))
    spec = data.draw(partition_specs(m, ndim))
    shape = data.draw(sharded_shapes(m, spec, ndim=ndim))
    ours = NamedSharding(m, spec)
    theirs = jax.sharding.NamedSharding(jax_mesh(m), spec.to_jax())
    assert ours.shard_shape(shape) == theirs.shard_shape(shape)
    a, b = ours.devices_indices_map(shape), theirs.devices_indices_map(shape)
    assert {d: norm(i, shape) for d, i in a.items()} == {d.id: norm(i, shape) for d, i in b.items()}


def _tuples(spec):
    return [e for e in spec if isinstance(e, tuple)]


MESH = Mesh((2, 2, 2), ("x", "y", "z"))
NAMES = MESH.axis_names


@pytest.mark.parametrize("what, pred", [
    ("None", lambda s: None in s),
    ("single axis", lambda s: any(isinstance(e, str) for e in s)),
    ("tuple in mesh order", lambda s: any(list(t) == sorted(t, key=NAMES.index) for t in _tuples(s))),
    ("tuple out of mesh order", lambda s: any(list(t) != sorted(t, key=NAMES.index) for t in _tuples(s))),
    ("dims out of mesh order", lambda s: [a for a in s.used_axes()] == ["y", "x"]),
    ("short spec", lambda s: len(s) < 3),
    ("every axis", lambda s: set(s.used_axes()) == set(NAMES)),
])
def test_partition_specs_reach(what, pred):
    assert pred(find(partition_specs(MESH, 3), pred))


def test_partition_specs_options_restrict():
    @given(partition_specs(MESH, 3, allow_tuples=False, allow_unordered=False, allow_short=False,
                           required_axes=("z",), excluded_axes=("x",)))
    @settings(max_examples=60)
    def check(s):
        assert len(s) == 3 and not _tuples(s) and "z" in s.used_axes() and "x" not in s.used_axes()

    check()
    s = find(partition_specs(MESH, 2, allow_unconstrained=True), lambda s: UNCONSTRAINED in s)
    assert UNCONSTRAINED in s
    assert find(partition_specs(MESH, 3), lambda s: True).used_axes() == ()


@pytest.mark.parametrize("call, message", [
    (lambda: partition_specs("mesh", 2), "mesh='mesh' must be a refsim Mesh"),
    (lambda: partition_specs(MESH, -1), "ndim=-1 must be at least 0"),
    (lambda: partition_specs(MESH, 2, required_axes=("q",)), "names 'q', which is not an axis"),
    (lambda: partition_specs(MESH, 1, allow_tuples=False, required_axes=("x", "y")), "needs 2 dimensions"),
    (lambda: partition_specs(MESH, 2, required_axes="x", excluded_axes="x"), "overlap"),
    (lambda: sharded_shapes(MESH, PartitionSpec("x"), min_local_side=3, max_local_side=2), "must not exceed"),
])
def test_spec_strategies_validate_arguments(call, message):
    with pytest.raises(InvalidArgument, match=message):
        call().example()


def test_sharded_shapes_multiples():
    shape = find(sharded_shapes(MESH, PartitionSpec(("x", "y"), None), multiples={1: 3}), lambda s: True)
    assert shape == (4, 3)


# -- arrays -----------------------------------------------------------------------------------
EXACT_DTYPES = ["float32", "float16", "bfloat16", "int8", "int32", "uint32", "bool", "complex64"]


@pytest.mark.parametrize("dtype", EXACT_DTYPES)
@settings(max_examples=10)
@given(data=st.data())
def test_exact_arrays_sum_exactly_in_any_order(dtype, data):
    """64 terms (8 devices x 8 steps) sum to the same bits forwards, backwards and pairwise."""
    x = data.draw(arrays(dtype, (64,)))
    assert x.dtype.name == dtype and x.shape == (64,)
    if x.dtype.kind in "biu":
        assert np.abs(x.astype(np.int64)).max(initial=0) <= 16
        return
    acc = x.dtype.type
    fwd = functools_reduce(lambda a, b: acc(a + b), x)
    bwd = functools_reduce(lambda a, b: acc(a + b), x[::-1])
    pair = x
    while pair.size > 1:
        pair = (pair[0::2] + pair[1::2]).astype(x.dtype)
    exact = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64).sum()
    assert fwd == bwd == pair[0] == exact


def functools_reduce(f, xs):
    it = iter(xs)
    acc = next(it)
    for v in it:
        acc = f(acc, v)
    return acc


def test_random_arrays_are_not_exact_friendly():
    x = find(arrays("float32", (8,), mode="random"),
             lambda x: np.float32(sum(np.float32(v) for v in x)) != np.float32(x.astype(np.float64).sum()),
             settings=FAST)
    assert x.dtype == np.float32
    y = find(arrays("float32", (4,), mode="random", allow_nan=True), lambda x: np.isnan(x).any(), settings=FAST)
    assert np.isnan(y).any()


def test_arrays_accept_strategies_and_validate():
    x = find(arrays(st.sampled_from(["int8", "float16"]), st.just((2, 3))), lambda x: x.dtype == np.float16,
             settings=FAST)
    assert x.shape == (2, 3)
    with pytest.raises(InvalidArgument, match="mode='fuzzy' must be one of"):
        arrays("float32", (2,), mode="fuzzy").example()
    with pytest.raises(InvalidArgument, match="need mode='random'"):
        arrays("float32", (2,), allow_nan=True).example()
    with pytest.raises(InvalidArgument, match="shape=\\(-1,\\) must be"):
        arrays("float32", (-1,)).example()
