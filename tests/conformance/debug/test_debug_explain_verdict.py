"""conformance.explain never guesses: a stage it cannot evaluate is named, never skipped over.

The verdict is checked on hand-built stage results (the rule itself) and on real programs
where a stage is made unevaluable by withdrawing one of refsim.stablehlo's rules, and where
XLA's verifier rejects a module edited before compiling (a compiler crash).
"""
import numpy as np
import pytest

import jax
from jax import lax

import xla_backend
from conformance.debug.explain import explain
from conformance.faults import compiler as planted
from conformance.debug.explain.core import localise
from conformance.debug.explain.stages import Stage
from refsim.stablehlo.registry import OPS, load
from conformance.faults import lowering as faults

P = jax.sharding.PartitionSpec
X = (np.arange(16, dtype=np.float32).reshape(8, 2) + 1) * np.array([1, -3], np.float32)
IDS = list(range(4))


def _stage(name, value=None, status="evaluated", reason=None):
    out = None if value is None else [np.full((4, 2), value, np.float32)]
    return Stage(name, outputs=out, status=status, reason=reason)


def _missing(name):
    return _stage(name, status="not evaluated", reason="missing rule: stablehlo.scatter")


def test_all_evaluated_and_equal_is_the_only_agreement():
    e = localise([_stage("jaxpr", 1.0), _stage("lowered", 1.0), _stage("compiled", 1.0), _stage("executed", 1.0)], IDS)
    assert (e.diverged_in, e.complete, e.headline()) == (None, True, "all stages agree")


def test_neighbouring_stages_that_differ_name_their_boundary_and_label_the_values():
    e = localise([_stage("jaxpr", 1.0), _stage("lowered", 1.0), _stage("compiled", 2.0), _stage("executed", 2.0)], IDS)
    assert e.diverged_in == "compiler" and e.compared == ("lowered", "compiled")
    assert "device 0 element [0]: lowered 1.0, compiled 2.0" in e.report()


def test_a_difference_across_unevaluated_stages_is_undetermined_between_their_boundaries():
    e = localise([_stage("jaxpr", 1.0), _missing("lowered"), _missing("compiled"), _stage("executed", 2.0)], IDS)
    assert e.diverged_in == "undetermined" and e.op is None
    assert e.candidates == ["lowering", "compiler", "backend"]
    assert e.not_evaluated == {"lowered": "missing rule: stablehlo.scatter",
                               "compiled": "missing rule: stablehlo.scatter"}
    assert e.headline().startswith("diverged in: undetermined between lowering, compiler and backend (lowered not "
                                   "evaluated (missing rule: stablehlo.scatter)")
    # the values shown are the two stages actually compared, named as such
    assert e.compared == ("jaxpr", "executed")
    assert "jaxpr 1.0, executed 2.0" in e.report()
    assert "compiled" not in e.report().split("devices that differ")[1].split("\n")[1]


def test_one_unevaluated_stage_leaves_two_candidates():
    e = localise([_stage("jaxpr", 1.0), _stage("lowered", 1.0), _missing("compiled"), _stage("executed", 3.0)], IDS)
    assert (e.diverged_in, e.candidates) == ("undetermined", ["compiler", "backend"])
    assert e.agrees == {"lowered": True, "compiled": None, "executed": False}
    assert "lowered 1.0, executed 3.0" in e.report()


def test_no_difference_with_a_stage_missing_is_not_called_agreement():
    e = localise([_stage("jaxpr", 1.0), _missing("lowered"), _stage("compiled", 1.0), _stage("executed", 1.0)], IDS)
    assert e.diverged_in is None and not e.complete
    assert "all stages agree" not in e.report()
    assert e.headline() == ("no divergence found, but not every stage was compared: lowered not evaluated (missing "
                            "rule: stablehlo.scatter)")


def test_nothing_compared_is_undetermined():
    e = localise([_stage("jaxpr", 1.0), _missing("lowered"), _missing("compiled"),
                  _stage("executed", status="not evaluated", reason="not compiled")], IDS)
    assert e.diverged_in == "undetermined" and e.candidates == [] and not e.complete
    assert "all stages agree" not in e.report()


def test_a_crashed_stage_is_its_boundary_with_xla_message():
    crashed = _stage("compiled", status="crashed", reason="XLA failed to compile it (hlo verifier): bad pair")
    e = localise([_stage("jaxpr", 1.0), _stage("lowered", 1.0), crashed,
                  _stage("executed", status="not evaluated", reason="not compiled")], IDS)
    assert (e.diverged_in, e.crash) == ("compiler", "XLA failed to compile it (hlo verifier): bad pair")
    assert e.headline() == "diverged in: compiler (crash: XLA failed to compile it (hlo verifier): bad pair)"


def test_an_earlier_difference_comes_before_a_later_crash():
    crashed = _stage("compiled", status="crashed", reason="XLA failed to compile it: x")
    e = localise([_stage("jaxpr", 1.0), _stage("lowered", 2.0), crashed,
                  _stage("executed", status="not evaluated", reason="not compiled")], IDS)
    assert e.diverged_in == "lowering" and e.crash is None


# -- real programs ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def m8():
    return xla_backend.mesh((8,), ("i",))


@pytest.fixture
def without_rule(monkeypatch):
    """Withdraw refsim.stablehlo's rule for an op for one test (as if it had none)."""
    load()

    def drop(name):
        monkeypatch.delitem(OPS, name)

    return drop


def test_lowering_fault_with_the_reduction_uninterpretable_is_undetermined(m8, without_rule):
    without_rule("stablehlo.all_reduce")
    with faults.inject("psum_drop_member"):
        e = explain(lambda a: lax.psum(a, "i"), X, mesh=m8, in_specs=P("i"), out_specs=P())
    assert e.diverged_in == "undetermined", e.report()
    assert e.candidates == ["lowering", "compiler", "backend"]
    assert e.not_evaluated["lowered"] == "missing rule: stablehlo.all_reduce"
    assert e.stages[1].status == "not evaluated" and e.stages[2].status == "not evaluated"
    assert "missing rule: stablehlo.all_reduce" in e.report()


def test_healthy_program_with_a_stage_missing_does_not_claim_every_stage_agrees(m8, without_rule):
    without_rule("stablehlo.all_reduce")
    e = explain(lambda a: lax.psum(a, "i"), X, mesh=m8, in_specs=P("i"), out_specs=P())
    assert e.diverged_in is None and e.complete is False, e.report()
    assert "all stages agree" not in e.report()
    assert e.agrees["executed"] is True  # compared with jaxpr, the last stage evaluated before it


def test_compiler_fault_with_the_permute_uninterpretable_is_undetermined(m8):
    # a module edited before XLA compiles it: only refsim.stablehlo's compiled stage would show it
    def f(a):
        return lax.ppermute(a, "i", [(j, (j + 1) % 8) for j in range(8)])

    e = explain(f, X, mesh=m8, in_specs=P("i"), out_specs=P("i"), edit_module=planted.reversed_permute_pairs)
    assert e.diverged_in == "compiler", e.report()
    ops = {op.name for op in e.stages[2].program.ops if op is not None}
    only_compiled = sorted(o for o in ops if o.startswith("mhlo.") or o == "stablehlo.collective_permute")
    assert "stablehlo.collective_permute" in only_compiled
    saved = OPS.pop("stablehlo.collective_permute")
    try:
        e = explain(f, X, mesh=m8, in_specs=P("i"), out_specs=P("i"), edit_module=planted.reversed_permute_pairs)
    finally:
        OPS["stablehlo.collective_permute"] = saved
    assert e.diverged_in == "undetermined", e.report()
    assert e.candidates == ["lowering", "compiler", "backend"]
    assert e.compared == ("jaxpr", "executed")


def test_compile_failure_is_a_classified_compiler_crash(m8):
    def f(a):
        return lax.ppermute(a, "i", [(j, (j + 1) % 8) for j in range(8)])

    e = explain(f, X, mesh=m8, in_specs=P("i"), out_specs=P("i"), edit_module=planted.permute_to_missing_device)
    assert e.diverged_in == "compiler" and e.crash, e.report()
    assert "XLA failed to compile it" in e.crash and "4096" in e.crash
    assert e.stages[2].status == "crashed" and e.stages[3].status == "not evaluated"
    assert e.agrees["lowered"] is True
    assert e.report().startswith("diverged in: compiler (crash: XLA failed to compile it")


def _ring(a):
    return lax.ppermute(a, "i", [(j, (j + 1) % 8) for j in range(8)])


def test_lowering_xla_rejects_is_a_compiler_crash_in_explain(m8):
    with faults.inject(planted.PERMUTE_TO_MISSING_DEVICE):
        e = explain(_ring, X, mesh=m8, in_specs=P("i"), out_specs=P("i"))
    # the lowered module itself names device 4096: refsim.stablehlo refuses it, and XLA's verifier
    # rejects it before any pass runs; the crash is the compile's, with a note pointing at its input
    assert e.diverged_in == "compiler" and e.crash, e.report()
    assert e.stages[1].status == "not evaluated" and "4096" in e.stages[1].reason
    assert e.stages[2].status == "crashed" and "4096" in e.stages[2].reason
    assert any("before any pass ran" in n for n in e.notes), e.notes


def test_check_raises_a_classified_xla_error_on_a_compile_crash():
    import conformance

    mesh = jax.make_mesh((8,), ("i",))
    with faults.inject(planted.PERMUTE_TO_MISSING_DEVICE):
        with pytest.raises(conformance.XlaError) as info:
            conformance.check(_ring, X, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    err = info.value
    assert err.stage == "compiler" and not err.unsupported
    assert isinstance(err, conformance.ConformanceError) and isinstance(err, jax.errors.JaxRuntimeError)
    assert isinstance(err.error, jax.errors.JaxRuntimeError) and err.repro_path is None
    assert str(err).startswith("XLA failed to compile ") and "compiler crash" in str(err) and "4096" in str(err)
