"""Entry points: results per device, replication checks, JAX's error classes, fallback, eval_jaxpr."""
from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive

import refsim
from refsim import Mesh, NamedSharding, P, SingleDeviceSharding

JP = jax.sharding.PartitionSpec

MESH = Mesh((2, 4), ("x", "y"))
A = np.arange(32, dtype=np.float32).reshape(4, 8)


def jax_mesh(shape=(2, 4), names=("x", "y")):
    devs = np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape)
    return jax.sharding.Mesh(devs, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


# --- values and placement -------------------------------------------------------------------------

def test_shard_map_psum_per_device_blocks_by_hand():
    out = refsim.shard_map(lambda a: lax.psum(a, "x"), mesh=MESH, in_specs=P("x", "y"), out_specs=P(None, "y"))(A)
    assert out.shape == (2, 8) and out.sharding == NamedSharding(MESH, P(None, "y"))
    expect = A[:2] + A[2:]
    for s in out.shards:
        x_pos, y_pos = divmod(s.device_id, 4)
        np.testing.assert_array_equal(s.data, expect[:, 2 * y_pos:2 * y_pos + 2])
    assert out.info["backend"] == "refsim" and out.info["independent"] is True


def test_shard_map_respects_custom_device_order():
    ids = np.array([[3, 1, 0, 2], [7, 6, 5, 4]])
    mesh = Mesh((2, 4), ("x", "y"), device_ids=ids)
    out = refsim.shard_map(lambda a: a + 100 * lax.axis_index("y"), mesh=mesh, in_specs=P("x", "y"),
                           out_specs=P("x", "y"))(A)
    blk = out.shard(0).data  # device 0 sits at mesh position (0, 2)
    np.testing.assert_array_equal(blk, A[0:2, 4:6] + 200)


def test_array_input_keeps_each_devices_own_replica():
    # Replicas that disagree reach the body unchanged: device (x, y) holds 10*x + y.
    stacked = (10 * np.arange(2)[:, None] + np.arange(4)[None, :]).astype(np.float32).reshape(2, 4, 1)
    arr = refsim.Array.from_stacked(stacked, MESH, P())
    out = refsim.shard_map(lambda a: lax.psum(a, ("x", "y")), mesh=MESH, in_specs=P(), out_specs=P(),
                           check_vma=False)(arr)
    np.testing.assert_array_equal(np.asarray(out), [(0 + 1 + 2 + 3) * 2 + 10 * 4])


def test_pmap_axes_and_devices():
    out = refsim.pmap(lambda x, b: x * b + lax.axis_index("i"), axis_name="i", in_axes=(1, None),
                      devices=[5, 6, 7, 4])(np.ones((3, 4), np.float32), np.float32(2))
    assert out.shape == (4, 3)
    np.testing.assert_array_equal(np.asarray(out), np.array([[2.0] * 3, [3.0] * 3, [4.0] * 3, [5.0] * 3]))
    np.testing.assert_array_equal(out.shard(4).data, [[5.0, 5.0, 5.0]])  # device 4 is mapped index 3


def test_pmap_rejects_inconsistent_mapped_sizes():
    with pytest.raises(ValueError, match="inconsistent sizes"):
        refsim.pmap(lambda a, b: a + b, axis_name="i")(np.ones(4), np.ones(2))


def test_jit_placement_from_out_shardings_avals_and_default():
    s = NamedSharding(MESH, P("x"))
    out = refsim.jit(lambda a: a * 2, in_shardings=s, out_shardings=NamedSharding(MESH, P(None, "y")))(A)
    assert out.sharding.spec == P(None, "y")
    np.testing.assert_array_equal(np.asarray(out), A * 2)
    emesh = Mesh((2, 4), ("x", "y"), axis_types=(refsim.AxisType.Explicit,) * 2)
    out = refsim.jit(lambda a: jax.sharding.reshard(a + 1, JP(None, "x")),
                     in_shardings=NamedSharding(emesh, P("x", "y")))(A)
    assert out.sharding.spec == P(None, "x")  # from the explicit-sharding aval
    assert refsim.jit(lambda a: a + 1)(np.ones(3, np.float32)).sharding == SingleDeviceSharding(0)


# --- replication --------------------------------------------------------------------------------

def _unreplicated(strict=False):
    return refsim.shard_map(lambda a: a * lax.axis_index("x"), mesh=MESH, in_specs=P(None, "y"),
                            out_specs=P(None, "y"), check_vma=False, strict=strict)


def test_unchecked_replication_is_recorded_and_kept_per_device():
    out = _unreplicated()(A)
    assert "replicated over mesh axis 'x'" in out.info["replication"][0]
    np.testing.assert_array_equal(out.shard(0).data, 0 * A[:, :2])
    np.testing.assert_array_equal(out.shard(4).data, 1 * A[:, :2])
    with pytest.raises(refsim.ReplicationError):
        np.asarray(out)


def test_strict_replication_error_names_axis_devices_and_index():
    with pytest.raises(refsim.ReplicationError) as e:
        _unreplicated(strict=True)(A)
    msg = str(e.value)
    assert "mesh axis 'x'" in msg and "device 0" in msg and "device 4" in msg
    assert "first at local index (0, 1)" in msg  # A[0, 0] == 0, so element (0, 1) differs first


def test_pmap_out_axes_none_is_checked():
    with pytest.raises(refsim.ReplicationError, match="mesh axis 'i'"):
        refsim.pmap(lambda x: x, axis_name="i", out_axes=None, strict=True)(np.arange(4.0))
    ok = refsim.pmap(lambda x: lax.psum(x, "i"), axis_name="i", out_axes=None)(np.arange(4.0))
    np.testing.assert_array_equal(np.asarray(ok), 6.0)


# --- bad programs raise JAX's exception classes ------------------------------------------------------

def _jax_error(f, in_specs, out_specs, x):
    try:
        jax.jit(jax.shard_map(f, mesh=jax_mesh(), in_specs=in_specs, out_specs=out_specs))(x)
    except Exception as e:  # noqa: BLE001 - the class is what we compare
        return type(e)
    return None


# jax 0.10/0.12 raise AssertionError (not NameError) for psum over an unbound axis *inside*
# shard_map (core.pvary asserts); refsim lets JAX trace, so it raises what JAX raises.
@pytest.mark.parametrize("f,in_specs,out_specs,shape,cls", [
    (lambda a: lax.psum(a, "z"), JP("x"), JP("x"), (4, 8), (NameError, AssertionError)),   # unbound axis
    (lambda a: a * lax.axis_index("z"), JP("x"), JP("x"), (4, 8), (NameError,)),          # unbound axis
    (lambda a: a.sum(), JP("x"), JP("x"), (4, 8), (ValueError,)),                         # out_specs > rank
    (lambda a: a, JP("y"), JP("y"), (6, 8), (ValueError,)),                                # 6 rows / 4 devices
])
def test_bad_programs_raise_jax_exception_class(f, in_specs, out_specs, shape, cls):
    x = np.zeros(shape, np.float32)
    jax_cls = _jax_error(f, in_specs, out_specs, x)
    assert jax_cls in cls
    with pytest.raises(jax_cls):
        refsim.shard_map(f, mesh=MESH, in_specs=in_specs, out_specs=out_specs)(x)


def test_unbound_axis_message_names_axis():
    with pytest.raises(NameError, match="unbound axis name: z"):
        refsim.jit(lambda a: lax.psum(a, "z"))(A)


def test_nested_pmap_raises_jax_own_error():
    inner = lambda x: jax.pmap(lambda v: lax.psum(v, "j"), axis_name="j")(x)  # noqa: E731
    try:
        jax.pmap(inner, axis_name="i")(np.ones((2, 2), np.float32))
        jax_cls = None
    except Exception as e:  # noqa: BLE001
        jax_cls = type(e)
    if jax_cls is None:
        pytest.skip("this JAX can trace nested pmap")
    with pytest.raises(jax_cls):
        refsim.pmap(inner, axis_name="i")(np.ones((2, 2), np.float32))


def test_abstract_mesh_is_rejected_with_fix():
    with pytest.raises(TypeError, match="pass a refsim.Mesh"):
        refsim.shard_map(lambda a: a, mesh=refsim.AbstractMesh((2,), ("x",)), in_specs=P(), out_specs=P())


# --- fallback ----------------------------------------------------------------------------------------

_triple = Primitive("refsim_test_triple")
_triple.def_impl(lambda x: x * 3)
_triple.def_abstract_eval(lambda x: x)


def test_unknown_primitive_raises_unless_fallback():
    f = lambda a: _triple.bind(a) + lax.axis_index("y")  # noqa: E731
    with pytest.raises(refsim.UnsupportedPrimitive, match="refsim_test_triple"):
        refsim.shard_map(f, mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y"), check_vma=False)(A)
    out = refsim.shard_map(f, mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y"), check_vma=False,
                           fallback=True)(A)
    np.testing.assert_array_equal(np.asarray(out), A * 3 + np.repeat(np.arange(4), 2)[None, :])
    assert out.info["independent"] is False and out.info["fallback"] == {"refsim_test_triple": 1}


# --- eval_jaxpr ---------------------------------------------------------------------------------------

def test_eval_jaxpr_global_and_manual_with_probe():
    closed = jax.make_jaxpr(lambda a: jnp.sin(a) * 0 + a * 2)(np.ones(3, np.float32))
    np.testing.assert_array_equal(refsim.eval_jaxpr(closed, np.arange(3, dtype=np.float32))[0], [0, 2, 4])
    sm = jax.make_jaxpr(jax.shard_map(lambda a: lax.psum(a, "x") * 2, mesh=MESH.abstract_mesh.to_jax(),
                                      in_specs=JP("x"), out_specs=JP()))(np.ones((2, 3), np.float32))
    body = jax.extend.core.ClosedJaxpr(sm.jaxpr.eqns[0].params["jaxpr"], ())
    seen = []
    stacked = np.array([[1, 2, 3], [10, 20, 30]], np.float32).reshape(2, 1, 1, 3)
    (out,) = refsim.eval_jaxpr(body, stacked, mesh=MESH, probe=lambda e, i, o: seen.append(e.primitive.name))
    np.testing.assert_array_equal(out.reshape(-1, 3)[0], [22, 44, 66])
    assert seen == ["psum_invariant", "mul"] or seen[0].startswith("psum")
    with pytest.raises(ValueError, match="must start with the mesh dims"):
        refsim.eval_jaxpr(body, np.ones((3, 1, 1, 3), np.float32), mesh=MESH)
