"""Part 5: one trace, many meshes — a program traced once runs on every device order."""
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding as JNS, PartitionSpec as JP

import refsim
import xla_backend
from refsim import Mesh, NamedSharding, P
from refsim.interpreter import trace_cache

ORDERS = ["default", "reversed", "transposed", ("random", 1), ("random", 2)]
X = np.arange(32.0, dtype=np.float32).reshape(8, 4)


@pytest.fixture(autouse=True)
def fresh_cache():
    trace_cache.clear()
    yield
    trace_cache.clear()


def _per_device(arr):
    return {s.device_id: (s.index, np.asarray(s.data)) for s in arr.shards}


def _same(a, b):
    pa, pb = _per_device(a), _per_device(b)
    return pa.keys() == pb.keys() and all(
        pa[d][0] == pb[d][0] and np.array_equal(pa[d][1], pb[d][1]) for d in pa)


def test_shard_map_traced_once_over_five_device_orders_and_equal_to_xla():
    traces = []

    def body(a):
        traces.append(1)  # runs only while JAX traces
        return jax.lax.psum(a, "x") + jax.lax.axis_index("y").astype(a.dtype)

    for order in ORDERS:
        mesh = xla_backend.mesh((2, 4), ("x", "y"), order)
        ours = refsim.shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=P(None, "y"))(X)
        theirs = xla_backend.shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=P(None, "y"))(X)
        assert _same(ours, theirs), order
    info = trace_cache.cache_info()
    assert (info["misses"], info["hits"]) == (1, len(ORDERS) - 1)
    refsim_traces = len(traces) - len(ORDERS)  # xla_backend traces once per mesh, as jax.jit does
    assert refsim_traces == 1


def test_other_shapes_types_and_meshes_trace_again():
    f = lambda a: a * 2  # noqa: E731
    run = lambda mesh, x: refsim.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x)  # noqa: E731
    run(Mesh((2, 4), ("x", "y")), X)
    run(Mesh((2, 4), ("x", "y"), device_ids=np.arange(8)[::-1].reshape(2, 4)), X)  # reuse
    run(Mesh((4, 2), ("x", "y")), X)                                             # other sizes
    run(Mesh((2, 4), ("x", "z")), X)                                             # other names
    run(Mesh((2, 4), ("x", "y")), X.astype(np.int32))                            # other dtype
    assert trace_cache.cache_info()["misses"] == 4 and trace_cache.cache_info()["hits"] == 1


def test_disabled_traces_every_call():
    f = lambda a: a + 1  # noqa: E731
    with trace_cache.disabled():
        for _ in range(3):
            refsim.shard_map(f, mesh=Mesh((8,), ("x",)), in_specs=P("x"), out_specs=P("x"))(X)
    assert trace_cache.cache_info()["misses"] == 0


def test_jit_with_shardings_reuses_the_trace_across_meshes():
    traces = []

    def g(a):
        traces.append(1)
        return jax.lax.with_sharding_constraint(a * 3, JP("y", None))

    for order in ORDERS[:3]:
        mesh = xla_backend.mesh((2, 4), ("x", "y"), order)
        with jax.set_mesh(xla_backend.jax_mesh(mesh)):
            out = refsim.jit(g, in_shardings=NamedSharding(mesh, P("x")),
                             out_shardings=NamedSharding(mesh, P("x")))(X)
            jout = jax.jit(g, in_shardings=JNS(xla_backend.jax_mesh(mesh), JP("x")),
                           out_shardings=JNS(xla_backend.jax_mesh(mesh), JP("x")))(X)
        assert _same(out, xla_backend.to_refsim(jout))
    assert trace_cache.cache_info()["misses"] == 1  # one refsim trace for three meshes


def test_shard_map_over_the_context_abstract_mesh_inside_a_program():
    def prog(a):  # the mesh is whatever abstract mesh the caller traces under
        am = jax.sharding.get_abstract_mesh()
        return jax.shard_map(lambda b: jax.lax.psum(b, "y"), mesh=am, in_specs=JP("x", "y"),
                             out_specs=JP("x", None))(a)

    for order in ORDERS[:3]:
        mesh = xla_backend.mesh((2, 4), ("x", "y"), order)
        with jax.set_mesh(xla_backend.jax_mesh(mesh)):
            ours = refsim.jit(prog, out_shardings=NamedSharding(mesh, P("x")))(X)
            theirs = jax.jit(prog, out_shardings=JNS(xla_backend.jax_mesh(mesh), JP("x")))(X)
        assert _same(ours, xla_backend.to_refsim(theirs))
    assert trace_cache.cache_info()["misses"] == 1
    # traced under use_abstract_mesh alone (no devices in the context), placed by out_shardings
    auto = (jax.sharding.AxisType.Auto,) * 2  # jax 0.12 makes AbstractMesh axes Explicit by default
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((2, 4), ("x", "y"), axis_types=auto)):
        for order in ORDERS[3:]:
            mesh = xla_backend.mesh((2, 4), ("x", "y"), order)
            out = refsim.jit(prog, out_shardings=NamedSharding(mesh, P("x")))(X)
            assert np.array_equal(np.asarray(out), X.sum(1, keepdims=True))  # psum over y of columns
    assert trace_cache.cache_info()["misses"] == 2  # one more context, one more trace


def test_unhashable_callables_are_traced_each_time():
    class F:
        __hash__ = None

        def __call__(self, a):
            return a - 1

    out = refsim.shard_map(F(), mesh=Mesh((8,), ("x",)), in_specs=P("x"), out_specs=P("x"))(X)
    assert np.array_equal(np.asarray(out), X - 1)
    assert trace_cache.cache_info()["uncacheable"] == 1
