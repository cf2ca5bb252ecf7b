"""No false alarms: at the default settings `explain` finds no divergence on healthy programs.

Over 200 programs: the corpus, the op catalogue, the examples/ models and seven drawn programs
per family of the programs generator (jax 0.10's ppermute over axes out of mesh order is a real
lowering bug and must still be localised to the lowering; a catalogue program whose bfloat16
roundings XLA:CPU's passes elide is a real compiler difference and must stay one).
"""
import importlib

from conformance.debug.explain import explain, op_catalogue
from conformance.debug.explain.core import explain_case
from conformance.debug.explain.corpus_check import check_corpus
from refsim import compat

# real differences, each localised where it arises (they are not counted as healthy)
KNOWN = {"catalogue:bfloat16_and_half": "compiler"}  # XLA:CPU computes bf16 products in f32 (no rounding)


def test_no_divergence_on_two_hundred_healthy_programs():
    from conformance.strategies.programs import FAMILIES
    from conformance.suites import base, programs as suite

    verdicts = {}
    for row in check_corpus():
        verdicts[f"corpus:{row.name}"] = (row.diverged_in, row.status)
    for name, fn, args in op_catalogue.programs():
        e = explain(fn, *args)
        verdicts[f"catalogue:{name}"] = (e.diverged_in, e.headline())
    for name in ("transformer_jit", "transformer_fsdp", "pipeline", "moe"):
        mod = importlib.import_module(f"examples.{name}")
        e = explain(mod.train_step, *mod.init())
        verdicts[f"examples:{name}"] = (e.diverged_in, e.headline())
    for fam in FAMILIES:
        for case in base.draw(suite.strategy(fam, None, 8), 7, 7):
            if case.entry == "device_put":
                continue
            e = explain_case(case)
            if (e.diverged_in == "lowering" and "ppermute" in case.source
                    and not compat.ppermute_axes_must_follow_mesh_order()):
                assert e.op == "stablehlo.collective_permute", e.report()
                continue  # the live jax 0.10 lowering bug, found where it is
            verdicts[f"drawn:{case.case_id}"] = (e.diverged_in, e.headline())
    for name, stage in KNOWN.items():
        assert verdicts.pop(name)[0] == stage, name
    false_alarms = {k: v for k, v in verdicts.items() if v[0] is not None}
    assert not false_alarms, false_alarms
    assert len(verdicts) >= 200, len(verdicts)
