"""The programs suite's corpus programs that state a tolerance are held to the tighter of it and
the allowed set (conformance.suites.programs.stated_policies): a planted error the stated bound
admits is caught where the allowed set is tighter, and XLA's own results pass."""
import jax
import numpy as np

import refsim
import xla_backend
from conformance.cases.corpus import _entry, by_name
from conformance.suites import programs
from conformance.verdict import allowed, compare


def _leaves(out):
    return jax.tree_util.tree_leaves(out, is_leaf=lambda x: hasattr(x, "shards"))


def _planted(arr, ulps):
    """refsim's Array `arr` with every element moved `ulps` float32 spacings away from zero."""
    shards = [refsim.Shard(s.device_id, s.index, (np.asarray(s.data) + ulps * np.spacing(np.abs(s.data))
                                                  * np.sign(s.data)).astype(np.asarray(s.data).dtype), s.replica_id)
              for s in arr.shards]
    return refsim.Array(arr.shape, arr.dtype, arr.sharding, shards)


def test_softmax_tanh_psum_is_held_tighter_than_its_stated_37_ulp():
    prog = by_name("softmax_tanh_psum")
    assert prog.ulp == 37
    mesh = prog.refsim_mesh()
    inputs = prog.inputs(0)
    (want,) = _leaves(_entry(prog, refsim, mesh)(*inputs))
    (got,) = _leaves(_entry(prog, xla_backend, mesh)(*inputs))
    (pol,) = programs.stated_policies(prog, mesh, inputs, [want])
    assert isinstance(pol, allowed.AllowedSet)
    assert all(pol.governed(d).all() for d in pol.abs_sum)        # every element held to its allowed set
    assert compare.compare(want, got, tolerances=[pol]).ok        # XLA's own result agrees
    planted = _planted(want, 30)                                  # within 37 ulp of refsim everywhere
    assert compare.compare(want, planted, ulp=37).ok
    assert not compare.compare(want, planted, tolerances=[pol]).ok


def test_dp_mlp_two_steps_keeps_its_stated_tolerance_where_the_allowed_set_is_undecidable():
    prog = by_name("dp_mlp_two_steps_scan")
    mesh = prog.refsim_mesh()
    inputs = prog.inputs(0)
    want = _leaves(_entry(prog, refsim, mesh)(*inputs))
    pols = programs.stated_policies(prog, mesh, inputs, want)
    for p, w in zip(pols, want):
        assert isinstance(p, allowed.AllowedSet) and p.judge_undecidable
        ref, bound = p.reference_and_bound(next(iter(p.abs_sum)), w.dtype)
        assert np.isfinite(bound).all()                           # nothing left unjudged
    assert programs.check_corpus("dp_mlp_two_steps_scan", xla_backend).status == "pass"
