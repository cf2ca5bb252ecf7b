"""Every op of the modules JAX lowers and XLA:CPU compiles runs in refsim.stablehlo.

The modules are the corpus's, the examples/ models' training steps, the op catalogue's
(`conformance.debug.explain.op_catalogue`: one program per remaining lax family) and one drawn
program per family of the programs generator, each lowered and compiled by the installed JAX.
A missing op fails here instead of leaving a stage of `conformance.explain` unevaluated.
"""
import pytest

from conformance.debug.explain import coverage as C
from conformance.debug.explain import op_catalogue


@pytest.fixture(scope="module")
def modules():
    return C.collect(drawn=1)


def test_every_op_has_a_rule(modules):
    cov = C.coverage(modules)
    assert cov.modules >= 150, cov.render()
    assert not cov.missing, cov.render()
    assert cov.percent == 100.0
    for op in ("stablehlo.sort", "stablehlo.scatter", "stablehlo.select_and_scatter", "stablehlo.convolution",
               "stablehlo.fft", "stablehlo.all_reduce", "stablehlo.reduce_window", "mhlo.fusion",
               "stablehlo.custom_call @TopK", "stablehlo.custom_call @lapack_spotrf_ffi"):
        assert op in cov.ops, op


def test_only_modules_xla_cpu_cannot_build_are_left_out(modules):
    left = {(m.source, m.stage) for m in modules if m.module is None}
    assert left <= {("corpus:ragged_all_to_all_moe_dispatch", "compiled"), ("corpus:pbroadcast_from_source", "compiled"),
                    ("corpus:pbroadcast_in_loop", "compiled")}, left


@pytest.mark.parametrize("name", [n for n, _, _ in op_catalogue.programs()])
def test_catalogue_programs_run_at_every_stage(name):
    from conformance.debug.explain import explain

    ((_, fn, args),) = [p for p in op_catalogue.programs() if p[0] == name]
    e = explain(fn, *args)
    assert all(s.status == "evaluated" for s in e.stages), e.report()
