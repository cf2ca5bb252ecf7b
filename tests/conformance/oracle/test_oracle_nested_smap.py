"""Nested `jax.smap` on a mesh with an Auto axis (JAX's shard_map_test.py
`test_smap_auto_explicit_nest*`): placement compared only where the program states it.

The outer smap goes manual over the Auto axis 'y', the inner one over the Explicit axis 'x'.
The result's type reads ``f32[8,2@x]``, but on a mesh with an Auto axis JAX's lowering opens the
partially manual shard_map's output sharding to the partitioner (jax 0.10.2 returns it laid out
``P('y')``, jax 0.12 ``P('y', 'x')``, eagerly and under jit alike): over 'x' the placement is
the partitioner's, compared by global value; over the manual 'y' it is stated by out_axes and
a misplaced block still disagrees. On an all-Explicit mesh JAX lays the result out by its type,
and that placement stays checked."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import oracle_sessions
from conformance.oracle import check as check_mod
from conformance.oracle import intercept
from refsim import compat

# 8 devices: 'x' (2, Explicit) by 'y' (4, Auto), as JAX's tests' (2, 2) mesh but on every device
MIXED = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit, AxisType.Auto))
EXPLICIT = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit, AxisType.Explicit))


def oracle(repro_dir=None):
    return oracle_sessions.installed("nested smap", repro_dir)


def _g(b):
    return jnp.sin(b)


def nest(a):                                 # test_smap_auto_explicit_nest: inner in_axes=1 over 'x'
    return jax.smap(_g, in_axes=1, out_axes=1, axis_name="x")(a * 2)


def nest_inner_none(a):                      # ..._inner_none: in_axes inferred (None), out_axes=1
    return jax.smap(_g, out_axes=1, axis_name="x")(a * 2)


@jax.smap(in_axes=1, out_axes=1, axis_name="x")
def _g_decorated(b):
    return jnp.sin(b)


@jax.smap(in_axes=0, out_axes=0, axis_name="y")
def nest_mesh_call_time(a):                  # ..._mesh_call_time: both smaps made before the mesh is set
    return _g_decorated(a * 2)


def _outer(f):
    return jax.smap(f, in_axes=0, out_axes=0, axis_name="y")


def _expected(x, inner_none=False):
    """Hand computation: sin(2 a); out_axes=1 over the 2 devices of 'x' concatenates their
    (equal, replicated-in) copies along dimension 1 when the inner input is not split."""
    v = np.sin(2 * np.asarray(x, np.float64))
    return np.concatenate([v, v], axis=1) if inner_none else v


# JAX 0.12 refuses the inner in_axes=1 on an input not already split over 'x' (JAX's own test
# fails there too); an input placed P('y', 'x') runs on both versions.
INPUT_SPECS = [P("y", "x")] + ([P("y")] if compat.jax_version() < (0, 12) else [])
CASES = [(nest, False, s) for s in INPUT_SPECS] + [(nest_inner_none, True, P("y"))] + \
        [(nest_mesh_call_time, False, s) for s in INPUT_SPECS]


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("fn,inner_none,spec", CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_nested_smap_over_an_auto_axis_agrees_eagerly_and_under_jit(fn, inner_none, spec, jit):
    with jax.set_mesh(MIXED):
        x = jax.device_put(np.arange(16, dtype=np.float32).reshape(8, 2), spec)
        h = fn if fn is nest_mesh_call_time else _outer(fn)
        h = jax.jit(h) if jit else h
        with oracle() as session:
            out = h(x)
    np.testing.assert_allclose(np.asarray(out), _expected(x, inner_none), rtol=1e-6)
    assert out.sharding.spec[0] == "y"                    # stated by the outer out_axes
    assert session.calls and all(c["outcome"] == "agree" for c in session.calls), session.calls
    assert not session.pop_failures("nested smap")
    if jit:
        assert [c["via"] for c in session.calls if c["via"] != "device_put"] == ["jit call"]
    else:                                                # eager: each primitive a small shard_map
        assert any(c["via"] == "eager shard_map" for c in session.calls)


def _finish(h, x, out):
    traced = check_mod.prepare(h, (x,), {})
    return check_mod.finish(traced, out, name="nest", entry="jit")[0]


@pytest.mark.parametrize("fn", [nest, nest_inner_none])
def test_nested_smap_over_an_auto_axis_is_compared_by_value_over_x_and_by_place_over_y(fn):
    with jax.set_mesh(MIXED):
        x = jax.device_put(np.arange(16, dtype=np.float32).reshape(8, 2), P("y", "x"))
        h = jax.jit(_outer(fn))
        with intercept.unchecked():
            out = h(x)
            res = _finish(h, x, out)
            assert res.ok and res.outputs[0].placement == "xla", res.report()
            value = np.asarray(out)
            # the same global value laid out otherwise over 'x' (the partitioner's choice): agrees
            for spec in (P("y"), P("y", "x")):
                other = jax.device_put(value, NamedSharding(MIXED, spec))
                assert _finish(h, x, other).ok, spec
            # misplaced over the manual 'y' the out_axes state (lost, or on the other dimension's
            # place): each device holds a block that is not its own; same global value, disagrees
            for spec in (P(), P("x")):
                wrong = jax.device_put(value, NamedSharding(MIXED, spec))
                res = _finish(h, x, wrong)
                assert not res.ok and res.outputs[0].max_abs_diff == 0, spec
                assert "index: refsim" in res.report(), res.report()


def test_nested_smap_on_an_all_explicit_mesh_is_placed_by_its_type():
    # no Auto axis: JAX lays the result out by its type, f32[8@y,2@x]; that placement is stated
    with jax.set_mesh(EXPLICIT):
        x = jax.device_put(np.arange(16, dtype=np.float32).reshape(8, 2), P("y", "x"))
        h = jax.jit(_outer(nest))
        with intercept.unchecked():
            out = h(x)
            assert out.sharding.spec == P("y", "x")
            res = _finish(h, x, out)
            assert res.ok and res.outputs[0].placement == "program", res.report()
            wrong = jax.device_put(np.asarray(out), NamedSharding(EXPLICIT, P("y")))   # 'x' dropped
            res = _finish(h, x, wrong)
            assert not res.ok and "index: refsim" in res.report(), res.report()
        with oracle() as session:                            # eagerly too
            _outer(nest)(x)
    assert session.calls and all(c["outcome"] == "agree" for c in session.calls), session.calls


def test_any_auto_axis_reads_the_shard_map_equations_mesh():
    from conformance.oracle.program import _any_auto_axis

    assert _any_auto_axis(MIXED) and _any_auto_axis(MIXED.abstract_mesh)
    assert not _any_auto_axis(EXPLICIT) and not _any_auto_axis(EXPLICIT.abstract_mesh)
    assert _any_auto_axis(jax.make_mesh((8,), ("i",), axis_types=(AxisType.Auto,)))


def test_explain_replays_the_nested_smap_with_layout_only_stand_ins_for_xlas_outputs():
    # explain hands refsim_outputs stand-ins that carry XLA's output sharding and no shape
    from conformance.debug.explain import program as explain_program
    from conformance.oracle import program as prog

    with jax.set_mesh(MIXED):
        x = jax.device_put(np.arange(16, dtype=np.float32).reshape(8, 2), P("y", "x"))
        h = jax.jit(_outer(nest))
        staged = explain_program.build_called(h, (x,))
        out = h(x)
        (ref,) = staged.refsim([prog.convert.from_jax_sharding(out.sharding)])
    assert ref.shape == (8, 2)
    np.testing.assert_allclose(np.asarray(ref), _expected(x), rtol=1e-6)
