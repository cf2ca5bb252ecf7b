"""xla_backend entry points on the 8 CPU devices; expected values are hand computed."""
import jax
import jaxlib
import numpy as np
import pytest

import xla_backend
from refsim import NamedSharding, P
from refsim.array import Array


def _by_pos(mesh, arr):
    return {m_pos: arr.shard(int(d)).data for m_pos, d in np.ndenumerate(mesh.device_ids)}


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("order", ["default", "reversed", ("random", 7)])
def test_shard_map_psum_per_device(order, eager):
    mesh = xla_backend.mesh((2, 4), ("x", "y"), order=order)
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    out = xla_backend.shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh, in_specs=P("x", "y"),
                                out_specs=P(None, "y"), eager=eager)(x)
    assert isinstance(out, Array) and out.shape == (2, 4)
    # device (i, j) holds rows 2i..2i+1, column j; psum over x adds rows k and k+2.
    for (i, j), data in _by_pos(mesh, out).items():
        assert data.tolist() == [[x[0, j] + x[2, j]], [x[1, j] + x[3, j]]]
    np.testing.assert_array_equal(np.asarray(out), x[:2] + x[2:])
    assert out.info["mode"] == ("eager_shard_map" if eager else "jit_shard_map")


def test_shard_map_pytree_specs_and_outputs():
    mesh = xla_backend.mesh((8,), ("i",), order="reversed")
    a = np.arange(8, dtype=np.int32)
    b = np.ones((8, 2), np.int32)

    def f(args):
        u, v = args
        return {"sum": jax.lax.psum(u, "i"), "idx": v * jax.lax.axis_index("i")}

    out = xla_backend.shard_map(f, mesh=mesh, in_specs=((P("i"), P("i", None)),),
                                out_specs={"sum": P(), "idx": P("i", None)})((a, b))
    assert set(out) == {"sum", "idx"}
    for s in out["sum"].shards:
        assert s.data.tolist() == [28]
    # mesh position k holds device 7-k; axis_index is the position, not the id.
    for k, d in enumerate(mesh.device_ids.tolist()):
        assert out["idx"].shard(d).data.tolist() == [[k, k]]


def test_ppermute_and_all_to_all_on_permuted_mesh():
    mesh = xla_backend.mesh((4,), ("x",), order=[6, 1, 3, 0])
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    shift = xla_backend.shard_map(lambda a: jax.lax.ppermute(a, "x", [(0, 1), (1, 2), (2, 3)]),
                                  mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x)
    expect = {6: np.zeros((1, 4)), 1: x[0:1], 3: x[1:2], 0: x[2:3]}  # position 0 receives nothing: zeros
    for d, want in expect.items():
        np.testing.assert_array_equal(shift.shard(d).data, want)
    a2a = xla_backend.shard_map(lambda a: jax.lax.all_to_all(a, "x", 1, 0, tiled=True),
                                mesh=mesh, in_specs=P("x", None), out_specs=P(None, "x"))(x)
    for k, d in enumerate([6, 1, 3, 0]):
        np.testing.assert_array_equal(a2a.shard(d).data, x[:, k:k + 1])


def test_refsim_array_input_keeps_its_layout():
    mesh = xla_backend.mesh((2, 4), ("x", "y"))
    stacked = np.arange(8, dtype=np.float32).reshape(2, 4, 1)
    arr = Array.from_stacked(stacked, mesh, P("y"))  # global (4,), replicated over x
    out = xla_backend.shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh, in_specs=P("y"),
                                out_specs=P("y"))(arr)
    for (i, j), data in _by_pos(mesh, out).items():
        assert data.tolist() == [j + (4 + j)]


def test_compile_cache_reuses_executable():
    mesh = xla_backend.mesh((8,), ("i",))
    f = lambda a: jax.lax.pmax(a, "i")
    run = xla_backend.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P())
    xla_backend.clear_cache()
    xla_backend.reset_stats()
    r1 = run(np.arange(8, dtype=np.int32))
    r2 = run(np.arange(8, 16, dtype=np.int32))
    r3 = xla_backend.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P())(np.zeros(8, np.int32))
    st = xla_backend.stats()
    assert (st["compiles"], st["cache_hits"], st["runs"]) == (1, 2, 3)
    assert st["compile_seconds"] > 0 and st["run_seconds"] > 0
    assert [r1.info["cache_hit"], r2.info["cache_hit"], r3.info["cache_hit"]] == [False, True, True]
    assert r2.shards[0].data.tolist() == [15]
    run(np.arange(16, dtype=np.int32))  # new aval: compiles again
    assert xla_backend.stats()["compiles"] == 2


def test_provenance_and_hlo():
    mesh = xla_backend.mesh((8,), ("i",))
    out = xla_backend.shard_map(lambda a: jax.lax.psum(a, "i"), mesh=mesh, in_specs=P("i"),
                                out_specs=P(), hlo=True)(np.ones(8, np.float32))
    info = out.info
    assert info["backend"] == "xla" and info["jax_version"] == jax.__version__
    assert info["jaxlib_version"] == jaxlib.__version__
    assert info["platform"] == "cpu" and info["device_kinds"] == ("cpu",)
    assert info["process_count"] == 1 and info["device_count"] == 8
    assert "all-reduce" in info["hlo"] and "HloModule" in info["hlo"]
    with pytest.raises(ValueError, match="hlo=True needs a compiled executable"):
        xla_backend.shard_map(lambda a: a, mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                              eager=True, hlo=True)(np.ones(8, np.float32))


def test_pmap_psum_and_devices():
    out = xla_backend.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(np.arange(8.0))
    assert out.shape == (8,) and out.dtype == np.float32
    assert all(s.data.tolist() in ([28.0], 28.0) for s in out.shards)
    out = xla_backend.pmap(lambda v: v * 10, axis_name="i", devices=[5, 2, 7])(np.arange(3, dtype=np.int32))
    assert sorted(s.device_id for s in out.shards) == [2, 5, 7]
    for k, d in enumerate([5, 2, 7]):
        assert np.ravel(out.shard(d).data).tolist() == [10 * k]


def test_jit_with_shardings_and_constraint():
    mesh = xla_backend.mesh((2, 4), ("x", "y"), order="transposed")
    s_in = NamedSharding(mesh, P("x", "y"))
    s_out = NamedSharding(mesh, P("y", None))

    def g(a):
        b = jax.lax.with_sharding_constraint(a * 2, jax.sharding.PartitionSpec(None, "x"))
        return b + 1

    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    out = xla_backend.jit(g, in_shardings=s_in, out_shardings=s_out)(x)
    assert out.sharding == s_out
    for d, idx in s_out.devices_indices_map(x.shape).items():
        np.testing.assert_array_equal(out.shard(d).data, (x * 2 + 1)[idx])


def test_device_put_reshards_onto_permuted_mesh():
    m1 = xla_backend.mesh((8,), ("i",))
    m2 = xla_backend.mesh((2, 4), ("a", "b"), order=("random", 11))
    x = np.arange(64, dtype=np.int32).reshape(8, 8)
    src = xla_backend.device_put(x, NamedSharding(m1, P("i")))
    dst = xla_backend.device_put(src, NamedSharding(m2, P("b", "a")))
    assert dst.sharding == NamedSharding(m2, P("b", "a"))
    for pos, d in np.ndenumerate(m2.device_ids):
        a, b = pos
        np.testing.assert_array_equal(dst.shard(int(d)).data, x[2 * b:2 * b + 2, 4 * a:4 * a + 4])


def _plain_jax_error(f, jmesh, in_spec, out_spec, x):
    try:
        jax.jit(jax.shard_map(f, mesh=jmesh, in_specs=in_spec, out_specs=out_spec))(x)
    except Exception as e:
        return type(e)
    raise AssertionError("plain JAX accepted the program")


def test_bad_programs_raise_jax_errors():
    mesh = xla_backend.mesh((2, 4), ("x", "y"))
    JP = jax.sharding.PartitionSpec
    # unbound axis name: whatever plain JAX raises (AssertionError in jax 0.10.2), we raise too
    bad = lambda a: jax.lax.psum(a, "z")
    want = _plain_jax_error(bad, xla_backend.jax_mesh(mesh), JP("x"), JP(), np.ones(4, np.float32))
    with pytest.raises(want):
        xla_backend.shard_map(bad, mesh=mesh, in_specs=P("x"), out_specs=P())(np.ones(4, np.float32))
    with pytest.raises(ValueError):
        xla_backend.shard_map(lambda a: a, mesh=mesh, in_specs=P("y"), out_specs=P("y"))(
            np.ones(6, np.float32))  # 6 is not divisible by 4
    with pytest.raises(TypeError, match="mesh must be a refsim.Mesh"):
        xla_backend.shard_map(lambda a: a, mesh=xla_backend.jax_mesh(mesh), in_specs=P(), out_specs=P())
    with pytest.raises(ValueError, match="in_specs=.*is not a pytree prefix"):
        xla_backend.shard_map(lambda a, b: a, mesh=mesh, in_specs=(P(), P(), P()), out_specs=P())(
            np.ones(2), np.ones(2))
