"""Part 6: sharding-in-types (Explicit axes) — refsim follows the avals' shardings as JAX does."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding as JNS, PartitionSpec as JP

import refsim
import xla_backend
from refsim import NamedSharding, P

E, A = AxisType.Explicit, AxisType.Auto
A8 = np.arange(32.0, dtype=np.float32).reshape(8, 4)
B4 = np.arange(16.0, dtype=np.float32).reshape(4, 4)


def _mesh(types=(E, E), order="reversed"):
    return xla_backend.mesh((2, 4), ("x", "y"), order, axis_types=types)


def _specs(outs):
    return [refsim.PartitionSpec.from_jax(o.sharding.spec) if hasattr(o.sharding.spec, "partitions")
            else o.sharding.spec for o in outs]


def _run_both(f, mesh, *args_specs):
    jm = xla_backend.jax_mesh(mesh)
    with jax.set_mesh(jm):
        jargs = [jax.device_put(x, JP(*s)) for x, s in args_specs]
        jout = jax.jit(f)(*jargs)
    rargs = [refsim.device_put(x, NamedSharding(mesh, P(*s))) for x, s in args_specs]
    rout = refsim.jit(f)(*rargs)
    return jax.tree_util.tree_leaves(jout), jax.tree_util.tree_leaves(rout)


def _same_layout(j, r):
    assert r.sharding.mesh == refsim.Mesh.from_jax(j.sharding.mesh)
    assert r.sharding.spec == refsim.PartitionSpec.from_jax(j.sharding.spec), (r.sharding, j.sharding)
    ours = {s.device_id: (s.index, s.data) for s in r.shards}
    for s in j.addressable_shards:
        idx, data = ours[s.device.id]
        assert idx == s.index and np.array_equal(data, np.asarray(s.data))


def test_types_propagate_through_dot_and_reshard():
    def f(a, b):
        c = a @ b                                  # f32[8@x,4@y]
        return c, jax.sharding.reshard(c, JP(None, "y")), jnp.sum(c, axis=0)

    jouts, routs = _run_both(f, _mesh(), (A8, ("x", None)), (B4, (None, "y")))
    assert [str(jax.typeof(o)) for o in jouts] == ["float32[8@x,4@y]", "float32[8,4@y]", "float32[4@y]"]
    for j, r in zip(jouts, routs):
        _same_layout(j, r)


def test_auto_axes_and_explicit_axes():
    def f(a):
        d = jax.sharding.auto_axes(lambda t: t * 2, out_sharding=JP("x", None))(a)
        return d, d + 1

    jouts, routs = _run_both(f, _mesh(), (A8, (None, "y")))
    for j, r in zip(jouts, routs):
        _same_layout(j, r)

    def g(a):
        return jax.sharding.explicit_axes(lambda t: t * 3, in_sharding=JP("x", None))(a)

    auto_mesh = _mesh((A, A))
    jm = xla_backend.jax_mesh(auto_mesh)
    with jax.set_mesh(jm):
        j = jax.jit(g)(A8)
        r = refsim.jit(g)(A8)  # the mesh comes from jax.set_mesh, as jax.jit reads it
    assert np.array_equal(np.asarray(r), np.asarray(j)) and np.array_equal(np.asarray(r), 3 * A8)
    assert r.sharding.mesh == refsim.Mesh.from_jax(jm)


def test_context_mesh_alone_gives_refsim_the_mesh():
    mesh = _mesh()
    jm = xla_backend.jax_mesh(mesh)

    def f(a):
        return jax.sharding.reshard(a * 2, JP("y", "x"))

    with jax.set_mesh(jm):
        j = jax.jit(f)(A8)
        r = refsim.jit(f)(A8)
    _same_layout(j, r)
    assert r.sharding.spec == P("y", "x")


def test_explicit_type_errors_come_from_jax_tracing():
    # sharding-in-types rejects a dot whose contracting dims are sharded differently; refsim traces
    # with JAX, so the same error class reaches the caller.
    def f(a, b):
        return a @ b

    mesh = _mesh()
    with jax.set_mesh(xla_backend.jax_mesh(mesh)):
        ja = jax.device_put(A8, JP(None, "x"))
        jb = jax.device_put(B4, JP("y", None))
        with pytest.raises(Exception) as jerr:
            jax.jit(f)(ja, jb)
    with pytest.raises(type(jerr.value)):
        refsim.jit(f)(refsim.device_put(A8, NamedSharding(mesh, P(None, "x"))),
                      refsim.device_put(B4, NamedSharding(mesh, P("y", None))))
