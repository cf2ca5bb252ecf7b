"""conformance.upstream.shrink: fewer devices in the same relative order, earlier values, the greedy loop."""
import numpy as np

from conformance.suites import base
from conformance.suites import sharded as suite_mod
from conformance.upstream.shrink import earlier_values, fewer_devices, greedy


def _drawn(count=8, seed=77):
    return base.draw(suite_mod.strategy("sharded", None, 8), count, seed)


def test_fewer_devices_keep_the_specs_and_the_relative_device_order():
    case = next(c for c in _drawn() if c.mesh.size == 8)
    variants = list(fewer_devices(case))
    assert variants and all(v.mesh.size < case.mesh.size for v in variants)
    for v in variants:
        ids = np.asarray(v.mesh.device_ids)
        assert sorted(ids.ravel().tolist()) == list(range(v.mesh.size))     # renumbered 0..n-1
        assert v.mesh.axis_names == case.mesh.axis_names and v.source == case.source
        assert [s.spec for s in v.in_shardings] == [s.spec for s in case.in_shardings]
    rev = next(c for c in _drawn(8, 5) + _drawn(8, 6) + _drawn(8, 7) if "reversed" in c.case_id and c.mesh.size > 2)
    for v in fewer_devices(rev):
        flat = np.asarray(v.mesh.device_ids).ravel()
        assert list(flat) == sorted(flat, reverse=True)                      # a reversed order stays reversed


def test_earlier_values_drop_the_ops_after_a_value_earliest_first():
    case = next(c for c in _drawn() if c.graph.transform == "none" and len(c.op_patterns) >= 3)
    variants = list(earlier_values(case))
    assert variants
    assert all(len(v.graph.outs) == 1 and len(v.op_patterns) < len(case.op_patterns) for v in variants)
    assert len(variants[0].op_patterns) <= len(variants[-1].op_patterns)


def test_greedy_takes_the_first_failing_variant_until_none_fails():
    case = next(c for c in _drawn() if c.mesh.size == 8)
    small, steps = greedy(case, lambda c: c.mesh.size >= 2, 60, cuts=(fewer_devices,))
    assert small.mesh.size == 2 and all(cut == "fewer_devices" for cut, _ in steps)
    same, none = greedy(case, lambda c: False, 60)
    assert same is case and none == []
