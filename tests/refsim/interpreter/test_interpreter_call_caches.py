"""What a warm call reuses (trace_cache memos, per-jaxpr plans): every input a remembered value
depends on is part of its key, so a call that differs in any of them computes its own result.

Expected values are computed by hand with NumPy.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

import refsim
from refsim import Mesh, NamedSharding, P
from refsim import compat
from refsim import device_assignment as DA
from refsim.interpreter import core, trace_cache
from refsim.interpreter.registry import RULES

MESH = Mesh((2, 4), ("x", "y"))
X = np.arange(32, dtype=np.float32).reshape(8, 4)


@pytest.fixture(autouse=True)
def fresh_cache():
    trace_cache.clear()
    yield
    trace_cache.clear()


# --- pmap: one body function per (f, structure, in_axes, out_axes) ---------------------------------

def test_pmap_traces_once_for_new_data_of_the_same_program():
    f = lambda a: lax.psum(a, "i")  # noqa: E731
    for k in range(3):
        out = refsim.pmap(f, axis_name="i")(X[:4] + k)
        np.testing.assert_array_equal(np.asarray(out), np.broadcast_to((X[:4] + k).sum(0), (4, 4)))
    assert trace_cache.cache_info()["misses"] == 1 and trace_cache.cache_info()["hits"] == 2


def test_pmap_in_axes_out_axes_and_structure_are_part_of_the_body_key():
    f = lambda a: a * 2  # noqa: E731
    a = np.arange(8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_array_equal(np.asarray(refsim.pmap(f, axis_name="i")(a)), a * 2)
    np.testing.assert_array_equal(np.asarray(refsim.pmap(f, axis_name="i", in_axes=1)(a.T)), a * 2)
    np.testing.assert_array_equal(np.asarray(refsim.pmap(f, axis_name="i", out_axes=1)(a)), (a * 2).T)
    g = lambda t: t[0] + t[1]  # noqa: E731
    np.testing.assert_array_equal(np.asarray(refsim.pmap(g, axis_name="i")((a, a))), a + a)
    h = lambda d: d["p"] - d["q"]  # noqa: E731
    np.testing.assert_array_equal(np.asarray(refsim.pmap(h, axis_name="i")({"p": a, "q": 2 * a})), -a)


# --- shard_map / jit: the JAX wrapper, avals and shardings they build --------------------------

def test_shard_map_specs_check_vma_and_axis_names_are_part_of_the_key():
    f = lambda a: a + 1  # noqa: E731
    by_x = refsim.shard_map(f, mesh=MESH, in_specs=P("x"), out_specs=P("x"))(X)
    by_y = refsim.shard_map(f, mesh=MESH, in_specs=P("y"), out_specs=P("y"))(X)
    assert by_x.sharding.spec == P("x") and by_y.sharding.spec == P("y")
    np.testing.assert_array_equal(np.asarray(by_x), X + 1)
    np.testing.assert_array_equal(np.asarray(by_y), X + 1)
    s = lambda a: lax.psum(a, "x")  # noqa: E731
    full = refsim.shard_map(s, mesh=MESH, in_specs=P("x", "y"), out_specs=P(None, "y"))(X)
    np.testing.assert_array_equal(np.asarray(full), X[:4] + X[4:])
    part = refsim.shard_map(s, mesh=MESH, in_specs=P("x"), out_specs=P(), axis_names={"x"})(X)
    np.testing.assert_array_equal(np.asarray(part), X[:4] + X[4:])
    loose = refsim.shard_map(lambda a: a * lax.axis_index("x").astype(a.dtype), mesh=MESH, in_specs=P(),
                             out_specs=P("x"), check_vma=False)(X[:2])
    np.testing.assert_array_equal(np.asarray(loose), np.concatenate([0 * X[:2], X[:2]]))


def test_argument_shape_and_dtype_are_part_of_the_aval_key():
    f = lambda a: a * 3  # noqa: E731
    run = lambda x: refsim.shard_map(f, mesh=MESH, in_specs=P("x"), out_specs=P("x"))(x)  # noqa: E731
    for x in (X, X[:4], X.astype(np.int32), X.astype(np.float64), X.astype(np.int8)):
        out = run(x)
        want = (x * 3).astype(jax.dtypes.canonicalize_dtype(x.dtype))
        assert out.dtype == want.dtype and out.shape == x.shape
        np.testing.assert_array_equal(np.asarray(out), want)
    # float64 is float32 to JAX (x64 off): that one program is traced once for both
    assert trace_cache.cache_info()["misses"] == 4


def test_a_bad_argument_raises_every_call():
    run = refsim.shard_map(lambda a: a, mesh=MESH, in_specs=P(), out_specs=P())
    for _ in range(2):
        with pytest.raises(TypeError, match="not a valid JAX array type"):
            run(np.array(["a", "b"]))


def test_jit_out_shardings_and_mesh_are_part_of_the_sharding_key():
    f = lambda a: a - 1  # noqa: E731
    for mesh in (MESH, Mesh((4, 2), ("x", "y"))):
        for spec in (P("x"), P(None, "y"), P()):
            out = refsim.jit(f, out_shardings=NamedSharding(mesh, spec))(X)
            assert out.sharding == NamedSharding(mesh, spec)
            np.testing.assert_array_equal(np.asarray(out), X - 1)
            nx = mesh.shape["x"] if spec == P("x") else 1
            assert out.shard(0).data.shape == (8 // nx, 4 // (mesh.shape["y"] if spec == P(None, "y") else 1))
    with pytest.raises(TypeError, match="must be refsim.NamedSharding"):
        refsim.jit(f, out_shardings=jax.sharding.PartitionSpec("x"))(X)


# --- device assignment: argument names per (f, structure) ------------------------------------------

def test_argument_names_follow_the_structure_of_each_call():
    def f(a, b):
        return a

    assert DA.arg_names(f, (1, 2)) == ["a", "b"]
    assert DA.arg_names(f, ((1, 2), 3)) == ["a[0]", "a[1]", "b"]
    assert DA.arg_names(f, ({"k": 1}, 3)) == ["a['k']", "b"]

    def g(*xs):
        return xs

    assert DA.arg_names(g, (1, 2)) == ["xs[0]", "xs[1]"]
    assert DA.arg_names(f, (1, 2)) == ["a", "b"]  # f's names again, not g's


def test_device_assignment_error_names_the_argument_of_this_call():
    other = Mesh((2, 4), ("x", "y"), device_ids=np.arange(8)[::-1].reshape(2, 4))
    a = refsim.device_put(X, NamedSharding(MESH, P("x")))
    b = refsim.device_put(X, NamedSharding(other, P("x")))

    def f(p, q):
        return p + q

    with pytest.raises(DA.DeviceAssignmentError, match="argument q of"):
        refsim.jit(f)(a, b)
    with pytest.raises(DA.DeviceAssignmentError, match=r"argument p\[1\] of"):
        refsim.jit(lambda p, q: p[0] + p[1] + q)((a, b), a)


def test_inside_uses_are_read_from_each_program():
    jm = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    with_mesh = jax.make_jaxpr(jax.shard_map(lambda a: a, mesh=jm, in_specs=jax.P("x"), out_specs=jax.P("x")))(X)
    without = jax.make_jaxpr(lambda a: a + 1)(X)
    assert [u.devices for u in DA.inside_uses(with_mesh)] == [tuple(range(8))]
    assert DA.inside_uses(without) == []
    assert [u.devices for u in DA.inside_uses(with_mesh)] == [tuple(range(8))]


# --- the interpreter's per-jaxpr plan ------------------------------------------------------------

def test_a_rule_returning_the_wrong_dtype_or_shape_still_raises(monkeypatch):
    closed = jax.make_jaxpr(lambda a: jax.numpy.sin(a) * 2)(X)
    np.testing.assert_allclose(refsim.eval_jaxpr(closed, X)[0], np.sin(X) * 2, rtol=1e-6)
    good = RULES["sin"]
    monkeypatch.setitem(RULES, "sin", lambda ctx, x, **p: good(ctx, x, **p).astype(np.float64))
    with pytest.raises(AssertionError, match="returned output 0 with shape .* dtype float64"):
        refsim.eval_jaxpr(closed, X)
    monkeypatch.setitem(RULES, "sin", lambda ctx, x, **p: good(ctx, x, **p)[:1])
    with pytest.raises(AssertionError, match=r"returned output 0 with shape \(1, 4\)"):
        refsim.eval_jaxpr(closed, X)
    monkeypatch.setitem(RULES, "sin", good)
    np.testing.assert_allclose(refsim.eval_jaxpr(closed, X)[0], np.sin(X) * 2, rtol=1e-6)


def test_one_jaxpr_runs_in_global_view_and_per_device():
    closed = jax.make_jaxpr(lambda a: a * 2 + 1)(X[:2])
    np.testing.assert_array_equal(refsim.eval_jaxpr(closed, X[:2])[0], X[:2] * 2 + 1)
    stacked = X.reshape(2, 4, 1, 4)[:, :, :, :]  # (mesh 2x4) + local (1, 4): not the traced shape
    with pytest.raises(AssertionError, match="This is a bug in the rule"):
        refsim.eval_jaxpr(closed, stacked, mesh=MESH)
    stacked = np.broadcast_to(X[:2], (2, 4, 2, 4))
    out = refsim.eval_jaxpr(closed, stacked, mesh=MESH)[0]
    assert out.shape == (2, 4, 2, 4)
    np.testing.assert_array_equal(out, np.broadcast_to(X[:2] * 2 + 1, (2, 4, 2, 4)))


def test_probe_sees_every_equation_each_call():
    closed = jax.make_jaxpr(lambda a: (a + 1, a * 2))(X)
    for _ in range(2):
        seen = []
        refsim.eval_jaxpr(closed, X, probe=lambda eqn, i, o: seen.append((eqn.primitive.name, o[0].shape)))
        assert seen == [("add", (8, 4)), ("mul", (8, 4))]


def test_a_variable_nothing_defines_is_a_key_error():
    closed = jax.make_jaxpr(lambda a: a + 1)(X)
    jaxpr = closed.jaxpr
    broken = jaxpr.replace(invars=[])  # `a` read, never bound
    with pytest.raises(KeyError):
        core.eval_jaxpr(broken, (), ctx=core.Context())


# --- compat: abstract meshes of equal arguments ----------------------------------------------------

def test_abstract_meshes_of_equal_arguments_are_one_object_and_differ_otherwise():
    auto, expl = refsim.AxisType.Auto, refsim.AxisType.Explicit
    a = compat.make_abstract_mesh((2, 4), ("x", "y"), (auto, auto))
    assert a is compat.make_abstract_mesh([2, 4], ["x", "y"], [auto, auto])
    b = compat.make_abstract_mesh((2, 4), ("x", "y"), (auto, expl))
    assert b != a and b.axis_types[1] == jax.sharding.AxisType.Explicit
    assert compat.make_abstract_mesh((4, 2), ("x", "y"), (auto, auto)).axis_sizes == (4, 2)
    assert compat.make_abstract_mesh((2, 4), ("x", "z"), (auto, auto)).axis_names == ("x", "z")
    c = compat.context_abstract_mesh((2, 4), ("x", "y"), (auto, auto))
    assert c is compat.context_abstract_mesh((2, 4), ("x", "y"), (auto, auto))
    assert compat.context_abstract_mesh((2, 4), ("x", "y"), (auto, expl)).axis_types == b.axis_types
    assert compat.context_abstract_mesh((4, 2), ("x", "y"), (auto, auto)).axis_sizes == (4, 2)


def test_jit_in_shardings_spec_and_mesh_are_part_of_the_sharding_key():
    # Under an Explicit mesh the traced output type follows in_shardings, and places the result.
    f = lambda a: a * 2  # noqa: E731
    for sizes in ((2, 4), (4, 2)):
        mesh = Mesh(sizes, ("x", "y"), axis_types=(refsim.AxisType.Explicit,) * 2)
        for spec in (P("x"), P(None, "y"), P("y", "x")):
            out = refsim.jit(f, in_shardings=NamedSharding(mesh, spec))(X)
            assert out.sharding.mesh == mesh and out.sharding.spec.padded(2) == spec.padded(2), (sizes, spec)
            np.testing.assert_array_equal(np.asarray(out), X * 2)


def _traces():
    return [closed for closed, _ in trace_cache.CACHE._store.values()]


def test_each_shard_map_trace_carries_the_specs_check_vma_and_axis_names_of_its_call():
    f = lambda a: a  # noqa: E731  one function for every call: only the wrapper's arguments differ
    calls = [(P("x"), P("x"), True, None), (P("y"), P("x"), False, None), (P("x"), P("y"), False, None),
             (P("x"), P("x"), False, None), (P("x"), P("x"), False, {"x"})]
    for ins, outs, vma, names in calls:
        kw = {} if names is None else {"axis_names": names}
        refsim.shard_map(f, mesh=MESH, in_specs=ins, out_specs=outs, check_vma=vma, **kw)(X)
    got = set()
    for closed in _traces():
        p = closed.jaxpr.eqns[-1].params
        got.add((tuple(p["in_specs"][0]), tuple(p["out_specs"][0]), p["check_vma"],
                 compat.shard_map_manual_axes(p)))
    want = {(tuple(ins), tuple(outs), vma, frozenset(names or ("x", "y"))) for ins, outs, vma, names in calls}
    assert got == want


def test_each_jit_trace_carries_the_shardings_of_its_call():
    f = lambda a: a * 2  # noqa: E731
    calls = [((2, 4), P("x"), P("y")), ((2, 4), P("y"), P("y")), ((2, 4), P("x"), P("x")),
             ((4, 2), P("x"), P("y"))]
    for sizes, ins, outs in calls:
        mesh = Mesh(sizes, ("x", "y"))
        refsim.jit(f, in_shardings=NamedSharding(mesh, ins), out_shardings=NamedSharding(mesh, outs))(X)
    got = set()
    for closed in _traces():
        p = closed.jaxpr.eqns[0].params
        (i,), (o,) = p["in_shardings"], p["out_shardings"]
        got.add((tuple(i.mesh.axis_sizes), tuple(i.spec)[:1], tuple(o.spec)[:1], tuple(o.mesh.axis_sizes)))
    assert got == {(sizes, tuple(ins), tuple(outs), sizes) for sizes, ins, outs in calls}
