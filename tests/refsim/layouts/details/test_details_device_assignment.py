"""Part 3: one computation, one device assignment — refsim, xla_backend and JAX raise alike."""
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding as JNS, PartitionSpec as JP

import refsim
from refsim import compat
import xla_backend
from refsim import Mesh, NamedSharding, P
from refsim.device_assignment import DeviceAssignmentError

DEVS = np.array(jax.devices()[:8])
M_LO = Mesh((4,), ("x",), device_ids=np.array([0, 1, 2, 3]))
M_HI = Mesh((4,), ("x",), device_ids=np.array([4, 5, 6, 7]))
M_REV = Mesh((4,), ("x",), device_ids=np.array([3, 2, 1, 0]))
X = np.arange(8.0, dtype=np.float32)
PREFIX = "Received incompatible devices for jitted computation. Got "


def f(x, y):
    return x + y


def _jax(mesh):
    return jax.sharding.Mesh(DEVS[np.asarray(mesh.device_ids)], mesh.axis_names)


def _on(mesh, kind="refsim"):
    if kind == "refsim":
        return refsim.device_put(X, NamedSharding(mesh, P("x")))
    return jax.device_put(X, JNS(_jax(mesh), JP("x")))


@pytest.mark.parametrize("other", [M_HI, M_REV], ids=["other devices", "same devices other order"])
def test_arguments_on_different_assignments(other):
    if compat.jax_version() < (0, 10):
        pytest.skip("jax 0.9 words it 'with shape float32[8] and device ids ...' (no 'with'); refsim follows jax >= 0.10")
    with pytest.raises(ValueError) as jerr:
        jax.jit(f)(_on(M_LO, "jax"), _on(other, "jax"))
    with pytest.raises(DeviceAssignmentError) as ours:
        refsim.jit(f)(_on(M_LO), _on(other))
    ids = other.device_ids.tolist()
    common = (f"{PREFIX}argument x of f with shape float32[8] and with device ids [0, 1, 2, 3]"
              f" on platform CPU and argument y of f with shape float32[8] and with device ids {ids}")
    assert str(jerr.value).startswith(common)
    assert str(ours.value).startswith(common.replace(" on platform CPU", ""))
    assert "refsim.device_put(y, sharding)" in str(ours.value)
    assert isinstance(ours.value, ValueError)


def test_argument_against_out_shardings():
    with pytest.raises(ValueError, match="explicit output sharding with device ids \\[4, 5, 6, 7\\]"):
        jax.jit(f, out_shardings=JNS(_jax(M_HI), JP("x")))(_on(M_LO, "jax"), _on(M_LO, "jax"))
    with pytest.raises(DeviceAssignmentError, match=r"argument x of f .* and explicit output sharding with "
                                                    r"device ids \[4, 5, 6, 7\]"):
        refsim.jit(f, out_shardings=NamedSharding(M_HI, P("x")))(_on(M_LO), _on(M_LO))


def test_in_shardings_move_a_committed_argument_as_jax():
    # JAX lets an explicit in_sharding win over a committed argument's own placement.
    jout = jax.jit(f, in_shardings=JNS(_jax(M_HI), JP("x")))(_on(M_LO, "jax"), _on(M_LO, "jax"))
    out = refsim.jit(f, in_shardings=NamedSharding(M_HI, P("x")))(_on(M_LO), _on(M_LO))
    assert sorted(d.id for d in jout.sharding.device_set) == sorted(out.sharding.device_set) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match=PREFIX):
        jax.jit(f, in_shardings=(JNS(_jax(M_LO), JP("x")), JNS(_jax(M_HI), JP("x"))))(X, X)
    with pytest.raises(DeviceAssignmentError, match="explicit input sharding of argument y with device ids"):
        refsim.jit(f, in_shardings=(NamedSharding(M_LO, P("x")), NamedSharding(M_HI, P("x"))))(X, X)


def test_numpy_arguments_are_uncommitted():
    assert np.array_equal(np.asarray(refsim.jit(f)(_on(M_LO), X)), 2 * X)
    assert np.array_equal(np.asarray(jax.jit(f)(_on(M_LO, "jax"), X)), 2 * X)


def test_context_mesh_against_argument():
    with jax.set_mesh(_jax(M_HI)):
        with pytest.raises(ValueError, match="jit's context mesh with device ids \\[4, 5, 6, 7\\]"):
            jax.jit(lambda x: x * 2)(_on(M_LO, "jax"))
        with pytest.raises(DeviceAssignmentError, match="jit's context mesh with device ids \\[4, 5, 6, 7\\]"):
            refsim.jit(lambda x: x * 2)(_on(M_LO))


def test_sharding_constraint_inside_names_other_devices():
    def g(x):
        return jax.lax.with_sharding_constraint(x, JNS(_jax(M_HI), JP("x")))

    with pytest.raises(ValueError, match="sharding_constraint inside jit with device ids \\[4, 5, 6, 7\\]"):
        jax.jit(g)(_on(M_LO, "jax"))
    with pytest.raises(DeviceAssignmentError, match="sharding_constraint inside jit with device ids \\[4, 5, 6, 7\\]"):
        refsim.jit(g)(_on(M_LO))


def _double(x):
    return x * 2


def test_shard_map_over_a_mesh_of_other_devices_on_all_three():
    smap = jax.shard_map(_double, mesh=_jax(M_HI), in_specs=JP("x"), out_specs=JP("x"))
    with pytest.raises(ValueError, match="shard_map inside jit with device ids \\[4, 5, 6, 7\\]"):
        jax.jit(smap)(_on(M_LO, "jax"))
    msg = (r"argument x of _double with shape float32\[8\] and with device ids \[0, 1, 2, 3\] and "
           r"shard_map inside jit with device ids \[4, 5, 6, 7\]")
    with pytest.raises(DeviceAssignmentError, match=msg):
        refsim.shard_map(_double, mesh=M_HI, in_specs=P("x"), out_specs=P("x"))(_on(M_LO))
    with pytest.raises(DeviceAssignmentError, match=msg):
        xla_backend.shard_map(_double, mesh=M_HI, in_specs=P("x"), out_specs=P("x"))(_on(M_LO))
    # the same devices in the same order is fine, with any spec (a reshard)
    out = refsim.shard_map(_double, mesh=M_LO, in_specs=P(), out_specs=P())(_on(M_LO))
    assert np.array_equal(np.asarray(out), 2 * X)


def test_pytree_arguments_are_named_by_path():
    with pytest.raises(DeviceAssignmentError, match=r"argument t\['b'\] of .*<locals>\.h with shape"):
        def h(t):
            return t["a"] + t["b"]
        refsim.jit(h)({"a": _on(M_LO), "b": _on(M_HI)})
