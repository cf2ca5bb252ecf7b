"""The mutation run in a small form: a few faults, a small budget, so that a change that
weakens the strategies (no strided groups, no 3-cycles, no permuted device orders, axes
only in mesh order) makes a fault survive and this test fail."""
import sys

import numpy as np
import pytest

import jax

from conformance.engine import mutate
from refsim import PartitionSpec as P

# Each fault needs one strategy feature to be killed.
SMALL = {
    "ppermute_pairs_reversed": "permutations() with a cycle of 3+ or a chain",
    "groups_strided_as_contiguous": "axis_index_groups() of kind strided",
    "multi_axis_mesh_order": "collective axes drawn out of mesh order",
    "reshard_permutation_ignored": "reshards onto a permuted device order",
}


def small_sources():
    """Public strategies on small meshes chosen so each feature is reachable: 1-D meshes of 4 or
    8 devices (strided groups need a proper divisor) and 2-3 axes of size 2 or 4 (the order
    of two real axes matters)."""
    from conformance import strategies
    from conformance.strategies.programs import programs

    flat = strategies.meshes(max_axes=1, sizes=(4, 8), max_devices=8)
    multi = strategies.meshes(min_axes=2, max_axes=3, sizes=(2, 4), max_devices=8)
    return [
        mutate.Source("collective_calls[ppermute]", frozenset({"ppermute"}),
                      strategies.collective_calls(flat, collectives=("ppermute",))),
        mutate.Source("collective_calls[all_gather] 1-D", frozenset({"all_gather"}),
                      strategies.collective_calls(flat, collectives=("all_gather",))),
        mutate.Source("collective_calls[all_gather] n-D", frozenset({"all_gather"}),
                      strategies.collective_calls(multi, collectives=("all_gather",))),
        mutate.Source("programs[reshard_device_order]", frozenset({"reshard"}),
                      programs(multi, families=("reshard_device_order",))),
    ]


@pytest.mark.parametrize("seed", [0])
def test_small_mutation_run_kills_every_fault(seed):
    outcomes = mutate.run(list(SMALL), examples=60, seed=seed, engine="direct", shrink_calls=3,
                          sources=small_sources())
    table = mutate.format_table(outcomes)
    survivors = {o.fault: SMALL[o.fault] for o in outcomes if o.status != "killed"}
    assert not survivors, f"faults survived; the strategies no longer draw: {survivors}\n{table}"
    assert mutate.score(outcomes) == (len(SMALL), len(SMALL))
    for o in outcomes:
        assert o.examples >= 1 and o.source and o.case, o
        assert o.detail.startswith(("mismatch", "crash")), o.detail
    assert "mutation score: 4/4 killed (100%)" in table


def test_faults_xla_cpu_cannot_run_are_not_applicable_on_cpu():
    outcomes = mutate.run(["pbroadcast_wrong_source", "ragged_all_to_all_single_device_offsets"],
                          examples=1, engine="direct", platform="cpu", sources=[])
    assert [o.status for o in outcomes] == ["n/a", "n/a"]
    assert mutate.score(outcomes) == (0, 0)
    assert "XLA:CPU cannot run the targeted op" in outcomes[0].detail


def test_a_disagreement_without_the_fault_is_not_a_kill():
    # XLA and refsim "disagree" here whatever the fault: refsim's side is made wrong on purpose.
    import xla_backend

    mesh = xla_backend.mesh((8,), ("i",))
    x = np.arange(8.0).reshape(8, 1)
    f = lambda a: jax.lax.ppermute(a, "i", [(i, (i + 1) % 8) for i in range(8)])
    run_xla = lambda: xla_backend.shard_map(f, mesh=mesh, in_specs=(P("i"),), out_specs=P("i"))(x)
    wrong_ref = lambda: xla_backend.shard_map(lambda a: a, mesh=mesh, in_specs=(P("i"),), out_specs=P("i"))(x)
    kind, _ = mutate.fault_verdict("ppermute_pairs_reversed", wrong_ref, run_xla)
    assert kind == "baseline"
    import refsim

    right_ref = lambda: refsim.shard_map(f, mesh=mesh, in_specs=(P("i"),), out_specs=P("i"))(x)
    assert mutate.fault_verdict("ppermute_pairs_reversed", right_ref, run_xla)[0] == "mismatch"
    assert mutate.fault_verdict("axis_index_reversed", right_ref, run_xla)[0] == "agree"


# A small plan with one case per new fault class that should kill it (the runner engine runs them
# in fault-injecting workers, as `conformance run` runs cases).
def _small_plan():
    from conformance.cases import CollectiveCall, Program
    from conformance.suites import base
    from refsim import Mesh, NamedSharding

    m21, m4 = Mesh((2, 1), ("x", "y")), Mesh((4,), ("x",))
    nan = np.float32([np.nan, 1.0, np.nan, -2.0])
    near_one = 1 + (np.arange(4, dtype=np.float32) % 4) * np.float32(2.0 ** -10)

    def call(name, mesh, axis, x, body, outputs):
        return CollectiveCall(family=name, source=f"def f(a):\n    return {body}\n", entry="shard_map", mesh=mesh,
                              args=(x,), in_specs=(P(mesh.axis_names[0]),), out_specs=P(mesh.axis_names[0]),
                              labels=(("axes", repr(axis)),), outputs=outputs, name=name, params={"axis_name": axis})

    def jit(family, body, spec_in, spec_out):
        x = np.arange(16, dtype=np.float32).reshape(4, 4)
        return Program(family=family, source=body, entry="jit", mesh=m4, args=(x,),
                       in_shardings=(NamedSharding(m4, spec_in),), out_shardings=NamedSharding(m4, spec_out))

    cases = [
        call("pmax", m21, "y", nan, "jax.lax.pmax(a, 'y')", ("exact_unsigned_zero",)),   # NaN in size-1 groups
        call("psum", m4, "x", near_one, "jax.lax.psum(a, 'x')", ("sum",)),
        call("axis_index", m4, "x", np.zeros(4, np.float32), "a + jax.lax.axis_index('x').astype(a.dtype)", ("exact",)),
        jit("jit_shardings", "def f(a):\n    return (a * 2 + a.sum(axis=0, keepdims=True)).T\n", P("x", None), P()),
        jit("jit_constraint", "def f(a):\n    b = jax.lax.with_sharding_constraint(a + 1, P('x', None))\n"
                              "    return b * b - a\n", P(), P()),
    ]
    return [t for c in cases for t in base.group_tasks("programs" if c.entry == "jit" else "collectives", [c],
                                                       seed=0, variants=1)]


def test_runner_engine_kills_new_fault_classes_in_workers_and_a_fault_no_case_reaches_survives(monkeypatch):
    # Three of the new classes (the model-masked NaN drop, and the two jit-path faults), and one fault
    # no planned case exercises; every fault costs a worker start, so CI runs only these.
    from conformance.engine import runner

    plan = _small_plan()
    monkeypatch.setattr(runner, "plan_tasks", lambda *a, **k: plan)
    names = ["pmax_pmin_drop_nan", "partitioned_reduction_drops_shard", "sharding_constraint_wrong_permutation",
             "all_gather_reversed_order"]
    outcomes = mutate.run(names, engine="runner", platform="cpu", processes=1, case_timeout=120)
    table = mutate.format_table(outcomes)
    assert [o.status for o in outcomes] == ["killed", "killed", "killed", "survived"], table
    by = {o.fault: o for o in outcomes}
    assert by["pmax_pmin_drop_nan"].case.startswith("pmax[")      # the XLA:CPU model entry did not mask it
    assert by["partitioned_reduction_drops_shard"].source == "programs/jit_shardings"
    assert by["sharding_constraint_wrong_permutation"].source == "programs/jit_constraint"
    assert f"{len(plan)} cases ({len(plan)} examples) ran without a failure" in by["all_gather_reversed_order"].detail


def test_runner_engine_needs_the_runner(monkeypatch):
    monkeypatch.setitem(sys.modules, "conformance.engine.runner", None)
    with pytest.raises(ValueError, match="engine='runner' needs conformance.engine.runner.plan_tasks"):
        mutate.run(["axis_index_reversed"], engine="runner")


def test_cli_lists_faults_and_rejects_unknown_names(capsys):
    assert mutate.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "ppermute_pairs_reversed" in out and "output_shards_swapped" in out
    with pytest.raises(SystemExit) as e:
        mutate.main(["--faults", "psum_wrong", "--engine", "direct"])
    assert e.value.code == 2
    assert "unknown fault 'psum_wrong' in --faults" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mutate.main(["--examples", "0"])
    assert "argument --examples: 0 must be >= 1" in capsys.readouterr().err


def test_table_format():
    outs = [mutate.Outcome("a_fault", "killed", 3, "collective_calls[psum]", "psum[axes=x]", "mismatch: X"),
            mutate.Outcome("b_fault", "survived"), mutate.Outcome("c_fault", "n/a", detail="no CPU lowering")]
    text = mutate.format_table(outs)
    assert text.splitlines()[0].split() == ["fault", "result", "examples", "killed", "by", "killing", "case"]
    assert "mutation score: 1/2 killed (50%); 1 not applicable on this platform" in text
    assert "[a_fault] psum[axes=x]\n    mismatch: X" in text
