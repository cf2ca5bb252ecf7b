"""xla_backend.staging on the 8 virtual CPU devices.

Where each shard must land comes from refsim's `devices_indices_map` (NumPy, no JAX) or is
written out by hand; what JAX did is read back from `jax.Array.addressable_shards`.
"""
import jax
import numpy as np
import pytest

import refsim
import xla_backend
from refsim import AbstractMesh, Mesh, NamedSharding, P
from refsim.array import Array, Shard
from xla_backend import staging

PERMUTED = np.array([[3, 1, 0, 2], [7, 6, 5, 4]])


def _norm(index, shape):
    """An index tuple as ((start, stop), ...) with the defaults filled in."""
    return tuple(sl.indices(n)[:2] for sl, n in zip(index, shape))


def _assert_placed_as(arr, sharding, value):
    """Every addressable shard of the jax.Array `arr` is on the device refsim's map names,
    holds that device's index, and the data of `value` there."""
    want = sharding.devices_indices_map(value.shape)
    got = {s.device.id: s for s in arr.addressable_shards}
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for dev, index in want.items():
        s = got[dev]
        assert _norm(s.index, value.shape) == _norm(index, value.shape), (dev, s.index, index)
        np.testing.assert_array_equal(np.asarray(s.data), value[index])


# -- the pytree helpers ------------------------------------------------------------------------------

def test_is_spec_and_is_sharding():
    mesh = Mesh((8,), ("i",))
    assert staging.is_spec(None) and staging.is_spec(P("i")) and staging.is_spec(jax.sharding.PartitionSpec("i"))
    assert not staging.is_spec(("i",)) and not staging.is_spec(NamedSharding(mesh, P("i")))
    assert staging.is_sharding(None) and staging.is_sharding(NamedSharding(mesh, P("i")))
    assert not staging.is_sharding(P("i"))


def test_spec_conversions():
    assert staging.spec_to_jax(P("x", None)) == jax.sharding.PartitionSpec("x", None)
    assert staging.spec_to_jax(None) is None
    assert staging.spec_to_refsim(None) == P()
    assert staging.spec_to_refsim(jax.sharding.PartitionSpec(("x", "y"))) == P(("x", "y"))


def test_broadcast_prefix_hand_computed():
    a, b, c = np.zeros(1), np.zeros(2), np.zeros(3)
    got = staging.broadcast_prefix((P("x"), P()), ((a, b), c), staging.is_spec, "in_specs")
    assert got == [P("x"), P("x"), P()]
    assert staging.broadcast_prefix(P("y"), (a, {"k": b}), staging.is_spec, "in_specs") == [P("y"), P("y")]
    with pytest.raises(ValueError, match=r"in_specs=.* is not a pytree prefix of the 2 positional argument"):
        staging.broadcast_prefix((P("x"), P(), P()), (a, b), staging.is_spec, "in_specs")


# -- placement, entry point by entry point -----------------------------------------------------------

@pytest.mark.parametrize("spec", [P("x", "y"), P("y", None), P(("x", "y")), P(None, "x"), P()])
def test_shard_map_inputs_land_as_refsim_maps_them_on_a_permuted_mesh(spec):
    mesh = Mesh((2, 4), ("x", "y"), device_ids=PERMUTED)
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    staged = staging.stage(lambda a: a, staging.Layout.shard_map(mesh, spec, spec), (x,))
    (placed,) = staged.args
    assert isinstance(placed, jax.Array)
    _assert_placed_as(placed, NamedSharding(mesh, spec), x)


def test_shard_map_placement_hand_computed():
    mesh = Mesh((2, 4), ("x", "y"), device_ids=PERMUTED)
    x = np.arange(32, dtype=np.int32).reshape(8, 4)
    (placed,) = staging.stage(lambda a: a, staging.Layout.shard_map(mesh, P("x", "y"), P("x", "y")), (x,)).args
    got = {s.device.id: np.asarray(s.data) for s in placed.addressable_shards}
    # position (0, 0) is device 3: rows 0..3 of column 0; position (1, 1) is device 6: rows 4..7, column 1
    np.testing.assert_array_equal(got[3], x[0:4, 0:1])
    np.testing.assert_array_equal(got[6], x[4:8, 1:2])
    np.testing.assert_array_equal(got[2], x[0:4, 3:4])


def test_shard_map_pytree_prefix_places_each_leaf():
    mesh = xla_backend.mesh((8,), ("i",), order=("random", 11))
    a = np.arange(8, dtype=np.float32)
    b = np.arange(16, dtype=np.float32).reshape(8, 2)
    c = np.float32(5)
    layout = staging.Layout.shard_map(mesh, ((P("i"), P(None, None)), P()), P())
    staged = staging.stage(lambda ab, c: c, layout, ((a, b), c))
    (pa, pb), pc = staged.args
    _assert_placed_as(pa, NamedSharding(mesh, P("i")), a)
    _assert_placed_as(pb, NamedSharding(mesh, P()), b)
    _assert_placed_as(pc, NamedSharding(mesh, P()), np.asarray(c))
    assert [x.shape for x in staged.flat_args] == [(8,), (8, 2), ()]


def test_shard_map_runs_and_matches_numpy():
    mesh = Mesh((2, 4), ("x", "y"), device_ids=PERMUTED)
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    staged = staging.stage(lambda a: jax.lax.psum(a, "x"), staging.Layout.shard_map(mesh, P("x", "y"), P(None, "y")),
                           (x,))
    with staged.context():
        out = staged.call(*staged.args)
    np.testing.assert_array_equal(np.asarray(out), x[:4] + x[4:])
    # pinned: the output is laid out by NamedSharding(mesh, out_spec), on the mesh's devices
    _assert_placed_as(out, NamedSharding(mesh, P(None, "y")), x[:4] + x[4:])


def test_shard_map_over_a_jax_mesh():
    jmesh = jax.make_mesh((2, 4), ("x", "y"))
    x = np.arange(8, dtype=np.float32)
    staged = staging.stage(lambda a: a * 2, staging.Layout.shard_map(jmesh, P(("x", "y")), P(("x", "y"))), (x,))
    assert staged.jax_mesh is jmesh
    assert staged.device_ids.tolist() == [d.id for d in jmesh.devices.flat]
    _assert_placed_as(staged.args[0], NamedSharding(Mesh.from_jax(jmesh), P(("x", "y"))), x)
    np.testing.assert_array_equal(np.asarray(staged.call(*staged.args)), x * 2)


def test_a_refsim_array_in_its_layout_keeps_each_devices_data():
    mesh = Mesh((2,), ("x",), device_ids=[5, 2])
    sh = NamedSharding(mesh, P())
    # replicas that disagree: the placement must not read a global value
    arr = Array((2,), np.float32, sh, [Shard(5, (slice(0, 2),), np.array([1, 2], np.float32)),
                                       Shard(2, (slice(0, 2),), np.array([7, 8], np.float32))])
    (placed,) = staging.stage(lambda a: a, staging.Layout.shard_map(mesh, P(), P()), (arr,)).args
    got = {s.device.id: np.asarray(s.data).tolist() for s in placed.addressable_shards}
    assert got == {5: [1, 2], 2: [7, 8]}


def test_a_jax_array_already_in_its_layout_is_not_moved():
    mesh = Mesh((4,), ("x",), device_ids=[3, 2, 1, 0])
    layout = staging.Layout.shard_map(mesh, P("x"), P("x"))
    (first,) = staging.stage(lambda a: a, layout, (np.arange(4.0),)).args
    (again,) = staging.stage(lambda a: a, layout, (first,)).args
    assert again is first


def test_jit_inputs_land_by_their_shardings():
    mesh = Mesh((2, 4), ("x", "y"), device_ids=PERMUTED)
    a = np.arange(32, dtype=np.float32).reshape(8, 4)
    b = np.arange(8, dtype=np.int32)
    sa, sb = NamedSharding(mesh, P("y", "x")), NamedSharding(mesh, P(("y", "x")))
    staged = staging.stage(lambda a, b: (a * 2, b + 1), staging.Layout.jit((sa, sb), (sa, sb)), (a, b))
    _assert_placed_as(staged.args[0], sa, a)
    _assert_placed_as(staged.args[1], sb, b)
    assert staged.device_ids.tolist() == PERMUTED.ravel().tolist()   # the one mesh the shardings share
    assert [d.id for d in staged.jax_mesh.devices.flat] == PERMUTED.ravel().tolist()
    with staged.context():
        out_a, out_b = staged.call(*staged.args)
    _assert_placed_as(out_a, sa, a * 2)
    _assert_placed_as(out_b, sb, b + 1)


def test_jit_unsharded_arguments():
    mesh = Mesh((8,), ("i",))
    s = NamedSharding(mesh, P("i"))
    x = np.arange(8, dtype=np.float64)
    put = staging.stage(lambda x, y: x * y, staging.Layout.jit((s, None)), (x, 2.0))
    assert isinstance(put.args[1], jax.Array) and len(put.args[1].devices()) == 1
    assert put.args[0].dtype == jax.dtypes.canonicalize_dtype(np.float64)   # as JAX makes it
    kept = staging.stage(lambda x, y: x * y, staging.Layout.jit((s, None), place_unsharded=False), (x, 2.0))
    assert kept.args[1] == 2.0 and type(kept.args[1]) is float
    nothing = staging.stage(lambda x, y: x * y, staging.Layout.jit(place_unsharded=False), (x, 2.0))
    assert nothing.args[0] is x and nothing.args[1] == 2.0


def test_jit_static_argnums():
    mesh = Mesh((4,), ("x",), device_ids=[2, 3, 0, 1])
    s = NamedSharding(mesh, P("x"))
    x = np.arange(8, dtype=np.float32)
    staged = staging.stage(lambda k, a: a * k, staging.Layout.jit(s, static_argnums=0), (3, x))
    assert staged.args[0] == 3 and len(staged.flat_args) == 1
    _assert_placed_as(staged.args[1], s, x)
    assert len(staged.dynamic_args) == 1 and staged.dynamic_args[0] is staged.args[1]
    np.testing.assert_array_equal(np.asarray(staged.lower().compile()(*staged.dynamic_args)), x * 3)


def test_jit_context_mesh():
    m1 = Mesh((8,), ("i",))
    m2 = Mesh((8,), ("i",), device_ids=list(range(7, -1, -1)))
    one = staging.wrap(lambda a: a, staging.Layout.jit(NamedSharding(m1, P("i"))))
    assert one.jax_mesh is xla_backend.jax_mesh(m1)
    two = staging.wrap(lambda a, b: a, staging.Layout.jit((NamedSharding(m1, P("i")), NamedSharding(m2, P()))))
    assert two.jax_mesh is None
    given = staging.wrap(lambda a: a, staging.Layout.jit(mesh=m2))
    assert given.jax_mesh is xla_backend.jax_mesh(m2)
    with given.context():
        assert jax.sharding.get_abstract_mesh().axis_names == ("i",)


def test_pmap_on_permuted_devices():
    devices = [5, 0, 7, 2]
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    staged = staging.stage(lambda a: a + jax.lax.axis_index("i"), staging.Layout.pmap("i", devices=devices), (x,))
    assert staged.device_ids.tolist() == devices
    assert isinstance(staged.args[0], np.ndarray)
    out = staged.call(*staged.args)
    got = {s.device.id: np.asarray(s.data).reshape(-1).tolist() for s in out.addressable_shards}
    # replica k runs on devices[k] with row k of x, axis_index k
    assert got == {d: (x[k] + k).tolist() for k, d in enumerate(devices)}


def test_pmap_devices_as_jax_devices_and_default_ids():
    devs = jax.devices()
    layout = staging.Layout.pmap("i", devices=[devs[6], devs[1]])
    assert layout.devices == (devs[6].id, devs[1].id)
    staged = staging.stage(lambda a: a, staging.Layout.pmap("i"), (np.zeros((3, 2)),))
    assert staged.device_ids.tolist() == [d.id for d in devs[:3]]
    assert staged.args[0].dtype == jax.dtypes.canonicalize_dtype(np.float64)


# -- device orders -------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", ["default", "reversed", "transposed", ("random", 3)])
def test_device_orders_map_to_jax_devices_by_id(order):
    mesh = xla_backend.mesh((2, 2, 2), ("a", "b", "c"), order=order)
    w = staging.wrap(lambda x: x, staging.Layout.shard_map(mesh, P("a", "b", "c"), P("a", "b", "c")))
    assert [[[d.id for d in r] for r in plane] for plane in w.jax_mesh.devices] == mesh.device_ids.tolist()
    assert w.device_ids.tolist() == mesh.device_ids.ravel().tolist()
    x = np.arange(8 * 6, dtype=np.int32).reshape(2, 4, 6)
    (placed,) = w.place((x,)).args
    _assert_placed_as(placed, NamedSharding(mesh, P("a", "b", "c")), x)


# -- lowering ------------------------------------------------------------------------------------------

def test_lowering_is_lazy_and_kept():
    mesh = Mesh((8,), ("i",))
    traced = []

    def f(a):
        traced.append(1)
        return jax.lax.psum(a, "i")

    staged = staging.stage(f, staging.Layout.shard_map(mesh, P("i"), P()), (np.ones(8, np.float32),))
    assert traced == []
    low = staged.lower()
    assert traced == [1] and staged.lower() is low
    assert "stablehlo.all_reduce" in low.as_text()


def test_a_program_that_fails_to_trace_fails_at_lower_not_at_stage():
    def bad(a):
        raise RuntimeError("boom")

    staged = staging.stage(bad, staging.Layout.jit(), (np.ones(2),))
    with pytest.raises(RuntimeError, match="boom"):
        staged.lower()


def test_entry_kwargs_run_the_refsim_twin():
    mesh = Mesh((2, 4), ("x", "y"), device_ids=PERMUTED)
    x = np.arange(32, dtype=np.float32).reshape(8, 4)

    def f(a):
        return jax.lax.psum(a, "y")

    layout = staging.Layout.shard_map(mesh, P("x", "y"), P("x"), axis_names={"x", "y"})
    ref = refsim.shard_map(f, **layout.entry_kwargs())(x)
    staged = staging.stage(f, layout, (x,))
    with staged.context():
        out = staged.call(*staged.args)
    np.testing.assert_array_equal(np.asarray(ref), x.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
    assert staging.Layout.pmap("i", devices=[1, 0]).entry_kwargs() == {
        "axis_name": "i", "in_axes": 0, "out_axes": 0, "devices": [1, 0]}
    assert staging.Layout.jit().entry_kwargs() == {"in_shardings": None, "out_shardings": None}


# -- errors --------------------------------------------------------------------------------------------

def test_bad_layouts_raise_naming_the_fix():
    with pytest.raises(ValueError, match=r"entry='vmap' is not an entry point.*Layout.shard_map"):
        staging.Layout("vmap")
    with pytest.raises(TypeError, match=r"Layout.shard_map needs a mesh"):
        staging.Layout.shard_map(None, P(), P())
    with pytest.raises(TypeError, match=r"mesh=.*AbstractMesh\) has no devices.*xla_backend.mesh"):
        staging.Layout.shard_map(AbstractMesh((8,), ("i",)), P(), P())
    with pytest.raises(TypeError, match=r"mesh='x' \(str\) has no devices"):
        staging.Layout.jit(mesh="x")
    with pytest.raises(ValueError, match=r"entry='jit'\) got in_specs=.*an option of shard_map.*Layout.shard_map"):
        staging.Layout("jit", in_specs=P("x"))
    with pytest.raises(ValueError, match=r"entry='shard_map'\) got devices=\(0,\), an option of pmap"):
        staging.Layout("shard_map", Mesh((1,), ("i",)), devices=(0,))
    with pytest.raises(ValueError, match=r"entry='pmap'\) got mesh=.*devices="):
        staging.Layout("pmap", Mesh((1,), ("i",)))
    with pytest.raises(TypeError, match=r"devices entry 'gpu0' \(str\) is not a device"):
        staging.Layout.pmap("i", devices=["gpu0"])
    with pytest.raises(TypeError, match=r"layout=.* is not an xla_backend.staging.Layout"):
        staging.wrap(lambda a: a, {"entry": "jit"})


def test_bad_devices_and_specs_raise_when_wrapped_or_placed():
    mesh = Mesh((2,), ("i",), device_ids=[0, 42])
    with pytest.raises(ValueError, match=r"device ids \[42\] are not JAX devices"):
        staging.wrap(lambda a: a, staging.Layout.shard_map(mesh, P("i"), P("i")))
    with pytest.raises(ValueError, match=r"device ids \[42\] are not JAX devices"):
        staging.wrap(lambda a: a, staging.Layout.pmap("i", devices=[42]))
    with pytest.raises(TypeError, match=r"bare PartitionSpec .* refsim.NamedSharding\(mesh, spec\)"):
        staging.wrap(lambda a: a, staging.Layout.jit(P("i")))
    w = staging.wrap(lambda a, b: a, staging.Layout.shard_map(Mesh((8,), ("i",)), (P("i"), P(), P()), P()))
    with pytest.raises(ValueError, match=r"in_specs=.* is not a pytree prefix of the 2 positional argument"):
        w.place((np.zeros(8), np.zeros(8)))


def test_use_mesh_false_stages_without_a_context_mesh():
    mesh = Mesh((8,), ("i",))
    for use_mesh, want in ((True, ("i",)), (False, ())):
        staged = staging.stage(lambda a: a, staging.Layout.shard_map(mesh, P("i"), P("i"), use_mesh=use_mesh,
                                                                     pin_outputs=False), (np.arange(8.0),))
        with staged.context():
            assert jax.sharding.get_abstract_mesh().axis_names == want
            np.testing.assert_array_equal(np.asarray(staged.call(*staged.args)), np.arange(8.0))
