"""Meta-tests of the program-class variants that move values without changing them: the jit's own
in/out shardings in memory kinds (``host_offload``), jit chains across device orders and mesh
shapes (``jit_chain_orders``), and reduced / unreduced values through arithmetic and gradients
(the ``unreduced_add`` / ``reduced_dot`` ops). Expected values are NumPy's, never the engines'."""
import os
import subprocess
import sys

import numpy as np
import pytest

import refsim
import xla_backend
from conformance.hunt import case_from_data, case_to_data
from conformance.strategies._program_classes import memory_kinds
from conformance.strategies.sharded import Graph, make_case
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
