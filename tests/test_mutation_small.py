"""The mutation run in a small form: a few faults, a small budget, so that a change that
weakens the strategies (no strided groups, no 3-cycles, no permuted device orders, axes
only in mesh order) makes a fault survive and this test fail."""
import sys
import types

import numpy as np
import pytest

import jax

from conformance import mutate
from conformance.results import CaseResult
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


def test_runner_engine_counts_cases_that_passed_in_the_baseline(monkeypatch):
    """The runner engine against the documented `conformance.runner.run` interface."""
    import refsim
    import xla_backend

    mesh = xla_backend.mesh((8,), ("i",))
    x = np.arange(8.0).reshape(8, 1)
    ring = lambda a: jax.lax.ppermute(a, "i", [(i, (i + 1) % 8) for i in range(8)])
    index = lambda a: a + jax.lax.axis_index("i").astype(a.dtype)
    calls = []

    def run(*, suite, examples, seed, platform, devices, report_dir, progress):
        calls.append((suite, examples, seed, platform, devices, report_dir, progress))
        results = []
        for name, f in (("ring", ring), ("index", index)):
            want = np.asarray(refsim.shard_map(f, mesh=mesh, in_specs=(P("i"),), out_specs=P("i"))(x))
            got = np.asarray(xla_backend.shard_map(f, mesh=mesh, in_specs=(P("i"),), out_specs=P("i"))(x))
            status = "pass" if np.array_equal(want, got) else "fail"
            results.append(CaseResult(f"{name}[mesh=8:default]", "collectives", name, "float32", status,
                                      examples=3, message=f"{name}: {status}", repro_path=f"/r/{name}.py"))
        results.append(CaseResult("broken[mesh=8:default]", "collectives", "broken", "float32", "fail"))
        return types.SimpleNamespace(results=results)

    monkeypatch.setitem(sys.modules, "conformance.runner", types.SimpleNamespace(run=run))
    outcomes = mutate.run(["ppermute_pairs_reversed", "psum_drop_member"], examples=7, seed=3, engine="runner",
                          platform="cpu")
    killed, survived = outcomes
    assert (killed.status, killed.case, killed.examples, killed.repro_path) == \
        ("killed", "ring[mesh=8:default]", 3, "/r/ring.py")
    assert killed.source == "collectives/ring"
    assert survived.status == "survived"           # "broken" fails in the baseline too: no kill
    assert calls[0] == ("all", 7, 3, "cpu", 8, None, False) and len(calls) == 3


def test_runner_engine_needs_the_runner(monkeypatch):
    monkeypatch.setitem(sys.modules, "conformance.runner", None)
    with pytest.raises(ValueError, match="engine='runner' needs conformance.runner.run"):
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
    assert "--examples=0: must be >= 1" in capsys.readouterr().err


def test_table_format():
    outs = [mutate.Outcome("a_fault", "killed", 3, "collective_calls[psum]", "psum[axes=x]", "mismatch: X"),
            mutate.Outcome("b_fault", "survived"), mutate.Outcome("c_fault", "n/a", detail="no CPU lowering")]
    text = mutate.format_table(outs)
    assert text.splitlines()[0].split() == ["fault", "result", "examples", "killed", "by", "shrunk", "failing", "case"]
    assert "mutation score: 1/2 killed (50%); 1 not applicable on this platform" in text
    assert "[a_fault] psum[axes=x]\n    mismatch: X" in text
