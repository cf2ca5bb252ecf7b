"""Meta-tests of the program-class variants that move values without changing them: the jit's own
in/out shardings in memory kinds (``host_offload``), jit chains across device orders and mesh
shapes (``jit_chain_orders``), and reduced / unreduced values through arithmetic and gradients
(the ``unreduced_add`` / ``reduced_dot`` ops). Expected values are NumPy's, never the engines'."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import refsim
import xla_backend
from refsim import compat
from conformance.hunt import case_from_data, case_to_data
from conformance.strategies import sharded_programs
from conformance.strategies._program_classes import memory_kinds
from conformance.strategies._sharded_ops.sharding import has_unreduced
from conformance.strategies.sharded import Graph, assemble, make_case
from conformance.verdict.compare import compare
from refsim.layouts.mesh import Mesh
from test_strategies_program_classes import _find
from test_strategies_sharded import assert_traces_as_modelled, run_judged

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")

P = refsim.PartitionSpec
X = (np.arange(32, dtype=np.float32).reshape(8, 4) % 7 - 3) / 4
Y = (np.arange(32, dtype=np.float32).reshape(8, 4) % 5 - 2)


def _kinds_of(out) -> list:
    return [s.sharding.memory_kind or "device" for s in (out if isinstance(out, (list, tuple)) else [out])]


# -- (a) memory kinds on the jit's own shardings ---------------------------------------------------
# jaxlib 0.9.2 cannot partition any host placement ("Side-effect ops cannot be replicated"; xfails/cpu.txt,
# class=host_offload, jax<0.10): the runs below need 0.10 on
host_memory_runs = pytest.mark.skipif(compat.jax_version() < (0, 10), reason="jaxlib 0.9.2 cannot partition "
                                      "a host placement (xfails/cpu.txt: class=host_offload, jax<0.10)")


def _host_case(in_kinds, out_kinds):
    """g(a0, a1) = (a0 * 2 + a1, a1 - a0) called as host_offload with the jit's shardings in these kinds."""
    graph = Graph(helpers=(), lines=("v1 = a0 * 2.0 + a1", "v2 = a1 - a0"), line_ops=(("mul", "sharded"),
                                                                                      ("sub", "sharded")),
                  outs=(("v1", (8, 4), "float32", 0.0), ("v2", (8, 4), "float32", 0.0)),
                  args=(("float32", (8, 4), None), ("float32", (8, 4), None)), batch=None, transform="none",
                  program_class=("host_offload", ("host_args", ()), ("host_outs", False), ("compute_on", ""),
                                 ("in_kinds", in_kinds), ("out_kinds", out_kinds)))
    mesh = Mesh((2, 4), ("x", "y"), device_ids=np.array([[5, 1, 7, 3], [0, 6, 2, 4]]))
    s = refsim.NamedSharding(mesh, P("x", "y"))
    return make_case(graph, mesh=mesh, args=(X, Y), in_shardings=(s, refsim.NamedSharding(mesh, P(None, "y"))),
                     out_shardings=(s, refsim.NamedSharding(mesh, P("y"))), partitioner="shardy",
                     axis_types="auto")


@host_memory_runs
@pytest.mark.parametrize("in_kinds, out_kinds", [(("pinned_host", "device"), ("pinned_host", "device")),
                                                 (("pinned_host", "pinned_host"), ("device", "pinned_host"))])
def test_the_jits_own_memory_kinds_move_values_without_changing_them(in_kinds, out_kinds):
    case = _host_case(in_kinds, out_kinds)
    assert [s.memory_kind for s in case.in_shardings] == list(in_kinds)
    assert [s.memory_kind for s in case.out_shardings] == list(out_kinds)
    assert "a0 = jax.device_put(a0, jax.memory.Space.Device)" in case.source
    for api in (refsim, xla_backend):
        out = case.run(api)
        np.testing.assert_array_equal(np.asarray(out[0]), X * 2 + Y)
        np.testing.assert_array_equal(np.asarray(out[1]), Y - X)
        assert _kinds_of(out) == list(out_kinds), api.__name__
    assert run_judged(case) == "pass"


def test_a_case_compares_memory_kinds_and_the_oracle_does_not():
    mesh = Mesh((2, 2), ("x", "y"))
    dev = refsim.NamedSharding(mesh, P("x"))
    want = refsim.device_put(X, dev.with_memory_kind("pinned_host"))
    got = refsim.device_put(X, dev)
    case = _host_case(("device", "device"), ("pinned_host", "device"))
    res = compare(want, got, case=case, tolerances=case.tolerances()[:1])
    assert [m.kind for m in res.mismatches] == ["memory kind"]
    assert "memory kind: refsim pinned_host, xla device" in res.report()
    assert compare(want, got).ok   # no case: the oracle's programs state no placement to hold XLA to


@host_memory_runs
def test_the_oracle_checks_a_program_whose_outputs_live_in_host_memory():
    # conformance.check compares values only (no memory kind: refsim does not model the kind XLA gives an output
    # no out_sharding states); a jit with pinned_host out_shardings and a device_put to Space.Host both check
    import jax

    import conformance

    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    dev = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x", "y"))
    host = dev.with_memory_kind("pinned_host")
    f = jax.jit(lambda a: (a * 2 + 1, jax.device_put(a - 1, jax.memory.Space.Host)), in_shardings=dev,
                out_shardings=(host, dev))
    result = conformance.check(f, X)
    assert result.ok
    out = f(X)
    assert out[0].sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(np.asarray(out[0]), X * 2 + 1)


@host_memory_runs
def test_memory_kinds_survive_case_files_and_reach_the_reproducers():
    case = _host_case(("pinned_host", "device"), ("device", "pinned_host"))
    again = case_from_data(case_to_data(case))
    assert again.in_shardings == case.in_shardings and again.out_shardings == case.out_shardings
    assert memory_kinds(again.graph.program_class) == (("pinned_host", "device"), ("device", "pinned_host"))
    repro = case.repro(case.run(refsim))
    assert "IN_MEMORY_KINDS = ('pinned_host', 'device')" in repro
    assert "OUT_MEMORY_KINDS = ('device', 'pinned_host')" in repro
    from conformance.upstream.script import script_text

    script = script_text(case, title="t", about="a")
    assert "NamedSharding(mesh, s, memory_kind=k) for s, k in zip(IN_SPECS, IN_MEMORY_KINDS)" in script
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    for text in (repro, script):
        proc = subprocess.run([sys.executable, "-c", text], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@host_memory_runs
def test_host_offload_draws_host_memory_on_the_jits_own_shardings():
    case = _find("host_offload", lambda c: "pinned_host" in memory_kinds(c.graph.program_class)[0]
                 and "pinned_host" in memory_kinds(c.graph.program_class)[1] and c.mesh.size > 1,
                 transforms=("none", "vmap"))
    in_kinds, out_kinds = memory_kinds(case.graph.program_class)
    assert [s.memory_kind for s in case.in_shardings] == list(in_kinds)
    assert [s.memory_kind for s in case.out_shardings] == list(out_kinds)
    assert_traces_as_modelled(case)
    assert _kinds_of(case.run(refsim)) == list(out_kinds)
    run_judged(case)


# -- (c) reduced / unreduced values through arithmetic and gradients ----------------------------------
_REDUCED = re.compile(r"(?<!un)reduced=\{")
needs_unreduced = pytest.mark.skipif(not has_unreduced(), reason="this JAX has no P(unreduced=...) / P(reduced=...)")
needs_reduced_constants = pytest.mark.skipif(not compat.reduced_takes_constants(),
                                             reason="jax 0.9: a reduced value takes no arithmetic with a constant")
EXPLICIT = Mesh((2, 4), ("x", "y"), device_ids=np.array([[3, 1, 0, 2], [7, 6, 5, 4]]),
               axis_types=(refsim.AxisType.Explicit,) * 2)


def _explicit_case(lines, ops, outs, args, arg_specs, out_specs, transform="none", data=(X, Y)):
    graph = Graph(helpers=(), lines=lines, line_ops=tuple((op, "sharded") for op in ops), outs=outs,
                  args=tuple(("float32", np.shape(a), None) for a in data[:len(args)]), batch=None,
                  transform=transform)
    sh = lambda spec: refsim.NamedSharding(EXPLICIT, spec)  # noqa: E731
    return make_case(graph, mesh=EXPLICIT, args=tuple(data[:len(args)]), in_shardings=tuple(map(sh, arg_specs)),
                     out_shardings=tuple(map(sh, out_specs)), partitioner="shardy", axis_types="explicit")


@needs_unreduced
@needs_reduced_constants
def test_unreduced_partial_sums_add_and_a_reduced_value_takes_arithmetic():
    case = _explicit_case(
        ("v1 = jax.lax.reduce_sum(a0, (0,), out_sharding=P(None, unreduced={'x'})) + "
         "jax.lax.reduce_sum(a1, (0,), out_sharding=P(None, unreduced={'x'}))",
         "v2 = jax.sharding.reshard(v1, P(None, reduced={'x'}))", "v3 = v2 * 2.0 + 1.0",
         "v4 = jax.sharding.reshard(v3, P('y'))"),
        ("unreduced_add", "unreduced_add", "unreduced_add", "reshard"), (("v4", (4,), "float32", 0.0),),
        ("a0", "a1"), (P("x", None), P("x", None)), (P("y"),))
    want = 2 * (X.sum(0) + Y.sum(0)) + 1
    for api in (refsim, xla_backend):
        np.testing.assert_array_equal(np.asarray(case.run(api)[0]), want)
    assert run_judged(case) == "pass"


@needs_unreduced
@needs_reduced_constants
def test_a_reduced_weight_in_a_matmul_differentiates_through_its_unreduced_cotangent():
    w = (np.arange(16, dtype=np.float32).reshape(4, 4) % 5 - 2) / 2
    case = _explicit_case(
        ("v1 = jax.sharding.reshard(a0, P(('x', 'y')))",
         "v2 = jax.sharding.reshard(a1, P(None, None, reduced={'x', 'y'}))",
         "v3 = v2 * 2.0 + 1.0", "v4 = jax.lax.dot_general(v1, v3, (((1,), (0,)), ((), ())))",
         "v5 = jax.sharding.reshard(v4, P('y', 'x'))"),
        ("reshard", "reduced_dot", "reduced_dot", "reduced_dot", "reshard"), (("v5", (8, 4), "float32", 0.0),),
        ("a0", "a1"), (P("x", None), P(None, "y")), (P("x", None), P(None, "y")), transform="grad", data=(X, w))
    weights = np.arange(32, dtype=np.float32).reshape(8, 4) % 3 + 1    # the grad transform's loss weights
    want_a = weights @ (2 * w + 1).T          # d/da sum(weights * (a @ (2w + 1)))
    want_w = 2 * X.T @ weights                # d/dw: the unreduced cotangent, summed
    for api in (refsim, xla_backend):
        da, dw = case.run(api)
        np.testing.assert_allclose(np.asarray(da), want_a, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(dw), want_w, rtol=1e-6)
    assert run_judged(case) == "pass"


@needs_unreduced
@pytest.mark.parametrize("op, transforms, pred", [
    pytest.param("unreduced_add", ("none",), lambda c: _REDUCED.search(c.source) and " * 2" in c.source,
                 marks=needs_reduced_constants),
    ("unreduced_add", ("none",), lambda c: _REDUCED.search(c.source) is not None),
    ("unreduced_add", ("none",), lambda c: not _REDUCED.search(c.source)),
    pytest.param("reduced_dot", ("grad", "vjp"), lambda c: c.transform in ("grad", "vjp") and "* 2.0 + 1.0" in c.source,
                 marks=needs_reduced_constants),
    ("reduced_dot", ("grad", "vjp"), lambda c: c.transform in ("grad", "vjp")),
    ("reduced_dot", ("none",), lambda c: True),
])
def test_reduced_and_unreduced_ops_are_drawn_on_explicit_axes_and_agree(op, transforms, pred):
    from hypothesis import find
    from test_strategies_sharded import FIND, SAFE_MESHES

    case = find(sharded_programs(SAFE_MESHES, ops=(op,), max_ops=2, axis_types=("explicit",), transforms=transforms,
                                 partitioners=("shardy",), dtypes=("float32",)),
                lambda c: op in c.ops and pred(c), settings=FIND)
    assert_traces_as_modelled(case)
    run_judged(case)
    assert case_from_data(case_to_data(case)).source == case.source


def test_reduced_and_unreduced_ops_draw_nothing_on_auto_axes():
    from hypothesis import given, settings

    @settings(max_examples=20, database=None, deadline=None)
    @given(sharded_programs(ops=("unreduced_add", "reduced_dot", "sin"), axis_types=("auto",), max_ops=3))
    def check(case):
        assert not {"unreduced_add", "reduced_dot"} & set(case.ops)

    check()


# -- (b) jit chains across device orders and mesh shapes ----------------------------------------------
def _chain_case(explicit=False):
    """g(a0, a1) = (a0 * 2 + a1,) stepped three times: on a 2x4 mesh, then a 4x2 one (axes y, x) and a
    2x4 one, each over the same 8 devices in another order."""
    mesh = Mesh((2, 4), ("x", "y"), device_ids=np.arange(8).reshape(2, 4),
                axis_types=(refsim.AxisType.Explicit if explicit else refsim.AxisType.Auto,) * 2)
    steps = (((("x",), ("y",)), (("y",), ())),       # call 0: carry P('x', 'y'), output P('y')
             ((("y",), ()), (("x",), ("y",))),        # call 1 (mesh y x): carry P('y'), output P('x', 'y')
             (((), ("x",)), ((("x", "y")), ())))      # call 2: carry P(None, 'x'), output P(('x', 'y'))
    orders = ((("y", "x"), (7, 2, 5, 0, 3, 6, 1, 4)), (("x", "y"), (4, 5, 6, 7, 0, 1, 2, 3)))
    graph = Graph(helpers=(), lines=("v1 = a0 * 2.0 + a1",), line_ops=(("mul", "sharded"),),
                  outs=(("v1", (8, 4), "float32", 0.0),),
                  args=(("float32", (8, 4), None), ("float32", (8, 4), None)), batch=None, transform="none",
                  program_class=("jit_chain_orders", ("steps", steps), ("orders", orders),
                                 ("carry_spec", (("x",), ())), ("explicit", explicit)))
    s = refsim.NamedSharding(mesh, P("x"))
    return make_case(graph, mesh=mesh, args=(X, Y), in_shardings=(s, refsim.NamedSharding(mesh, P(None, "y"))),
                     out_shardings=(s,) * 4, partitioner="shardy", axis_types="explicit" if explicit else "auto")


def _chain_numpy():
    """The chain by hand: each call gives g's output and the next carry clip(round(o * 4) / 4, -16, 16)."""
    c, outs = X, []
    for _ in range(3):
        o = c * 2 + Y
        outs.append(o)
        c = np.clip(np.round(o * 4) / 4, -16, 16)
    return [c] + outs


@pytest.mark.parametrize("explicit", [False, True])
def test_a_jit_chain_across_device_orders_gives_numpys_values_where_each_call_put_them(explicit):
    case = _chain_case(explicit)
    want = _chain_numpy()
    meshes = [case.mesh] + [s.mesh for s in case.out_shardings[2:]]
    assert [tuple(m.axis_names) for m in meshes] == [("x", "y"), ("y", "x"), ("x", "y")]
    assert np.asarray(meshes[1].device_ids).tolist() == [[7, 2], [5, 0], [3, 6], [1, 4]]
    for api in (refsim, xla_backend):
        got = case.run(api)
        assert len(got) == 4
        for k, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(np.asarray(g), w, err_msg=f"{api.__name__} output {k}")
        # call 1's output P('x', 'y') on the 4x2 (y, x) mesh: device 0 sits at mesh position (1, 1)
        # (y = 1 of 4, x = 1 of 2), so it holds rows 4:8 of x and columns 1 of 4 along y
        idx = {int(s.device_id): s.index for s in got[2].shards}
        assert idx[0] == (slice(4, 8), slice(1, 2))
        assert {int(s.device_id) for s in got[3].shards} == set(range(8))
    assert run_judged(case) == "pass"


def test_a_jit_chain_case_file_and_reproducer_keep_its_meshes():
    case = _chain_case()
    again = case_from_data(case_to_data(case))
    assert again.out_shardings == case.out_shardings and again.source == case.source
    repro = case.repro(case.run(refsim))
    assert "CHAIN = [" in repro and "(7, 2, 5, 0, 3, 6, 1, 4)" not in repro and "[7, 2, 5, 0, 3, 6, 1, 4]" in repro
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", repro], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # the reproducer checks values: a wrong expectation makes it fail
    wrong = _chain_case()
    wrong_out = list(wrong.run(refsim))
    wrong_out[1] = refsim.device_put(np.asarray(wrong_out[1]) + 1, wrong_out[1].sharding)
    bad = wrong.repro(tuple(wrong_out))
    proc = subprocess.run([sys.executable, "-c", bad], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_jit_chain_orders_draws_other_device_orders_and_mesh_shapes():
    def moved(c):
        meshes = {(tuple(s.mesh.axis_names), tuple(np.asarray(s.mesh.device_ids).ravel())) for s in c.out_shardings}
        return c.mesh.ndim >= 2 and len({names for names, _ in meshes}) > 1 and len(meshes) > 2

    case = _find("jit_chain_orders", moved)
    assert case.transform == "none" and "def model(a0" in case.source
    outs = case.run(refsim)
    assert [tuple(np.shape(np.asarray(o))) for o in outs] == [tuple(s) for s, _ in assemble(case.graph)[2]]
    run_judged(case)


def test_a_jit_chain_upstream_script_makes_the_calls_and_checks_them():
    from conformance.upstream.script import script_text

    case = _chain_case()
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    want = [np.asarray(o) for o in _chain_numpy()]
    for kw in ({}, {"expected": "embedded", "values": want}):
        text = script_text(case, title="t", about="a", **kw)
        assert "CHAIN = [" in text and "devices by position in DEVICE_IDS" in text
        proc = subprocess.run([sys.executable, "-c", text], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0 and "every shard of every output agrees" in proc.stdout, proc.stdout + proc.stderr
    bad = script_text(case, title="t", about="a", expected="embedded", values=[w + 1 for w in want])
    proc = subprocess.run([sys.executable, "-c", bad], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0 and "elements differ" in proc.stdout, proc.stdout + proc.stderr


def test_jax_09_draws_no_arithmetic_on_a_reduced_value():
    # jax 0.9.2 refuses `w * 2.0 + 1.0` on a reduced value (refsim.compat.reduced_takes_constants); later JAX allow it
    from hypothesis import given, settings

    @settings(max_examples=30, database=None, deadline=None)
    @given(sharded_programs(Mesh((2, 2), ("x", "y")), ops=("unreduced_add", "reduced_dot"), axis_types=("explicit",),
                            max_ops=3, dtypes=("float32",), transforms=("none",)))
    def check(case):
        arith = re.search(r"= v\d+ \* 2(\.0)? \+ 1", case.source) is not None
        assert not arith or compat.reduced_takes_constants(), case.source

    check()


def test_a_chain_with_a_multi_axis_ppermute_keeps_the_mesh_axis_order():
    # found-bugs 38: a ppermute over axes out of mesh order permutes wrongly on jax 0.9 / 0.10 and raises on 0.11+
    case = _find("jit_chain_orders", lambda c: "ppermute(x, (" in c.source and c.mesh.size > 1,
                 mesh=Mesh((2, 2), ("x", "y")), ops=("shard_map_ppermute", "sin"))
    assert {tuple(s.mesh.axis_names) for s in case.out_shardings} == {tuple(case.mesh.axis_names)}
    run_judged(case)


@needs_unreduced
def test_unreduced_values_are_subtracted_only_where_jax_has_the_rule():
    from hypothesis import find, settings
    from test_strategies_sharded import FIND, SAFE_MESHES

    sub = lambda c: re.search(r"unreduced=\{[^}]*\}\)\) - jax\.lax\.reduce_sum", c.source) is not None  # noqa: E731
    strategy = sharded_programs(SAFE_MESHES, ops=("unreduced_add",), max_ops=2, axis_types=("explicit",),
                                transforms=("none", "grad"), partitioners=("shardy",), dtypes=("float32", "int32"))
    if not compat.unreduced_subtracts():   # jax 0.9 … 0.11: "unreduced rule for sub is not implemented"
        with pytest.raises(Exception, match="No examples"):
            find(strategy, sub, settings=settings(FIND, max_examples=300))
        return
    case = find(strategy, sub, settings=FIND)
    assert_traces_as_modelled(case)
    run_judged(case)


@needs_unreduced
@pytest.mark.skipif(not compat.unreduced_subtracts(), reason="JAX before 0.12 has no unreduced rule for sub")
def test_unreduced_partial_sums_subtract():
    case = _explicit_case(
        ("v1 = jax.lax.reduce_sum(a0, (0,), out_sharding=P(None, unreduced={'x'})) - "
         "jax.lax.reduce_sum(a1, (0,), out_sharding=P(None, unreduced={'x'}))",
         "v2 = jax.sharding.reshard(v1, P('y'))"),
        ("unreduced_add", "reshard"), (("v2", (4,), "float32", 0.0),), ("a0", "a1"), (P("x", None), P("x", None)),
        (P("y"),))
    for api in (refsim, xla_backend):
        np.testing.assert_array_equal(np.asarray(case.run(api)[0]), X.sum(0) - Y.sum(0))
    assert run_judged(case) == "pass"


def test_shard_map_nested_draws_no_reduced_value_with_a_constant():
    """Inside a manual region JAX refuses a reduced value combined with a constant (an AssertionError
    on 0.10, a ShardingTypeError on 0.12, on both sides), which `unreduced_add` and `reduced_dot` draw:
    the shard_map_nested class leaves them out on Explicit meshes (the default run on 0.10.2, seed 30)."""
    from conformance.strategies.sharded import sharded_programs
    from conformance.suites.base import draw

    cases = draw(sharded_programs(max_devices=8, classes=("shard_map_nested",), axis_types=("explicit",),
                                  ops=("unreduced_add", "reduced_dot", "add", "sin")), 30, 7)
    assert cases
    for c in cases:
        ops = c.case_id.split("ops=")[1].split(",")[0].split("+")
        assert "unreduced_add" not in ops and "reduced_dot" not in ops, c.case_id


def test_shard_map_nested_differentiates_no_explicit_gather():
    """The pullback of ``x.at[idx].get(out_sharding=...)`` in a manual region closes over Explicit-typed
    indices, which JAX refuses on both sides (NotImplementedError "Closing over inputs to shard_map where
    the input is sharded on `Explicit` axes", 0.10 and 0.12; the 0.12 shard_map_nested hunt): on Explicit
    meshes the class draws no `at_get` under grad / vjp, and still draws it forward."""
    from conformance.strategies.sharded import sharded_programs
    from conformance.suites.base import draw

    def ops_of(c):
        return c.case_id.split("ops=")[1].split(",")[0].split("+")

    back = draw(sharded_programs(max_devices=8, classes=("shard_map_nested",), axis_types=("explicit",),
                                 transforms=("grad", "vjp"), ops=("at_get", "sin")), 30, 7)
    assert back and all("at_get" not in ops_of(c) for c in back), [c.case_id for c in back]
    fwd = draw(sharded_programs(max_devices=8, classes=("shard_map_nested",), axis_types=("explicit",),
                                transforms=("none",), ops=("at_get", "sin")), 30, 7)
    assert any("at_get" in ops_of(c) for c in fwd)
