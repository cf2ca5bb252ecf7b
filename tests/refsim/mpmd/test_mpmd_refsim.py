"""refsim.mpmd: MPMD pipeline layouts (jaxpp semantics) — expected values computed by hand."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import refsim
from conformance.suites.mpmd_checks import THRESHOLD_KINDS, mpmd_cases, refsim_properties, run_refsim
from refsim import Mesh, NamedSharding, P
from refsim.mpmd import (MpmdArray, MpmdMesh, MpmdSharding, group_by_size_threshold, interleaved_order,
                         logically_stacked, mpmd_to_spmd_plan, mpmd_to_spmd_reshard, spmd_to_mpmd_plan,
                         spmd_to_mpmd_reshard)

# mesh ('pp': 2, 'x': 4) with ids 0..7 row-major: group 0 = devices 0-3, group 1 = devices 4-7
MESH = Mesh((2, 4), ("pp", "x"))
MM = MpmdMesh(MESH, "pp")


# -- group_by_size_threshold ---------------------------------------------------------------
@pytest.mark.parametrize("sizes, threshold, expected", [
    ([], 10, []),
    ([3, 4, 5], 7, [[0, 1], [2]]),
    ([8], 5, [[0]]),                       # larger than the threshold: a group of its own
    ([1, 1, 1], 0, [[0], [1], [2]]),      # 0: one per entry
    ([0, 0, 5], 0, [[0, 1], [2]]),        # zero-size entries never pass the threshold
    ([5, 2, 3, 1], 5, [[0], [1, 2], [3]]),  # 2+3 == 5 does not pass it
    ([2, 2, 2], 100, [[0, 1, 2]]),
])
def test_group_by_size_threshold_by_hand(sizes, threshold, expected):
    assert group_by_size_threshold(sizes, threshold) == expected


@given(st.lists(st.integers(0, 50), max_size=12), st.integers(0, 120))
def test_group_by_size_threshold_is_the_sequential_rule(sizes, threshold):
    groups = group_by_size_threshold(sizes, threshold)
    assert [i for g in groups for i in g] == list(range(len(sizes)))
    for k, g in enumerate(groups):
        assert g
        if len(g) > 1:
            assert sum(sizes[i] for i in g) <= threshold
        if k + 1 < len(groups):  # the next group's first entry would have passed the threshold
            assert sum(sizes[i] for i in g) + sizes[groups[k + 1][0]] > threshold


def test_group_by_size_threshold_rejects_bad_input():
    with pytest.raises(ValueError, match=r"threshold=-1 is negative"):
        group_by_size_threshold([1], -1)
    with pytest.raises(TypeError, match="threshold must be an int"):
        group_by_size_threshold([1], True)
    with pytest.raises(ValueError, match=r"sizes\[1\]=-3 is not a byte count"):
        group_by_size_threshold([1, -3], 4)


def test_interleaved_order_and_plans_by_hand():
    # group 0 has entries 0 (1 B) and 1 (5 B); group 1 has 2 (3 B) and 3 (2 B)
    assert interleaved_order([1, 5, 3, 2], [0, 0, 1, 1]) == [1, 2, 0, 3]
    assert interleaved_order([4, 4, 4], [1, 0, 1]) == [1, 0, 2]  # ascending groups, ties in index order
    # weights x mpmd_dim=2: [2, 10, 6, 4] in order [1, 2, 0, 3] -> [10, 6, 2, 4] under 12
    assert spmd_to_mpmd_plan([1, 5, 3, 2], [0, 0, 1, 1], 2, 12) == [[1], [2, 0, 3]]
    assert spmd_to_mpmd_plan([1, 5, 3, 2], [0, 0, 1, 1], 2, None) == [[1, 2, 0, 3]]
    assert mpmd_to_spmd_plan([1, 5, 3, 2], 2, 0) == [[1], [2], [3], [0]]


# -- MpmdMesh / MpmdSharding ------------------------------------------------------------------
def test_mpmd_mesh_groups():
    m = Mesh((4, 2), ("x", "pp"), device_ids=np.array([[7, 6], [5, 4], [3, 2], [1, 0]]))
    mm = MpmdMesh(m, "pp")
    assert (mm.mpmd_dim, mm.mpmd_axis) == (2, 1)
    assert [g.axis_sizes for g in mm.unstack] == [(4, 1), (4, 1)]
    assert mm.unstack[0].device_ids.ravel().tolist() == [7, 5, 3, 1]
    assert mm.unstack[1].device_ids.ravel().tolist() == [6, 4, 2, 0]
    assert mm.unstack[0].axis_names == ("x", "pp")
    assert mm.device_mpmd_idx == {7: 0, 5: 0, 3: 0, 1: 0, 6: 1, 4: 1, 2: 1, 0: 1}
    assert mm.mpmd_idx_of_devices([5, 1]) == 0
    with pytest.raises(ValueError, match=r"devices \[5, 4\] lie in MPMD groups \[0, 1\]"):
        mm.mpmd_idx_of_devices([5, 4])
    sub = MpmdMesh(Mesh((3,), ("pp",)), "pp").mpmd_submesh([2, 0])
    assert sub.mesh.device_ids.tolist() == [2, 0] and sub.mpmd_dim == 2


def test_mpmd_mesh_errors():
    with pytest.raises(ValueError, match=r"mpmd_axis_name='z' is not an axis of the mesh"):
        MpmdMesh(MESH, "z")
    with pytest.raises(TypeError, match="must be a refsim.Mesh"):
        MpmdMesh(MESH.abstract_mesh, "pp")
    with pytest.raises(ValueError, match=r"gives group 1 twice"):
        MM.mpmd_submesh([1, 1])
    with pytest.raises(ValueError, match=r"contains group 2, but the MPMD axis 'pp' has 2 groups"):
        MM.mpmd_submesh([2])


def test_mpmd_sharding_drops_the_mpmd_axis():
    s = MpmdSharding(MM, [1, 0], P(("pp", "x"), None))
    assert s.spec == P("x", None) and s.mesh_ids == frozenset({0, 1})
    assert MpmdSharding(MM, {1}, P("pp")).spec == P(None)
    assert MpmdSharding(MM, {1}, P(("x", "pp"))).spec == P("x")
    sh = MpmdSharding(MM, {1}, P("x")).sharding
    assert sh.mesh.device_ids.tolist() == [[4, 5, 6, 7]] and sh.spec == P("x")
    assert MpmdSharding(MM, (), P()).is_unused
    with pytest.raises(ValueError, match="empty mesh_ids"):
        MpmdSharding(MM, (), P()).sharding
    with pytest.raises(ValueError, match=r"mesh_ids=\[0, 0\] gives group 0 twice"):
        MpmdSharding(MM, [0, 0], P())
    with pytest.raises(ValueError, match=r"Resource axis: y"):
        MpmdSharding(MM, {0}, P("y"))


# -- MpmdArray --------------------------------------------------------------------------------------
def _group_array(k, value, spec=P("x")):
    return refsim.device_put(value, NamedSharding(MM.unstack[k], spec))


def test_mpmd_array_properties():
    v = np.arange(8.0)
    s = MpmdSharding(MM, {0, 1}, P("x"))
    a = MpmdArray([_group_array(1, v), _group_array(0, v)], s)
    assert a.mpmd_idxs == (0, 1) and a.is_mpmd_replicated and a.is_partially_addressable
    assert a.shape == (8,) and a.dtype == np.float32  # device_put canonicalises float64 (x64 off)
    assert [x.sharding.mesh for x in a.to_mpmd_local_array] == list(MM.unstack)
    assert a.first_mpmd_replica.sharding.mesh == MM.unstack[0]
    assert a.sharding.mesh == MESH  # the submesh of both groups
    # group 1 held alone: the first replica (group 0) is not held here
    b = MpmdArray([_group_array(1, v)], s)
    assert b.first_mpmd_replica is None and b.to_mpmd_local_array.sharding.mesh == MM.unstack[1]
    with pytest.raises(ValueError, match=r"group 0 holds this array, but not in this process"):
        b.group_array(0)
    c = MpmdArray([], MpmdSharding(MM, {1}, P("x")), shape=(8,), dtype=np.float64)
    assert not c.is_partially_addressable and c.to_mpmd_local_array is None
    with pytest.raises(ValueError, match=r"MPMD group 0 does not hold this array; it lives in groups \[1\]"):
        c.group_array(0)
    with pytest.raises(ValueError, match="holds none of the array's groups"):
        c.delete()


def test_mpmd_array_delete_is_all_or_nothing():
    v = np.arange(8.0)
    a = MpmdArray([_group_array(0, v), _group_array(1, v)], MpmdSharding(MM, {0, 1}, P("x")))
    assert not a.is_deleted()
    a.block_until_ready()
    a.delete()
    assert a.is_deleted()
    a.delete()  # a second delete is a no-op, as jax.Array.delete
    with pytest.raises(RuntimeError, match="has been deleted"):
        a.to_mpmd_local_array
    with pytest.raises(RuntimeError, match="has been deleted"):
        a.block_until_ready()


def test_mpmd_array_rejects_bad_input():
    v = np.arange(8.0)
    s = MpmdSharding(MM, {0, 1}, P("x"))
    with pytest.raises(ValueError, match=r"partially_addressable_arrays\[0\] is on mesh .* not a group mesh"):
        MpmdArray([refsim.device_put(v, NamedSharding(MESH, P("x")))], s)  # the whole mesh: foreign
    with pytest.raises(ValueError, match=r"\[0\] and \[1\] are both on group 1"):
        MpmdArray([_group_array(1, v), _group_array(1, v)], s)
    with pytest.raises(ValueError, match=r"\(group 1\) is float32\[4\] but the MpmdArray is float32\[8\]"):
        MpmdArray([_group_array(0, v), _group_array(1, v[:4])], s)
    with pytest.raises(ValueError, match=r"is int32\[8\] but the MpmdArray is float32\[8\]"):
        MpmdArray([_group_array(0, v), _group_array(1, v.astype(np.int32))], s)
    with pytest.raises(ValueError, match=r"laid out by P\(\)"):
        MpmdArray([_group_array(0, v, P())], s)
    with pytest.raises(ValueError, match=r"is on group 1, which is not in mesh_ids=\[0\]"):
        MpmdArray([_group_array(1, v)], MpmdSharding(MM, {0}, P("x")))
    with pytest.raises(ValueError, match="`shape` and `dtype` must be provided"):
        MpmdArray([], s)
    with pytest.raises(TypeError, match="must be a refsim.Array"):
        MpmdArray([v], s)
    # a spec naming the MPMD axis or a size-1 axis places the same way
    MpmdArray([_group_array(0, v, P(("pp", "x")))], MpmdSharding(MM, {0}, P("x")))


# -- resharding -------------------------------------------------------------------------------------
def test_spmd_to_mpmd_and_back_by_hand():
    v = np.arange(16.0).reshape(8, 2)
    a = refsim.device_put(v, NamedSharding(MESH, P(("pp", "x"))))  # device d holds row d
    b = refsim.device_put(np.arange(3, dtype=np.int32), NamedSharding(MESH, P()))
    out = spmd_to_mpmd_reshard(MM, {"a": a, "b": [b]},
                               {"a": MpmdSharding(MM, {1}, P(("pp", "x"))), "b": [MpmdSharding(MM, (), P())]},
                               threshold=0)
    ma, mb = out["a"], out["b"][0]
    assert ma.mpmd_idxs == (1,) and ma.spec == P("x") and mb.mpmd_idxs == (0,)  # unused -> group 0
    g = ma.group_array(1)
    assert g.sharding == NamedSharding(MM.unstack[1], P("x"))
    assert g.shard(5).data.tolist() == [[4.0, 5.0], [6.0, 7.0]]  # device 5 = x position 1: rows 2-3
    assert mb.group_array(0).shard(2).data.tolist() == [0, 1, 2]
    back = mpmd_to_spmd_reshard(MM, out, {"a": NamedSharding(MESH, P(None, "pp")), "b": [NamedSharding(MESH, P())]})
    assert back["a"].shard(4).data.tolist() == v[:, 1:2].tolist()  # device 4 = pp position 1: column 1
    np.testing.assert_array_equal(np.asarray(back["a"]), v)
    assert ma.is_deleted() and mb.is_deleted()


def test_mpmd_to_spmd_reads_the_first_replica():
    s = MpmdSharding(MM, {0, 1}, P())
    a = MpmdArray([_group_array(0, np.zeros(2), P()), _group_array(1, np.ones(2), P())], s)
    out = mpmd_to_spmd_reshard(MM, [a], [NamedSharding(MESH, P())])
    assert np.asarray(out[0]).tolist() == [0.0, 0.0]


def test_reshard_bad_input_raises_and_deletes_nothing():
    v = np.arange(8.0)
    good = MpmdArray([_group_array(0, v)], MpmdSharding(MM, {0}, P("x")))
    other = MpmdMesh(Mesh((2, 4), ("pp", "x"), device_ids=np.arange(8, 16).reshape(2, 4)), "pp")
    foreign = MpmdArray([refsim.device_put(v, NamedSharding(other.unstack[0], P("x")))], MpmdSharding(other, {0}, P("x")))
    with pytest.raises(ValueError, match=r"mpmd_arrays\[1\] lives on .* foreign"):
        mpmd_to_spmd_reshard(MM, [good, foreign], [NamedSharding(MESH, P())] * 2)
    with pytest.raises(ValueError, match=r"spmd_shardings\[1\] places the array on devices \[8"):
        mpmd_to_spmd_reshard(MM, [good, good], [NamedSharding(MESH, P()), NamedSharding(other.mesh, P())])
    with pytest.raises(ValueError, match="same structure"):
        mpmd_to_spmd_reshard(MM, [good], [NamedSharding(MESH, P())] * 2)
    six = MpmdArray([_group_array(0, np.arange(6.0), P())], MpmdSharding(MM, {0}, P()))
    with pytest.raises(refsim.IndivisibleError, match="partitioned 4 times"):
        mpmd_to_spmd_reshard(MM, [good, six], [NamedSharding(MESH, P()), NamedSharding(MESH, P("x"))])
    assert not six.is_deleted()
    assert not good.is_deleted() and not foreign.is_deleted()
    arr = refsim.device_put(v, NamedSharding(MESH, P("x")))
    with pytest.raises(ValueError, match=r"spmd_arrays\[0\] is on devices \[0, 1, 2, 3\], a mesh foreign"):
        spmd_to_mpmd_reshard(MM, [_group_array(0, v)], [MpmdSharding(MM, {0}, P())])
    with pytest.raises(ValueError, match=r"mpmd_shardings\[0\] is over .* not over the mpmd_mesh"):
        spmd_to_mpmd_reshard(MM, [arr], [MpmdSharding(other, {0}, P())])
    with pytest.raises(refsim.IndivisibleError):
        spmd_to_mpmd_reshard(MM, [refsim.device_put(np.arange(6.0), NamedSharding(MESH, P()))],
                             [MpmdSharding(MM, {0}, P("x"))])


def test_logically_stacked_by_hand():
    parts = [_group_array(k, np.full((4, 2), k, dtype=np.int32), P("x")) for k in range(2)]
    s = logically_stacked(parts, MESH, "pp", array_axis=1)
    assert s.shape == (4, 2, 2) and s.sharding.spec == P("x", "pp", None)
    expected = np.stack([np.zeros((4, 2)), np.ones((4, 2))], axis=1)
    np.testing.assert_array_equal(np.asarray(s), expected)
    assert s.shard(6).data.tolist() == [[[1, 1]]]  # device 6: group 1, x position 2
    whole = refsim.device_put(np.arange(4.0), NamedSharding(MESH, P("x")))
    np.testing.assert_array_equal(np.asarray(logically_stacked(whole, MESH, "pp")), np.stack([np.arange(4.0)] * 2))
    with pytest.raises(ValueError, match="already shards a dimension"):
        logically_stacked([_group_array(k, np.zeros(4), P(("pp", "x"))) for k in range(2)], MESH, "pp", strict=True)
    with pytest.raises(ValueError, match="list the arrays in position order"):
        logically_stacked(parts[::-1], MESH, "pp")


# -- round trips over drawn cases (refsim alone; tests/xla_backend/test_xla_backend_mpmd.py compares with XLA) --------
@given(mpmd_cases())
def test_round_trip_properties_hold_on_refsim(case):
    ids = list(range(8))
    assert refsim_properties(case, ids, run_refsim(case, ids)) == []


def test_case_strategy_reaches_every_option():
    from conformance.suites.mpmd_checks import draw_cases

    cases = draw_cases(60, 3)
    assert {c.threshold_kind for c in cases} == set(THRESHOLD_KINDS)
    assert {c.mesh_shape[c.axis_names.index("pp")] for c in cases} == {2, 3, 4}
    leaves = [l for c in cases for l in c.leaves]
    assert any("pp" in str(l.mpmd) for l in leaves) and any("pp" not in str(l.mpmd) for l in leaves)
    assert any(len({l.dtype for l in c.leaves}) > 1 for c in cases)
    assert any(not l.mesh_ids for l in leaves) and any(len(l.mesh_ids) > 1 for l in leaves)
    assert {c.axis_names.index("pp") for c in cases} >= {0, 1}
