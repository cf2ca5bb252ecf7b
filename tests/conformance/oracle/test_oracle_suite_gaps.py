"""The oracle's gaps found on suites it was never tuned on (issue 42, point 5), each closed: a
deserialized `jax.export.Exported`'s calls, vmap of a collective under jit, an ordered effect's
runtime token, a device_put of a deleted (donated) array, the placements outside device_put
(`make_array_from_callback`, `make_array_from_single_device_arrays`, `device_put_sharded`,
`device_put_replicated`), StringDType arrays and float0 pmap arguments. Expected values by hand
or NumPy; each check is also shown to fail on a planted wrong result."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from numpy.dtypes import StringDType

import oracle_sessions
from conformance.oracle import check as chk
from conformance.oracle import program as prog
from refsim import compat

MESH = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
RING = [(i, (i + 1) % 4) for i in range(4)]
X = np.arange(32, dtype=np.int32).reshape(4, 8)


def _put(x, spec=P("x", "y")):
    return jax.device_put(x, NamedSharding(MESH, spec))


def _outcomes(session, via=None):
    return [(c["via"], c["outcome"], c.get("reason")) for c in session.calls if via is None or c["via"] == via]


# -- call_exported -----------------------------------------------------------------------------------
def _exported_ring():
    body = jax.shard_map(lambda a: jax.lax.ppermute(a, "y", RING), mesh=MESH, in_specs=P("x", "y"),
                         out_specs=P("x", "y"))
    arg = jax.ShapeDtypeStruct(X.shape, X.dtype, sharding=NamedSharding(MESH, P("x", "y")))
    exp = jax.export.export(jax.jit(body, out_shardings=NamedSharding(MESH, P("y", "x"))))(arg)
    return jax.export.deserialize(exp.serialize())


def test_calls_of_a_deserialized_export_are_checked_and_laid_out_by_its_out_shardings():
    exp, xs = _exported_ring(), _put(X)
    with oracle_sessions.installed("exported") as session:
        eager = exp.call(xs)
        jitted = jax.jit(exp.call)(xs)
    assert _outcomes(session) == [("eager op", "agree", None), ("jit call", "agree", None)], session.calls
    for out in (eager, jitted):
        np.testing.assert_array_equal(np.asarray(out), np.roll(X, 2, axis=1))    # by hand: column blocks roll by one
        assert out.sharding.spec == P("y", "x")


def test_an_export_call_whose_xla_result_is_wrong_disagrees():
    exp, xs = _exported_ring(), _put(X)
    traced = prog.trace(jax.jit(exp.call), (xs,), {})
    prog.take_host_copies(traced)
    ok, _, _ = chk.finish(traced, jax.device_put(np.roll(X, 2, axis=1), NamedSharding(MESH, P("y", "x"))),
                          name="ring", entry="jit")
    assert ok.ok and ok.outputs[0].placement == "program"        # the Exported states the layout
    wrong = jax.device_put(X, NamedSharding(MESH, P("y", "x")))   # the blocks never moved
    res, _, _ = chk.finish(traced, wrong, name="ring", entry="jit")
    assert not res.ok and "values differ" in res.report()
    misplaced = jax.device_put(np.roll(X, 2, axis=1), NamedSharding(MESH, P("x", "y")))   # right values, wrong layout
    res, _, _ = chk.finish(traced, misplaced, name="ring", entry="jit")
    assert not res.ok


# -- vmap of a collective under jit --------------------------------------------------------------------
def test_vmap_of_psum_pmax_pmin_under_jit_is_checked():
    f = jax.jit(jax.vmap(lambda a: (jax.lax.psum(a, "i"), jax.lax.pmax(a, "i"), jax.lax.pmin(a, "i")), axis_name="i"))
    with oracle_sessions.installed("vmap") as session:
        s, mx, mn = f(_put(X))
    assert _outcomes(session, "jit call") == [("jit call", "agree", None)], session.calls
    np.testing.assert_array_equal(np.asarray(s), np.broadcast_to(X.sum(0), X.shape))
    np.testing.assert_array_equal(np.asarray(mx), np.broadcast_to(X[3], X.shape))
    np.testing.assert_array_equal(np.asarray(mn), np.broadcast_to(X[0], X.shape))


# -- an ordered effect's runtime token -------------------------------------------------------------------
def test_an_ordered_callbacks_runtime_token_is_passed_through_not_an_oracle_error():
    @jax.jit
    def h(a):
        return io_callback(lambda v: v, jax.ShapeDtypeStruct(a.shape, a.dtype), a, ordered=True) * 2

    xs = _put(X)
    with oracle_sessions.installed("token") as session:
        outs = [h(xs) for _ in range(3)]
        jax.effects_barrier()
    assert _outcomes(session) == [("jit call", "not_checkable", "host callback")] * 3, session.calls
    counts = session.counts()
    assert counts["passed_through"].get("runtime token", 0) >= 2, counts      # from the second call on
    assert "oracle error" not in counts["not_checkable"]
    assert any("passed through unchecked: runtime token x" in line for line in session.summary_lines())
    np.testing.assert_array_equal(np.asarray(outs[2]), 2 * X)


# -- a deleted (donated) array ----------------------------------------------------------------------------
def test_a_device_put_of_a_donated_array_raises_the_programs_own_error():
    step = jax.jit(lambda a: a + 1, donate_argnums=0)
    with oracle_sessions.installed("donated") as session:
        a = _put(X)
        step(a)
        seen = session.counts()["census"]["seen"]
        with pytest.raises(RuntimeError, match="Array has been deleted"):
            jax.device_put(a, NamedSharding(MESH, P("y")))
        with pytest.raises(RuntimeError, match="Array has been deleted"):
            step(a)
    counts = session.counts()
    assert counts["not_checkable"] == {} and counts["census"]["seen"] == seen, counts


# -- placements outside device_put -------------------------------------------------------------------------
def test_placements_outside_device_put_are_in_the_census_and_checked():
    sh = NamedSharding(MESH, P("x", "y"))
    dps, dpr = compat.legacy_device_put_sharded()
    with oracle_sessions.installed("placements") as session:
        a = jax.make_array_from_callback(X.shape, sh, lambda idx: X[idx])
        blocks = [jax.device_put(X[idx], d) for d, idx in sh.addressable_devices_indices_map(X.shape).items()]
        b = jax.make_array_from_single_device_arrays(X.shape, sh, blocks[::-1])
        c = dps([X[i] for i in range(4)], jax.devices()[:4])
        d = dpr(X[0], jax.devices()[4:])
    assert [(c_["via"], c_["outcome"]) for c_ in session.calls] == [
        ("make_array_from_callback", "agree"), ("make_array_from_single_device_arrays", "agree"),
        ("device_put_sharded", "agree"), ("device_put_replicated", "agree")], session.calls
    assert session.counts()["census"]["by_path"] == {
        "make_array_from_callback": 1, "make_array_from_single_device_arrays": 1, "device_put_sharded": 1,
        "device_put_replicated": 1}
    for arr in (a, b, c):
        np.testing.assert_array_equal(np.asarray(arr), X)
    np.testing.assert_array_equal(np.asarray(d), np.broadcast_to(X[0], (4, 8)))


def test_a_placement_that_puts_a_block_on_the_wrong_device_disagrees():
    sh = NamedSharding(MESH, P("x", "y"))
    idx = sh.addressable_devices_indices_map(X.shape)
    hosts = [(d.id, X[i]) for d, i in idx.items()]
    good = jax.make_array_from_callback(X.shape, sh, lambda i: X[i])
    res, _ = chk.finish_placement("make_array_from_callback", sh, X.shape, X.dtype, hosts, good)
    assert res.ok and res.policies == ["exact"]
    swapped = [(d, X[i]) for (d, _), i in zip(hosts, list(idx.values())[1:] + list(idx.values())[:1])]
    res, _ = chk.finish_placement("make_array_from_callback", sh, X.shape, X.dtype, swapped, good)
    assert not res.ok
    held = [(d, b) for d, b in hosts]
    held[0], held[1] = (held[0][0], held[1][1]), (held[1][0], held[0][1])   # device 0's slot holds device 1's block
    res, _ = chk.finish_placement("make_array_from_single_device_arrays", sh, X.shape, X.dtype, hosts, held)
    assert not res.ok


# -- StringDType arrays and float0 pmap arguments ------------------------------------------------------
WORDS = np.array(["a", "bc", "def", "", "ghij", "k", "lm", "nop"], dtype=StringDType())


def test_string_arrays_are_placed_and_resharded_and_checked():
    with oracle_sessions.installed("strings") as session:
        a = jax.device_put(WORDS, NamedSharding(MESH, P("x")))
        b = jax.device_put(a, NamedSharding(MESH, P("y")))
    assert _outcomes(session) == [("device_put", "agree", None)] * 2, session.calls
    by_hand = [["a", "bc"], ["def", ""], ["ghij", "k"], ["lm", "nop"]]      # device (0, j) holds words 2j, 2j+1
    assert [np.asarray(s.data).tolist() for s in b.addressable_shards[:4]] == by_hand
    res, _ = chk.finish_device_put([WORDS], [NamedSharding(MESH, P("y"))], [b])
    assert res.ok
    res, _ = chk.finish_device_put([WORDS], [NamedSharding(MESH, P("y"))], [a])   # laid out P('x'), claimed P('y')
    assert not res.ok and "index: refsim [0:2], xla [0:4]" in res.report(), res.report()
    reversed_words = jax.device_put(WORDS[::-1].copy(), NamedSharding(MESH, P("y")))  # right layout, wrong strings
    res, _ = chk.finish_device_put([WORDS], [NamedSharding(MESH, P("y"))], [reversed_words])
    assert not res.ok and "refsim 'a', xla 'nop'" in res.report(), res.report()


def test_a_float0_pmap_argument_is_checked():
    pm = jax.pmap(lambda a, t: (a * 2, t))
    t = np.zeros((4, 3), dtype=jax.dtypes.float0)
    with oracle_sessions.installed("float0") as session:
        out, tan = pm(np.arange(12, dtype=np.float32).reshape(4, 3), t)
    assert _outcomes(session) == [("pmap", "agree", None)], session.calls
    assert tan.dtype == jax.dtypes.float0 and tan.shape == (4, 3)
    np.testing.assert_array_equal(np.asarray(out), 2 * np.arange(12, dtype=np.float32).reshape(4, 3))


def test_a_placement_whose_spec_is_longer_than_the_rank_by_trailing_nones_is_checked():
    # jax's multi_device_test.py::test_lax_full_sharding: lax.full((8,), 1.0, sharding=P('i', None))
    # places through make_array_from_callback, which JAX lets keep a spec longer than the rank by
    # None entries (device_put and jit reject it); the oracle had called that a refsim error
    mesh = jax.make_mesh((8,), ("i",), axis_types=(AxisType.Auto,))
    sh = NamedSharding(mesh, P("i", None))
    v = np.arange(8, dtype=np.float32)
    with oracle_sessions.installed("placements") as session:
        a = jax.make_array_from_callback((8,), sh, lambda idx: v[idx])
        f = jax.lax.full((8,), 1.0, sharding=sh)
    assert [(c["via"], c["outcome"]) for c in session.calls] == [("make_array_from_callback", "agree")] * 2, \
        session.calls
    np.testing.assert_array_equal(np.asarray(a), v)
    np.testing.assert_array_equal(np.asarray(f), np.ones(8, np.float32))
    hosts = [(d.id, v[i]) for d, i in sh.addressable_devices_indices_map((8,)).items()]
    wrong = [(d, b + 1) if d == 3 else (d, b) for d, b in hosts]    # device 3 holds a wrong block
    res, _ = chk.finish_placement("make_array_from_callback", sh, (8,), np.float32, wrong, a)
    assert not res.ok
