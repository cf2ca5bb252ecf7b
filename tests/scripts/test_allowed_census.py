"""scripts/allowed_census.py: every element of an inexact sharded output is counted exactly once, and
the counts agree with the policies the suite builds (checked independently on the same cases)."""
import importlib.util
import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("allowed_census", ROOT / "scripts" / "allowed_census.py")
ac = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ac)


def test_census_counts_each_inexact_element_once():
    import refsim
    from conformance.suites import sharded
    from conformance.verdict.allowed import AllowedSet

    c = ac.census(0, examples=1)
    assert c["errors"] == 0 and c["data_sets"] > 0
    assert c["allowed"] + c["value_model"] + c["undecidable"] + c["no_allowed_set"] == c["elements"]
    # the same cases counted by hand: the inexact outputs' element totals per device block
    elements = inexact = 0
    for chunk in sharded.task_chunks(examples=1, seed=0, devices=8):
        for task in chunk:
            for case in task.variants:
                case.run(refsim)
                pols = case.tolerances()
                outs = case.__dict__["_refsim_out"]
                outs = outs if isinstance(outs, (list, tuple)) else [outs]
                for (kind, _), p, out in zip(case.policies, pols, outs):
                    if kind != "exact":
                        inexact += 1
                        elements += sum(np.size(s.data) for s in out.shards)
                        if isinstance(p, AllowedSet):
                            assert set(p.abs_sum) == {int(s.device_id) for s in out.shards}
    assert (c["inexact_outputs"], c["elements"]) == (inexact, elements)
