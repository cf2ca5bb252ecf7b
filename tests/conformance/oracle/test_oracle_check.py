"""conformance.check on small programs: agreement, the policy chosen, disagreement, errors."""
from __future__ import annotations

import functools
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import conformance
from conformance.verdict import compare
from conformance.oracle import policy
from conformance import faults

MESH = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
RING = [(i, (i + 1) % 4) for i in range(4)]


def shift(a):
    return jax.lax.ppermute(a, "y", RING)


# module level, so the reproducer can import it
shifted = jax.jit(jax.shard_map(shift, mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y")))


def _placed(x, spec):
    return jax.device_put(x, NamedSharding(MESH, spec))


def test_plain_function_with_specs_agrees_with_exact_policy_for_integers():
    x = np.arange(32, dtype=np.int32).reshape(4, 8)
    res = conformance.check(lambda a: jax.lax.psum(a, "x"), x, mesh=MESH, in_specs=P("x", "y"),
                            out_specs=P(None, "y"))
    assert res.ok and res.entry == "shard_map"
    assert res.policies == ["exact"]
    (out,) = res.outputs
    assert out.shape == (2, 8) and out.devices == 8 and out.placement == "program" and out.max_abs_diff == 0
    assert "AGREE" in res.report() and "policy exact" in res.report()


def test_float_program_gets_the_scaled_bound_and_data_movement_stays_exact():
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    res = conformance.check(shifted, _placed(x, P("x", "y")))
    assert res.ok and res.policies == ["exact"] and res.entry == "jit(shard_map)"
    g = jax.jit(lambda a: jnp.tanh(a @ a.T), out_shardings=NamedSharding(MESH, P("x")))
    res = conformance.check(g, _placed(x, P("x", "y")))
    # per element the allowed set (issue 39), tighter here than the scaled bound, which
    # policy="heuristic" still applies alone
    assert res.ok and res.policies[0].startswith("allowed set") and res.outputs[0].allowed > 0
    res = conformance.check(g, _placed(x, P("x", "y")), policy="heuristic")
    assert res.ok and res.policies[0].startswith("scaled bound") and res.outputs[0].allowed > 0


def test_scaled_bound_is_ulps_times_unit_roundoff_times_the_largest_magnitude():
    import refsim

    arr = refsim.device_put(np.array([0.5, -4.0, 1.0, 2.0], np.float32), refsim.NamedSharding(
        refsim.Mesh((2,), ("x",)), refsim.P("x")))
    b = policy.ScaledBound.of(arr, ulps=256)
    # 256 * 2**-24 * 4, plus float32's smallest subnormal for underflow
    assert b.allowed(np.float32) == 256 * 2.0 ** -24 * 4.0 + float(np.finfo(np.float32).smallest_subnormal)
    ref, bound = b.reference_and_bound(0, np.float32)
    assert ref.tolist() == [0.5, -4.0] and bound.shape == (2,)
    over = refsim.device_put(np.array([0.5, -4.0 + 2 ** -9, 1.0, 2.0], np.float32), arr.sharding)
    assert not compare.compare(arr, over, tolerances=[b]).ok          # 2**-9 > 256 ulp of 4 = 2**-14
    under = refsim.device_put(np.array([0.5, -4.0 + 2 ** -15, 1.0, 2.0], np.float32), arr.sharding)
    assert compare.compare(arr, under, tolerances=[b]).ok


def test_scaled_bound_scale_skips_non_finite_elements_and_uses_the_complex_modulus():
    import ml_dtypes
    import refsim

    mesh = refsim.Mesh((2,), ("x",))

    def placed(values, dtype):
        return refsim.device_put(np.array(values, dtype), refsim.NamedSharding(mesh, refsim.P("x")))

    assert policy.ScaledBound.of(placed([0.5, -3.0, 2.0, 1.0], np.float32)).scale == 3.0
    assert policy.ScaledBound.of(placed([np.inf, -3.0, np.nan, 1.0], np.float32)).scale == 3.0
    assert policy.ScaledBound.of(placed([np.nan, np.nan], np.float32)).scale == 0.0
    assert policy.ScaledBound.of(placed([3 + 4j, 1, 0, np.inf], np.complex64)).scale == 5.0    # |3+4j|
    b = policy.ScaledBound.of(placed([1.5, -2.0], ml_dtypes.bfloat16))
    ref, bound = b.reference_and_bound(1, ml_dtypes.bfloat16)
    assert ref.dtype == np.float32 and ref.tolist() == [-2.0] and b.scale == 2.0
    # bfloat16: the float32 bound plus 8 units of bfloat16, of the scale 2
    assert bound.tolist() == [(256 * 2.0 ** -24 + 8 * 2.0 ** -8) * 2.0
                              + float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal)]
    # NaN only where refsim has NaN, an infinity only where refsim has it
    arr = placed([np.nan, np.inf, 1.0, 2.0], np.float32)
    tol = policy.ScaledBound.of(arr)
    assert compare.compare(arr, placed([np.nan, np.inf, 1.0, 2.0], np.float32), tolerances=[tol]).ok
    assert not compare.compare(arr, placed([0.0, np.inf, 1.0, 2.0], np.float32), tolerances=[tol]).ok
    assert not compare.compare(arr, placed([np.nan, np.inf, np.nan, 2.0], np.float32), tolerances=[tol]).ok
    assert not compare.compare(arr, placed([np.nan, -np.inf, 1.0, 2.0], np.float32), tolerances=[tol]).ok


def test_max_diff_in_blocks_is_the_largest_finite_difference(monkeypatch):
    import refsim

    from conformance.oracle import check as chk

    monkeypatch.setattr(chk, "_DIFF_BLOCK", 2)                    # blocks of one row of 2
    sh = refsim.NamedSharding(refsim.Mesh((2,), ("x",)), refsim.P("x"))
    a = refsim.device_put(np.array([[0, 1], [2, 3], [4, np.inf], [6, 7]], np.float32), sh)
    b = refsim.device_put(np.array([[0, 1.5], [2, 3], [4, 5], [6, 4]], np.float32), sh)
    assert chk._max_diff(a, b) == 3.0                              # |7 - 4|; |inf - 5| is not finite
    assert chk._max_diff(a, a) == 0.0


def test_policy_choice_per_output_kind():
    import refsim

    mesh = refsim.Mesh((2,), ("x",))
    f32 = refsim.device_put(np.ones(2, np.float32), refsim.NamedSharding(mesh, refsim.P("x")))
    i32 = refsim.device_put(np.ones(2, np.int32), refsim.NamedSharding(mesh, refsim.P("x")))
    exact_prog, rounding_prog = {"ppermute", "reshape"}, {"ppermute", "dot_general"}
    assert policy.choose([f32, i32], exact_prog) == [compare.EXACT, compare.EXACT]
    pols = policy.choose([f32, i32], rounding_prog)
    assert isinstance(pols[0], policy.ScaledBound) and pols[1] == compare.EXACT
    assert policy.choose([f32], rounding_prog, policy="exact") == [compare.EXACT]
    with pytest.raises(ValueError, match="ulps=-1"):
        policy.choose([f32], rounding_prog, ulps=-1)


def test_planted_fault_raises_with_report_and_a_reproducer_that_fails_only_under_the_fault(tmp_path):
    x = _placed(np.arange(32, dtype=np.float32).reshape(4, 8), P("x", "y"))
    with faults.inject("ppermute_pairs_reversed"):
        with pytest.raises(conformance.ConformanceError) as info:
            conformance.check(shifted, x, repro_dir=str(tmp_path))
    err = info.value
    assert "DISAGREE" in str(err) and "values differ" in str(err) and "device 0" in str(err)
    assert err.repro_path and err.repro_path.startswith(str(tmp_path))
    spec = importlib.util.spec_from_file_location("oracle_repro_under_test", err.repro_path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.PROGRAM_NAME == "shifted" and mod.POLICIES == ["exact"]
    # device 1 (mesh position (0, 1)) receives device 0's block [0:2, 0:2] under a correct ring
    assert mod._data()["out0_dev1"].tolist() == [[0.0, 1.0], [8.0, 9.0]]
    assert mod.check(mod.run()) == []
    with faults.inject("ppermute_pairs_reversed"):
        bad = mod.check(mod.run())
    assert bad and "device" in bad[0]


def _load(path):
    spec = importlib.util.spec_from_file_location(f"oracle_repro_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_closure_disagreement_gets_an_exported_reproducer(tmp_path):
    x = _placed(np.arange(32, dtype=np.float32).reshape(4, 8), P("x", "y"))
    local = jax.shard_map(shift, mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y"))
    with faults.inject("ppermute_pairs_reversed"), pytest.raises(conformance.ConformanceError) as info:
        conformance.check(local, x, repro_dir=str(tmp_path))
    path = info.value.repro_path
    assert path and path.startswith(str(tmp_path)) and "no reproducer" not in str(info.value)
    mod = _load(path)
    assert mod.EXPORTED is not None and mod.PROGRAM_MODULE is None and mod.POLICIES == ["exact"]
    # refsim's expected shards: device 1 (mesh position (0, 1)) holds device 0's block under a correct ring
    assert mod._data()["out0_dev1"].tolist() == [[0.0, 1.0], [8.0, 9.0]]
    # the fault was planted in JAX's lowering, so the serialized StableHLO carries it: XLA runs it
    # as checked and the reproducer fails without the fault too
    bad = mod.check(mod.run())
    assert bad and "device" in bad[0]
    # explain takes it (no jaxpr stage); bisect says why it cannot
    from conformance.debug import loader

    case = loader.load(path)
    assert case.kind == "called" and "module-level name" in case.no_jaxpr


def test_an_exported_reproducer_of_a_correct_program_passes(tmp_path):
    from conformance.oracle import check as chk

    x = _placed(np.arange(32, dtype=np.float32).reshape(4, 8), P("x", "y"))
    k = np.float32(3.0)
    local = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a * k, "y"), mesh=MESH, in_specs=P("x", "y"),
                                  out_specs=P("x")))
    traced = chk.prepare(local, (x,), {})
    out = local(x)
    res, ref, pols = chk.finish(traced, out, name="local", entry="jit")
    assert res.ok
    path, note = chk.write_reproducer(None, "local", (x,), {}, ref, pols, None, str(tmp_path), traced=traced,
                                      out_shardings=[out.sharding])
    assert note == "" and os.path.dirname(path) == str(tmp_path)
    mod = _load(path)
    assert mod.check(mod.run()) == []
    # by hand: row 0 of the psum over 'y' of 3 * x is 3 * (x[0, 0:2] + x[0, 2:4] + x[0, 4:6] + x[0, 6:8])
    assert np.asarray(mod.run()[0])[0].tolist() == [3.0 * (0 + 2 + 4 + 6), 3.0 * (1 + 3 + 5 + 7)]


def test_no_reproducer_leaves_no_empty_temporary_folder(tmp_path, monkeypatch):
    import tempfile

    from conformance.oracle import check as chk
    from conformance.oracle import reproduce
    from conformance.oracle.session import Session

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(reproduce, "exported_source", lambda *a, **k: (_ for _ in ()).throw(
        reproduce.NotReproducible("planted")))
    x = _placed(np.arange(32, dtype=np.float32).reshape(4, 8), P("x", "y"))
    local = jax.shard_map(shift, mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y"))
    with faults.inject("ppermute_pairs_reversed"), pytest.raises(conformance.ConformanceError) as info:
        conformance.check(local, x)
    assert info.value.repro_path is None and "no reproducer" in str(info.value) and "planted" in str(info.value)
    Session()                                       # a session makes its folder at its first reproducer only
    assert os.listdir(tmp_path) == []
    assert chk.write_reproducer(None, "f", (), {}, [], [], None, None)[0] is None


def test_host_callback_is_not_checkable_with_its_reason():
    def cb(a):
        jax.debug.callback(lambda v: None, a)
        return a * 2
    x = _placed(np.arange(8, dtype=np.float32), P(("x", "y")))
    with pytest.raises(conformance.NotCheckable) as info:
        conformance.check(jax.jit(cb), x)
    assert info.value.reason == "host callback"


def test_bad_arguments_name_what_is_missing():
    with pytest.raises(ValueError, match="missing out_specs"):
        conformance.check(lambda a: a, np.ones(8), mesh=MESH, in_specs=P("x"))
    with pytest.raises(ValueError, match="not both"):
        conformance.check(lambda a: a, np.ones(8), mesh=MESH, in_specs=P("x"), out_specs=P("x"),
                          in_shardings=NamedSharding(MESH, P("x")))
    with pytest.raises(TypeError, match="mesh="):
        conformance.check(lambda a: a, np.ones(8), mesh="xy", in_specs=P("x"), out_specs=P("x"))


def test_fixture_writes_reproducers_under_tmp_path(conformance_check, tmp_path):
    x = _placed(np.arange(32, dtype=np.float32).reshape(4, 8), P("x", "y"))
    assert conformance_check(shifted, x).ok
    with faults.inject("ppermute_pairs_reversed"), pytest.raises(conformance.ConformanceError) as info:
        conformance_check(shifted, x)
    assert info.value.repro_path.startswith(str(tmp_path))


@pytest.mark.skipif(not hasattr(jax.lax, "one_minus_square"), reason="jax.lax.one_minus_square is JAX >= 0.12")
def test_refsim_one_minus_square_is_one_plus_x_times_one_minus_x():
    # tanh's JVP in JAX >= 0.12; every example's training step needs it
    import refsim

    x = np.array([0.0, 0.5, -1.0, 2.0, 1 - 2.0 ** -20], np.float32)
    f = lambda a: jax.lax.one_minus_square(a)  # noqa: E731
    got = np.asarray(refsim.jit(f)(x))
    want = (np.float32(1) + x) * (np.float32(1) - x)
    np.testing.assert_array_equal(got, want)


def _programs(session) -> list:
    """The session's records of programs (the inputs' device_puts are checked too, left out here)."""
    return [c for c in session.calls if c["via"] != "device_put"]


def test_static_arguments_of_a_jit_are_closed_over_in_oracle_mode():
    from conformance.oracle import intercept
    from conformance.oracle.session import Session

    session = Session()
    intercept.install(session)
    try:
        step = jax.jit(lambda a, n: jnp.sum(a * n), static_argnums=1)
        x = _placed(np.arange(8, dtype=np.int32), P(("x", "y")))
        out = step(x, 3)
    finally:
        intercept.uninstall()
    assert int(out) == 3 * 28                                           # XLA's value, untouched
    (rec,) = _programs(session)
    assert rec["outcome"] == "agree" and rec["policy"] == ["exact"], rec   # an int32 sum is exact
    assert type(step) is type(jax.jit(lambda a: a))           # JAX's own jit object, not a wrapper


def repeat_add(n, a):
    """a added n times: n must be a Python int (range), so a traced n fails the trace."""
    acc = jnp.zeros_like(a)
    for _ in range(n):
        acc = acc + a
    return jnp.sum(acc)


@pytest.mark.parametrize("jit_kw,call", [
    ({"static_argnums": 0}, lambda f, x: f(3, x)),                 # 0 is a static argnum, not "none"
    ({"static_argnums": 0}, lambda f, x: f(n=3, a=x)),             # static by number, passed by keyword
    ({"static_argnums": 0}, lambda f, x: f(3, a=x)),
    ({"static_argnums": -2}, lambda f, x: f(3, x)),                # negative: counted from the end
    ({"static_argnames": "n"}, lambda f, x: f(3, x)),              # static by name, passed by position
    ({"static_argnames": ("n",)}, lambda f, x: f(n=3, a=x)),
    ({"static_argnums": 0, "static_argnames": "n"}, lambda f, x: f(3, x)),
], ids=["argnums0", "argnums-by-keyword", "argnums-mixed", "argnums-negative", "argnames-by-position",
        "argnames-by-keyword", "both"])
def test_static_arguments_by_number_or_name_and_position_or_keyword_as_jax(jit_kw, call):
    from conformance.oracle import intercept
    from conformance.oracle.session import Session

    session = Session()
    intercept.install(session)
    try:
        x = _placed(np.arange(8, dtype=np.int32), P(("x", "y")))
        out = call(jax.jit(repeat_add, **jit_kw), x)
        deco = call(functools.partial(jax.jit, **jit_kw)(repeat_add), x)       # decorator form
    finally:
        intercept.uninstall()
    assert int(out) == int(deco) == 3 * 28                                    # 3 * (0 + 1 + ... + 7)
    assert [c["outcome"] for c in _programs(session)] == ["agree", "agree"], session.calls


def scale_rows(a, w):
    return a * w


@pytest.mark.parametrize("mode", ["shard_map", "jit"])
def test_plain_function_reproducer_rebuilds_the_wrapping(mode, tmp_path):
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    w = np.arange(8, dtype=np.float32)
    if mode == "shard_map":
        kw = dict(mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y"))
        f, fault, args = shift, "ppermute_pairs_reversed", (x,)
    else:
        kw = dict(in_shardings=(NamedSharding(MESH, P("x", "y")), NamedSharding(MESH, P("y"))),
                  out_shardings=NamedSharding(MESH, P("x", "y")))
        f, fault, args = scale_rows, planted_fault(), (x, w)
    with faults.inject(fault):
        with pytest.raises(conformance.ConformanceError) as info:
            conformance.check(f, *args, repro_dir=str(tmp_path), policy="exact", **kw)
        spec = importlib.util.spec_from_file_location(f"oracle_repro_{mode}", info.value.repro_path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        assert mod.WRAP["kind"] == mode and mod.PROGRAM_NAME == f.__name__
        assert mod.check(mod.run())
    assert mod.check(mod.run()) == []


def planted_fault():
    """XLA multiplies by a wrong constant: a `mul` lowered as mul-then-square (planted here only)."""

    def make_rule(orig, env):
        def rule(ctx, a, b, **params):
            (out,) = orig(ctx, a, b, **params)
            return orig(ctx.replace(avals_in=ctx.avals_out * 2), out, out, **params)   # out * out
        return rule
    return faults.Fault("mul_squared", "mul returns its product squared", ("mul",), make_rule)


def test_oracle_records_a_disagreement_even_when_the_inputs_were_donated(tmp_path):
    import warnings

    from conformance.oracle import intercept
    from conformance.oracle.session import Session

    session = Session(repro_dir=str(tmp_path))
    session.context = "donation"
    intercept.install(session)
    try:
        step = jax.jit(jax.shard_map(shift, mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y")),
                       donate_argnums=0)
        x = _placed(np.arange(32, dtype=np.float32).reshape(4, 8), P("x", "y"))
        with faults.inject("ppermute_pairs_reversed"), warnings.catch_warnings():
            warnings.simplefilter("ignore")            # XLA:CPU may decline the donation
            step(x)
    finally:
        intercept.uninstall()
    (rec,) = _programs(session)
    assert rec["outcome"] == "disagree" and rec["policy"] == ["exact"]
    (err,) = session.pop_failures("donation")
    assert isinstance(err, conformance.ConformanceError)
    # `step` is a local: the reproducer holds the executed program as jax.export serialized it
    assert err.repro_path and err.repro_path.startswith(str(tmp_path)) and "values differ" in str(err)
    assert _load(err.repro_path).EXPORTED is not None


# --- found by running JAX's own tests/shard_map_test.py under oracle mode (docs/oracle.md) ----

def test_grad_of_a_shard_map_whose_jaxpr_has_a_literal_operand_is_checked():
    # jit(grad(...)) of a shard_map: the jaxpr seeds the cotangent with `reshard 1.0`, a
    # Literal operand; refsim used to fail hashing it ("refsim error").
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    f1 = jax.shard_map(lambda b: (b, jax.lax.psum(b, "x")), mesh=mesh, in_specs=P("x"),
                       out_specs=(P("x"), P()))
    g = jax.jit(jax.grad(lambda a: f1(a)[0].sum()))
    x = np.arange(16, dtype=np.float32)
    res = conformance.check(g, x)
    assert res.ok and res.entry == "jit(shard_map)"
    np.testing.assert_array_equal(np.asarray(g(x)), np.ones(16, np.float32))  # d sum / dx = 1


def test_vmap_of_a_partially_manual_shard_map_keeps_the_explicit_batch_split():
    # vmap over an Explicit-sharded dimension: out_specs name only 'model', the output type
    # (and JAX) split dimension 0 over 'data' too; refsim used to leave it replicated.
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    f = jax.shard_map(lambda a: a, mesh=mesh, in_specs=P("model"), out_specs=P("model"))
    g = jax.jit(jax.vmap(f))
    x = jax.device_put(np.arange(16, dtype=np.int32).reshape(4, 4), NamedSharding(mesh, P("data", "model")))
    assert g(x).sharding.spec == P("data", "model")                 # what JAX does
    res = conformance.check(g, x)
    assert res.ok and res.outputs[0].placement == "program" and res.outputs[0].max_abs_diff == 0


# -- float0 outputs (tangents of integer inputs) ----------------------------------------------------

def ring_and_int_tangent(a, n):
    """The ring shift and the float0 tangent of an integer input (module level: reproducible)."""
    _, tn = jax.jvp(lambda v: v * 2, (n,), (np.zeros(n.shape, jax.dtypes.float0),))
    return {"moved": shifted(a), "tangent": tn}


ring_and_int_tangent_jit = jax.jit(ring_and_int_tangent)


def test_float0_outputs_are_checked_by_shape_in_oracle_mode():
    from conformance.oracle import check as chk
    from conformance.oracle import intercept
    from conformance.oracle.session import Session

    session = Session()
    intercept.install(session)
    try:
        grad = jax.jit(jax.grad(lambda a, k: jnp.sum(a * k), argnums=(0, 1), allow_int=True))
        x = _placed(np.arange(8, dtype=np.float32), P(("x", "y")))
        da, dk = grad(x, np.arange(8, dtype=np.int32))
    finally:
        intercept.uninstall()
    np.testing.assert_array_equal(np.asarray(da), np.arange(8, dtype=np.float32))   # d/da sum(a*k) = k
    assert dk.dtype == jax.dtypes.float0 and dk.shape == (8,)                        # XLA's value, untouched
    (rec,) = _programs(session)
    assert rec["outcome"] == "agree" and rec["policy"][1] == chk.FLOAT0_POLICY, rec


def test_float0_output_keeps_the_stated_layout_of_the_others():
    sh = NamedSharding(MESH, P(("x", "y")))
    grad = jax.jit(jax.grad(lambda a, k: jnp.sum(a * k), argnums=(0, 1), allow_int=True),
                   out_shardings=(sh, NamedSharding(MESH, P())))
    res = conformance.check(grad, _placed(np.arange(8, dtype=np.float32), P(("x", "y"))), np.arange(8, dtype=np.int32))
    o0, o1 = res.outputs
    assert (o0.placement, o0.devices, o0.max_abs_diff) == ("program", 8, 0.0), o0
    assert (o1.index, o1.dtype, o1.shape, o1.policy) == (1, "float0", (8,), "shape only (float0 carries no data)")


def test_a_disagreement_beside_a_float0_output_is_caught_and_reproduced(tmp_path):
    x = _placed(np.arange(32, dtype=np.float32).reshape(4, 8), P("x", "y"))
    n = np.arange(3, dtype=np.int32)
    assert conformance.check(ring_and_int_tangent_jit, x, n).ok
    with faults.inject("ppermute_pairs_reversed"), pytest.raises(conformance.ConformanceError) as info:
        conformance.check(ring_and_int_tangent_jit, x, n, repro_dir=str(tmp_path))
    err = info.value
    assert "output 1 ['tangent']: float0[3]" in str(err) and err.repro_path
    spec = importlib.util.spec_from_file_location("oracle_repro_float0", err.repro_path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.check(mod.run()) == []
    with faults.inject("ppermute_pairs_reversed"):
        assert mod.check(mod.run())


# -- placement only where the program states it -----------------------------------------------------

def test_partial_manual_shard_map_outputs_are_placed_by_xla_over_the_automatic_axes():
    # manual over 'x' only: out_specs say nothing about 'y', and XLA's partitioner keeps the
    # result split over 'y' (P('x', 'y')); that is its choice, so the values are compared on its
    # layout (they used to be a "disagreement" with 0 differing elements)
    f = jax.jit(jax.shard_map(lambda a: a * 2, mesh=MESH, in_specs=P("x"), out_specs=P("x"), axis_names={"x"}))
    x = _placed(np.arange(64, dtype=np.float32).reshape(8, 8), P("x", "y"))
    assert f(x).sharding.spec == P("x", "y")                        # what XLA does here
    res = conformance.check(f, x)
    assert res.ok and res.outputs[0].placement == "xla" and res.outputs[0].max_abs_diff == 0
    # a wrong value over the manual axis is still caught (a collective miscompiled)
    ring = jax.jit(jax.shard_map(lambda a: jax.lax.ppermute(a, "x", [(0, 1), (1, 0)]), mesh=MESH,
                                 in_specs=P("x"), out_specs=P("x"), axis_names={"x"}))
    assert conformance.check(ring, x).ok
    with faults.inject("ppermute_pairs_reversed"), pytest.raises(conformance.ConformanceError):
        conformance.check(jax.jit(jax.shard_map(lambda a: jax.lax.ppermute(a, "x", [(0, 1)]), mesh=MESH,
                                                in_specs=P("x"), out_specs=P("x"), axis_names={"x"})), x)


def test_compiler_placement_is_taken_only_where_it_agrees_with_out_specs_on_the_manual_axes():
    from conformance.oracle.program import _compiler_placed
    from refsim import Mesh, NamedSharding as RNS, PartitionSpec as RP

    mesh = Mesh((2, 4), ("x", "y"))

    class Out:
        def __init__(self, spec, shape=(8, 8)):
            self.sharding, self.shape = RNS(mesh, spec), shape

    manual = {"x"}
    assert _compiler_placed(Out(RP("x", "y")), P("x"), mesh, manual) is not None      # 'y' is automatic
    assert _compiler_placed(Out(RP(None, "y")), P(), mesh, manual) is not None
    assert _compiler_placed(Out(RP(("x", "y"))), P("x"), mesh, manual) is not None    # 'y' minor to 'x'
    assert _compiler_placed(Out(RP("y", "x")), P("x"), mesh, manual) is None          # 'x' on the wrong dimension
    assert _compiler_placed(Out(RP(None, None)), P("x"), mesh, manual) is None        # 'x' lost
    assert _compiler_placed(Out(RP("x")), P("x"), Mesh((2, 4), ("x", "y"), device_ids=np.arange(8)[::-1].reshape(2, 4)),
                            manual) is None                                           # another mesh


def test_jit_outputs_without_out_shardings_are_compared_on_xlas_layout():
    f = jax.jit(lambda a: a * 2)
    x = _placed(np.arange(32, dtype=np.float32).reshape(4, 8), P("x", "y"))
    res = conformance.check(f, x)
    assert res.ok and res.outputs[0].placement == "xla" and res.outputs[0].devices == 8
    g = jax.jit(lambda a: a * 2, out_shardings=NamedSharding(MESH, P("y")))
    assert conformance.check(g, x).outputs[0].placement == "program"


# -- narrow floats: the bound is the float32 one plus a few units of the output dtype ------------

def _matmul_scaled(factor):
    """A planted fault: XLA's dot_general returns its product times `factor`."""

    def scaled(orig, env):
        def rule(ctx, *args, **params):
            (aval,) = ctx.avals_out
            (out,) = orig(ctx, *args, **params)
            return [faults.apply(ctx, lambda a: (a.astype(jnp.float32) * factor).astype(a.dtype), out, aval, aval)]
        return rule
    return faults.Fault(f"dot_general_times_{factor}", f"dot_general returns its product times {factor}",
                        ("dot_general",), scaled)


def test_narrow_float_bound_is_the_float32_bound_plus_eight_units_of_the_dtype():
    import ml_dtypes

    from refsim import Mesh, NamedSharding as RNS, PartitionSpec as RP, device_put

    sh = RNS(Mesh((1,), ("x",)), RP())
    ref = device_put(np.array([0.5, -2.0, 1.0], ml_dtypes.bfloat16), sh)
    b = policy.ScaledBound.of(ref)
    # by hand: scale 2, (256 * 2**-24 + 8 * 2**-8) * 2 = 0.0625 + 2**-15 (+ bfloat16's smallest subnormal)
    want = (256 * 2.0 ** -24 + 8 * 2.0 ** -8) * 2 + float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal)
    assert b.narrow_ulps == 8 and b.allowed(ml_dtypes.bfloat16) == pytest.approx(want, rel=1e-12)
    f16 = policy.ScaledBound.of(device_put(np.array([4.0], np.float16), sh))
    assert f16.allowed(np.float16) == pytest.approx((256 * 2.0 ** -24 + 8 * 2.0 ** -11) * 4 + 2.0 ** -24, rel=1e-12)
    f32 = policy.ScaledBound.of(device_put(np.array([4.0], np.float32), sh))
    assert f32.narrow_ulps == 0 and f32.allowed(np.float32) == pytest.approx(256 * 2.0 ** -24 * 4, rel=1e-6)
    assert "8 ulp of the dtype" in b.describe()


def _bf16(*shape, seed=0, scale=1.0):
    import ml_dtypes

    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(ml_dtypes.bfloat16)


def test_bfloat16_matmul_off_by_ten_percent_disagrees():
    a, b = _bf16(64, 64, seed=1), _bf16(64, 64, seed=2, scale=0.125)
    mm = jax.jit(jnp.matmul)
    assert conformance.check(mm, a, b).ok                                          # healthy: agrees
    with faults.inject(_matmul_scaled(1.1)), pytest.raises(conformance.ConformanceError) as info:
        conformance.check(mm, a, b)
    assert "8 ulp of the dtype" in str(info.value)
    # under the former default (256 units of bfloat16: twice the output's magnitude) it passed
    out = info.value.result.outputs[0]
    assert 8 < out.ulps < 256                    # |diff| in units of 2**-8 * max|output|


def test_healthy_bfloat16_transformer_block_agrees():
    import importlib.util
    import os

    import ml_dtypes

    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts", "gpu_oracle.py")
    spec = importlib.util.spec_from_file_location("gpu_oracle", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    progs = {name: (fn, args, kw) for name, fn, args, kw in mod.programs(ml_dtypes.bfloat16)}
    for name in ("transformer_block_forward", "transformer_train_step"):
        fn, args, kw = progs[name]
        res = conformance.check(fn, *args, **kw)
        assert res.ok, res.report()
        assert all(o.policy.endswith("8 ulp of the dtype, of max|output|") or o.policy == "exact" for o in res.outputs)


def test_a_disagreement_by_nan_after_growth_past_one_over_u_is_numerically_unstable():
    # a conjugate-gradient loop on a singular operator (JAX's pjit_test
    # test_sparse_linalg_cg_indexing): refsim's value grew to 1e18 from inputs of 1, XLA's
    # rounding met 0/0 instead; that is no verdict on XLA, so the call is not checkable
    from conformance.oracle.check import _numerically_unstable
    from refsim import Mesh, NamedSharding as RNS, PartitionSpec as RP, device_put

    sh = RNS(Mesh((1,), ("x",)), RP())
    put = lambda v: device_put(np.array(v, np.float32), sh)  # noqa: E731
    inputs = [put([1.0, -0.5])]
    ref, nan = put([1e18, 2.0]), put([np.nan, 2.0])
    pols = policy.choose([ref], {"while", "mul"})
    cmp = compare.compare([ref], [nan], tolerances=pols)
    why = _numerically_unstable(inputs, [ref], pols, cmp)
    assert "1e+18 times the largest input" in why and "nan-introduced" in why, why
    # a NaN where the values stayed of the inputs' size is a disagreement
    small = put([3.0, 2.0])
    pols = policy.choose([small], {"while", "mul"})
    assert _numerically_unstable(inputs, [small], pols, compare.compare([small], [nan], tolerances=pols)) == ""
    # and so is a plain wrong value after the same growth
    wrong = put([2e18, 2.0])
    pols = policy.choose([ref], {"while", "mul"})
    assert _numerically_unstable(inputs, [ref], pols, compare.compare([ref], [wrong], tolerances=pols)) == ""


# -- the disagreement message ends with explain's stage and op ----------------------------------------------
def test_disagreement_message_ends_with_explain_stage_and_op(tmp_path):
    # ppermute_pairs_reversed patches JAX's lowering rule: the lowered module already sends the ring
    # backwards, so the first stage that differs from the jaxpr is the lowered one, at its collective_permute
    x = _placed(np.arange(32, dtype=np.float32).reshape(4, 8), P("x", "y"))
    with faults.inject("ppermute_pairs_reversed"), pytest.raises(conformance.ConformanceError) as info:
        conformance.check(shifted, x, repro_dir=str(tmp_path))
    err = info.value
    last = str(err).splitlines()[-1].strip()
    assert last.startswith("explain: diverged in lowering at stablehlo.collective_permute (op #"), last
    assert last == err.explain
    assert err.explanation.diverged_in == "lowering" and err.explanation.op == "stablehlo.collective_permute"


def test_explain_false_leaves_the_message_without_an_explain_line(tmp_path):
    x = _placed(np.arange(32, dtype=np.float32).reshape(4, 8), P("x", "y"))
    with faults.inject("ppermute_pairs_reversed"), pytest.raises(conformance.ConformanceError) as info:
        conformance.check(shifted, x, repro_dir=str(tmp_path), explain=False)
    assert "explain:" not in str(info.value) and info.value.explain == "" and info.value.explanation is None


def test_an_explain_that_does_not_finish_is_named_in_the_message(tmp_path, monkeypatch):
    import threading

    from conformance.debug.explain import core

    release = threading.Event()
    monkeypatch.setattr(core, "explain", lambda *a, **k: release.wait())   # never returns on its own
    x = _placed(np.arange(32, dtype=np.float32).reshape(4, 8), P("x", "y"))
    try:
        with faults.inject("ppermute_pairs_reversed"), pytest.raises(conformance.ConformanceError) as info:
            conformance.check(shifted, x, repro_dir=str(tmp_path), explain_timeout=0.01)
    finally:
        release.set()
    assert str(info.value).splitlines()[-1].strip().startswith("explain: not finished within 0.01 s (explain_timeout)")
    with pytest.raises(ValueError, match="explain_timeout"):
        conformance.check(shifted, x, explain_timeout=-1)
    with pytest.raises(TypeError, match="explain='yes'"):
        conformance.check(shifted, x, explain="yes")


def test_an_explain_that_fails_is_named_and_the_disagreement_stays_the_error(tmp_path, monkeypatch):
    from conformance.debug.explain import core

    def broken(*a, **k):
        raise RuntimeError("no stage could be built")
    monkeypatch.setattr(core, "explain", broken)
    x = _placed(np.arange(32, dtype=np.float32).reshape(4, 8), P("x", "y"))
    with faults.inject("ppermute_pairs_reversed"), pytest.raises(conformance.ConformanceError) as info:
        conformance.check(shifted, x, repro_dir=str(tmp_path))
    assert str(info.value).splitlines()[-1].strip() == "explain: could not run (RuntimeError: no stage could be built)"


def test_explain_line_for_every_verdict():
    from conformance.debug.explain.core import Explanation
    from conformance.debug.explain.on_check import explain_line

    named = Explanation("compiler", [], {}, op="stablehlo.scatter", op_index=12, source="f.py:7")
    assert explain_line(named) == "explain: diverged in compiler at stablehlo.scatter (op #12), f.py:7"
    crash = Explanation("compiler", [], {}, crash="XLA crashed compiling it: Check failed: sliced.has_value()\nmore")
    assert explain_line(crash) == "explain: diverged in compiler (crash: XLA crashed compiling it: Check failed: sliced.has_value())"
    undetermined = Explanation("undetermined", [], {}, candidates=["compiler", "backend"],
                               not_evaluated={"compiled": "refsim.stablehlo has no rule for mhlo.foo"})
    assert explain_line(undetermined) == ("explain: undetermined between compiler and backend (compiled not evaluated "
                                          "(refsim.stablehlo has no rule for mhlo.foo))")
    nothing = Explanation("undetermined", [], {})
    assert explain_line(nothing) == "explain: undetermined (no stage could be compared)"
    agree = Explanation(None, [], {}, tolerance="bit-exact")
    assert explain_line(agree).startswith("explain: no stage differs from the one before under explain's per-op "
                                          "tolerance (bit-exact; all stages agree)")
