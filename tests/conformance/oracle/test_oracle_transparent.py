"""Oracle mode is invisible to the program it checks (docs/oracle.md, "How calls are seen"):
JAX's own objects and caches, `disable_jit`, JAX's test counters and compile logs behave as
without it; programs are seen by what executes (private entry points, transformations applied
outside jit, eager operations on sharded arrays), and what runs past the hooks is counted."""
from __future__ import annotations

import collections
import contextlib
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import util as jax_util
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import oracle_sessions
from conformance.oracle import intercept
from conformance.oracle import session as sess
from conformance import faults

MESH = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
RING = [(i, (i + 1) % 4) for i in range(4)]


def _x():
    return jax.device_put(np.arange(32, dtype=np.float32).reshape(4, 8), NamedSharding(MESH, P("x", "y")))


def oracle(repro_dir=None):
    return oracle_sessions.installed("transparent", repro_dir)


@contextlib.contextmanager
def events():
    """JAX's test events (what jax._src.test_util's count_* helpers count), counted here."""
    counts = collections.Counter()
    prev = jax_util.test_event_listener
    jax_util.test_event_listener = lambda name, *args: counts.update([name])
    try:
        yield counts
    finally:
        jax_util.test_event_listener = prev


def _three_calls():
    """A new program (a fresh function: its own trace and compile), called three times."""
    f = jax.jit(lambda a: jax.lax.mul(a, a))
    x = _x()
    with events() as counts:
        outs = [f(x) for _ in range(3)]
    return counts, outs


def test_jit_objects_keep_type_eval_shape_lower_and_trace():
    plain = jax.jit(lambda a: a)
    out_sh = NamedSharding(MESH, P("x"))
    with oracle():
        f = jax.jit(lambda a: a * 2, out_shardings=out_sh)
        x = _x()
        assert type(f) is type(plain)                          # JAX's PjitFunction, not a wrapper
        assert jax.eval_shape(f, x).sharding == out_sh          # eval_shape special-cases PjitFunction
        assert f.trace(x).jaxpr.eqns and f.lower(x).compile()(x).sharding == out_sh
        f(x)


def test_counters_see_the_users_work_only():
    base, _ = _three_calls()
    with oracle() as session:
        got, outs = _three_calls()
    # by hand: one trace, one C++ dispatch miss, one lowering and one compile for three calls
    assert (got["trace_to_jaxpr"], got["jit_cpp_cache_miss"], got["lower_jaxpr_to_module"],
            got["pxla_cached_compilation"]) == (1, 1, 1, 1), got
    assert got == base, (got, base)                            # and every other event as without the oracle
    assert [(c["via"], c["outcome"]) for c in session.calls] == [("device_put", "agree")] + [("jit call", "agree")] * 3
    # (the input's device_put is a reshard, checked too)
    np.testing.assert_array_equal(np.asarray(outs[2]), np.asarray(_x()) ** 2)


def test_the_oracle_logs_no_compilation_of_its_own(caplog):
    f = jax.jit(lambda a: jax.lax.add(a, a))
    x = _x()
    with oracle(), jax.log_compiles(True), caplog.at_level(logging.DEBUG, logger="jax"):
        f(x)
        f(x)
    compiles = [r for r in caplog.records if "Compiling" in r.getMessage()]
    assert len(compiles) == 1, [r.getMessage() for r in compiles]       # f's own compile, once


def test_disable_jit_runs_the_python_as_often_as_without_the_oracle():
    runs = []

    def body(a):
        runs.append(1)
        return a * 2

    f = jax.jit(body)
    x = _x()
    with oracle() as session:
        with jax.disable_jit():
            f(x)
            f(x)
        assert len(runs) == 2                                   # under disable_jit: one run per call
        f(x)
        f(x)
    assert len(runs) == 3                                       # then one trace for two calls
    vias = collections.Counter(c["via"] for c in session.calls)
    # under disable_jit `a * 2` runs eagerly on the sharded array (jnp's multiply is itself a jit,
    # disabled too, so lax.mul runs as an eager op); then f's two calls
    assert vias == {"eager op": 2, "jit call": 2}, session.calls
    assert all(c["outcome"] == "agree" for c in session.calls)


def _ring(a):
    return jax.lax.ppermute(a, "y", RING)


def test_private_entry_points_are_checked():
    from jax._src.pjit import pjit as private_pjit
    from jax._src.shard_map import shard_map as private_shard_map

    x = _x()
    with oracle() as session:
        ring = private_pjit(private_shard_map(_ring, mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y")))
        with faults.inject("ppermute_pairs_reversed"):
            ring(x)
        ring(x)
    assert [(c["via"], c["outcome"]) for c in session.calls] == [("jit call", "disagree"), ("jit call", "agree")]


@pytest.mark.parametrize("transform", ["grad", "vjp", "jvp", "vmap"])
def test_transformations_applied_outside_jit_are_checked(transform):
    ring = jax.jit(jax.shard_map(_ring, mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y")))
    x = _x()
    w = np.arange(32, dtype=np.float32).reshape(4, 8)
    run = {
        "grad": lambda: jax.grad(lambda a: jnp.sum(ring(a) * w))(x),
        "vjp": lambda: jax.vjp(ring, x)[1](x),
        "jvp": lambda: jax.jvp(ring, (x,), (x,)),
        "vmap": lambda: jax.vmap(ring, in_axes=0)(jnp.stack([x, x])),
    }[transform]
    with oracle() as session:
        run()
        n = len(session.calls)
        with faults.inject("ppermute_pairs_reversed"):
            run()
    ours = [c for c in session.calls[:n] if c["via"] == "transformation outside jit"]
    assert ours and all(c["outcome"] == "agree" for c in session.calls[:n]), session.calls
    assert any(c["outcome"] == "disagree" for c in session.calls[n:]), session.calls[n:]


def test_grad_outside_jit_is_a_correct_gradient():
    # the gradient of sum(ring(a) * w) is w shifted back along 'y' (hand computation): the
    # oracle checks it and the caller gets XLA's value
    ring = jax.jit(jax.shard_map(_ring, mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y")))
    w = np.arange(32, dtype=np.float32).reshape(4, 8)
    with oracle() as session:
        g = jax.grad(lambda a: jnp.sum(ring(a) * w))(_x())
    blocks = w.reshape(4, 4, 2)                                 # [row, block along y, 2]
    want = np.roll(blocks, -1, axis=1).reshape(4, 8)            # device i's cotangent came from i+1
    np.testing.assert_array_equal(np.asarray(g), want)
    assert session.calls and all(c["outcome"] == "agree" for c in session.calls)


def test_eager_ops_on_sharded_arrays_are_checked():
    x = _x()
    with oracle() as session:
        y = jax.lax.add(x, x)                                   # dispatch.apply_primitive: a one-op jit
        z = jax.lax.sin(y)
    np.testing.assert_array_equal(np.asarray(y), 2 * np.asarray(x))
    assert [(c["via"], c["name"], c["outcome"]) for c in session.calls] == [
        ("eager op", "add", "agree"), ("eager op", "sin", "agree")], session.calls
    assert z.sharding == x.sharding


def test_single_device_eager_ops_are_skipped_not_checked():
    with oracle() as session:
        jax.lax.add(np.float32(1), np.float32(2))
    assert session.calls == [] and session.counts()["census"]["seen"] == 0


def test_ahead_of_time_compiled_calls_are_checked_every_call(tmp_path):
    x = _x()
    with oracle(str(tmp_path)) as session:
        compiled = jax.jit(lambda a: (a * 3, {"s": a.sum()})).lower(x).compile()
        out, extra = compiled(x)
        compiled(x)
        jax.jit(lambda a: a + 1).trace(np.float32(1)).lower().compile()(np.float32(2))   # one device
    np.testing.assert_array_equal(np.asarray(out), 3 * np.asarray(x))
    assert float(extra["s"]) == float(np.asarray(x).sum())
    assert [(c["via"], c["outcome"]) for c in session.calls] == [("ahead-of-time call", "agree")] * 2, session.calls
    census = session.counts()["census"]
    assert census["not_intercepted"] == {} and census["by_path"] == {"ahead-of-time call": 2}, census

    # an executable that returns wrong values is caught on its call
    with oracle(str(tmp_path)) as session:
        compiled = jax.jit(lambda a: a * 3).lower(x).compile()
        good = compiled(x)
        wrong = jax.device_put(np.asarray(good) + 1, good.sharding)
        compiled._call = lambda *a, **k: wrong           # what Compiled.__call__ runs once made
        compiled(x)
    assert [(c["via"], c["outcome"]) for c in session.calls if c["via"] != "device_put"] == [
        ("ahead-of-time call", "agree"), ("ahead-of-time call", "disagree")], session.calls
    (err,) = session.pop_failures("transparent")
    assert "MISMATCH" in str(err) and "exact 0.0, xla 1.0" in str(err)


def test_ahead_of_time_programs_compiled_before_install_are_counted_as_not_intercepted():
    x = _x()
    compiled = jax.jit(lambda a: a * 3).lower(x).compile()
    with oracle() as session:
        compiled(x)
        compiled(x)
    assert session.calls == []
    census = session.counts()["census"]
    assert census["not_intercepted"] == {"ahead-of-time compiled call": 2}, census
    line = sess.summary_lines(session.counts())[0]
    assert line.endswith("0 distributed executions seen, 2 not intercepted"), line


def test_programs_compiled_before_install_are_seen():
    f = jax.jit(lambda a: jax.lax.neg(a))
    x = _x()
    f(x)
    f(x)                                                        # on C++'s fast path now
    with oracle() as session:
        f(x)
    assert [c["outcome"] for c in session.calls] == ["agree"]


def test_device_put_reshards_are_checked_by_placement(monkeypatch, tmp_path):
    from jax._src import dispatch

    x = _x()
    target = NamedSharding(MESH, P("y", "x"))
    with oracle() as session:
        y = jax.device_put(x, target)                           # device to device: a reshard
        jax.device_put(np.arange(8, dtype=np.int32), NamedSharding(MESH, P(("x", "y"))))   # host to devices
        jax.device_put(np.float32(1), jax.devices()[0])         # one device: not counted
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    assert [(c["via"], c["outcome"], c["policy"]) for c in session.calls] == [("device_put", "agree", ["exact"])] * 2

    real = dispatch._batched_device_put_impl

    def reversed_rows(*xs, **kw):                               # a device_put that misplaces the rows
        ys = real(*xs, **kw)
        return [jax.make_array_from_callback(y.shape, y.sharding, lambda idx, v=np.asarray(y)[::-1]: v[idx])
                for y in ys]

    monkeypatch.setattr(dispatch, "_batched_device_put_impl", reversed_rows)
    with oracle(str(tmp_path)) as session:
        jax.device_put(x, target)
    (rec,) = session.calls
    assert (rec["via"], rec["outcome"]) == ("device_put", "disagree"), rec
    (err,) = session.pop_failures("transparent")
    assert "values differ" in str(err)
    # its reproducer replays the device_put with plain JAX (unpatched in a fresh process: it agrees)
    # and checks each device's block against refsim's; explain and bisect say why they do not apply
    import subprocess
    import sys

    assert rec["repro"] == err.repro_path and err.repro_path.startswith(str(tmp_path))
    text = open(err.repro_path).read()
    assert "DEVICE_PUT = [" in text and "P('y', 'x')" in text
    env = {k: v for k, v in __import__("os").environ.items() if k != "XLA_FLAGS"}
    ran = subprocess.run([sys.executable, err.repro_path], capture_output=True, text=True, timeout=300, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    wrong = tmp_path / "wrong_target.py"                  # a target that misplaces the blocks is caught
    wrong.write_text(text.replace("DEVICE_PUT = [([[0, 1, 2, 3], [4, 5, 6, 7]], ('x', 'y'), ('Auto', 'Auto'), P('y', 'x'))]",
                                  "DEVICE_PUT = [([[0, 1, 2, 3], [4, 5, 6, 7]], ('x', 'y'), ('Auto', 'Auto'), P('x', 'y'))]"))
    assert wrong.read_text() != text
    ran = subprocess.run([sys.executable, str(wrong)], capture_output=True, text=True, timeout=300, env=env)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    for command in ("explain", "bisect"):
        r = subprocess.run([sys.executable, "-m", "conformance", command, err.repro_path], capture_output=True,
                           text=True, timeout=300, env=env)
        assert r.returncode == 2 and "jax.device_put moves data without a program" in r.stdout + r.stderr, r.stderr


def test_census_is_in_the_report_and_adds_up_across_workers():
    x = _x()
    before_install = jax.jit(lambda a: a * 2).lower(x).compile()
    with oracle() as session:
        jax.jit(lambda a: a + 1)(x)
        jax.lax.neg(x)
        before_install(x)
    one = session.report()
    assert one["census"] == {"seen": 2, "by_path": {"jit call": 1, "eager op": 1},
                             "not_intercepted": {"ahead-of-time compiled call": 1}}, one["census"]
    both = sess.merge([one, one])
    assert both["census"] == {"seen": 4, "by_path": {"jit call": 2, "eager op": 2},
                              "not_intercepted": {"ahead-of-time compiled call": 2}}
    lines = sess.summary_lines(both)
    assert lines[0] == ("conformance oracle: 4 calls checked, 0 disagreed, 0 not checkable; "
                        "4 distributed executions seen, 2 not intercepted"), lines
    # 4 checked of 6 distributed executions (4 seen + 2 not intercepted)
    assert lines[2] == ("  census: 4 seen (jit call 2, eager op 2), 4 checked (66.7% of distributed executions), "
                        "0 not checkable, 2 not intercepted (ahead-of-time compiled call x2)"), lines


def test_an_execution_that_raises_keeps_its_events_and_is_not_counted():
    from jax._src import pjit as pjit_internal

    x = _x()
    f = jax.jit(lambda a: a + 1)
    real = pjit_internal._pjit_call_impl_python

    def failing(*args, **params):                  # XLA fails after JAX lowered the program
        jax_util.test_event("jit_cpp_cache_miss")
        raise RuntimeError("INTERNAL: planted execution failure")

    with oracle() as session, events() as counts:
        pjit_internal._pjit_call_impl_python = _wrap_inner(failing)
        try:
            with pytest.raises(RuntimeError, match="planted execution failure"):
                f(x)
        finally:
            pjit_internal._pjit_call_impl_python = real
    assert counts["jit_cpp_cache_miss"] == 1, counts
    assert session.calls == [] and session.counts()["census"]["seen"] == 0


def _wrap_inner(failing):
    """The hook as `install` builds it, around `failing` in place of JAX's function."""
    return intercept._hook_execute(failing)


def test_a_call_on_a_deleted_array_raises_as_without_the_oracle_and_is_not_counted():
    x = _x()
    x.delete()
    with oracle() as session:
        with pytest.raises(RuntimeError, match="deleted"):
            jax.jit(lambda a: a + 1)(x)
    assert session.calls == [] and session.counts()["census"]["seen"] == 0


def test_the_oracle_reads_results_under_a_users_transfer_guard():
    x = _x()
    f = jax.jit(lambda a: a * 2)
    with jax.transfer_guard("disallow"):
        try:                                                # does this JAX guard copies off CPU devices?
            np.asarray(f(x))
            guarded = False
        except Exception:  # noqa: BLE001 - JaxRuntimeError (0.12) or its base class
            guarded = True
    with oracle() as session, jax.transfer_guard("disallow"):
        out = f(x)                                          # the oracle copies inputs and outputs to the host
        if guarded:
            with pytest.raises(Exception, match="[Dd]isallowed"):
                np.asarray(out)                             # the user's own copy is still refused
    assert [c["outcome"] for c in session.calls] == ["agree"], session.calls
