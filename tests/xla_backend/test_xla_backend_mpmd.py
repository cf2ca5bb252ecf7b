"""xla_backend.mpmd on 8 CPU devices (and 2 processes x 4 devices), compared with refsim.mpmd."""
import os

import numpy as np
import pytest

import jax
from jax.sharding import NamedSharding as JNS, PartitionSpec as JP

from conformance.suites.mpmd_checks import check_mpmd, in_process_runner, multiprocess_runner
from refsim import Mesh
from xla_backend import mpmd as xm

EXAMPLES = 30 if os.environ.get("CI") else 15


@pytest.fixture(scope="module")
def mm():
    return xm.MpmdMesh(Mesh((2, 4), ("pp", "x")), "pp")  # JAX devices by id: group k = ids 4k..4k+3


def _on(mesh, value, spec):
    return jax.device_put(value, JNS(mesh, spec))


def test_mesh_and_sharding(mm):
    assert mm.mpmd_dim == 2 and [d.id for d in mm.unstack[1].devices.flat] == [4, 5, 6, 7]
    assert {d.id: k for d, k in mm.device_mpmd_idx.items()} == {i: i // 4 for i in range(8)}
    assert mm.lowering_mesh() == mm.unstack[0]
    with pytest.raises(ValueError, match="only for multi-process meshes"):
        mm.my_mpmd_axis_index
    s = xm.MpmdSharding(mm, {1}, JP(("pp", "x")))
    assert s.spec == JP("x") and s.sharding == JNS(mm.unstack[1], JP("x"))


def test_round_trip_by_hand_consumes_inputs(mm):
    v = np.arange(16, dtype=np.float32).reshape(8, 2)
    a = _on(mm.jax_mesh, v, JP(("pp", "x")))
    out = xm.spmd_to_mpmd_reshard(mm, [a], [xm.MpmdSharding(mm, {0, 1}, JP("x"))], threshold=0)
    assert a.is_deleted()
    g1 = out[0].group_array(1)
    assert g1.sharding == JNS(mm.unstack[1], JP("x"))
    by_dev = {s.device.id: np.asarray(s.data) for s in g1.addressable_shards}
    np.testing.assert_array_equal(by_dev[5], v[2:4])  # device 5: x position 1 of group 1
    back = xm.mpmd_to_spmd_reshard(mm, out, [JNS(mm.jax_mesh, JP(None, "pp"))])
    assert out[0].is_deleted()
    np.testing.assert_array_equal(np.asarray(back[0]), v)


def test_bad_input_raises_and_deletes_nothing(mm):
    v = np.arange(8, dtype=np.float32)
    a = _on(mm.jax_mesh, v, JP("x"))
    local = _on(mm.unstack[0], v, JP("x"))
    with pytest.raises(ValueError, match=r"spmd_arrays\[1\] is on devices \[0, 1, 2, 3\], a mesh foreign"):
        xm.spmd_to_mpmd_reshard(mm, [a, local], [xm.MpmdSharding(mm, {0}, JP())] * 2)
    with pytest.raises(ValueError, match="partitioned 4 times"):
        xm.spmd_to_mpmd_reshard(mm, [a, _on(mm.jax_mesh, np.arange(6.0), JP())],
                                [xm.MpmdSharding(mm, {0}, JP()), xm.MpmdSharding(mm, {0}, JP("x"))])
    assert not a.is_deleted() and not local.is_deleted()
    s = xm.MpmdSharding(mm, {0, 1}, JP("x"))
    with pytest.raises(ValueError, match=r"\[0\] and \[1\] are both on group 0"):
        xm.MpmdArray([local, local], s)
    with pytest.raises(ValueError, match="not a group mesh"):
        xm.MpmdArray([a], s)
    with pytest.raises(ValueError, match=r"is float32\[4\] but the MpmdArray is float32\[8\]"):
        xm.MpmdArray([local, _on(mm.unstack[1], v[:4], JP("x"))], s)
    good = xm.MpmdArray([local, _on(mm.unstack[1], v, JP("x"))], s)
    with pytest.raises(TypeError, match=r"spmd_shardings\[1\] must be a jax \(or refsim\) sharding"):
        xm.mpmd_to_spmd_reshard(mm, [good, good], [JNS(mm.jax_mesh, JP()), "not a sharding"])
    small = xm.MpmdMesh(Mesh((2, 2), ("pp", "x")), "pp")  # devices 0-3 only
    mine = xm.MpmdArray([_on(small.unstack[0], v, JP("x"))], xm.MpmdSharding(small, {0}, JP("x")))
    with pytest.raises(ValueError, match=r"spmd_shardings\[0\] places the array on devices \[4, 5, 6, 7\]"):
        xm.mpmd_to_spmd_reshard(small, [mine], [JNS(mm.jax_mesh, JP())])
    with pytest.raises(ValueError, match=r"mpmd_arrays\[0\] lives on .* foreign"):
        xm.mpmd_to_spmd_reshard(mm, [mine], [JNS(mm.jax_mesh, JP())])
    assert not mine.is_deleted()
    assert not good.is_deleted()
    with pytest.raises(ValueError, match="MPMD group 2 does not hold|contains group"):
        good.group_array(2)


def test_delete_is_all_or_nothing(mm):
    v = np.arange(8, dtype=np.float32)
    g = [_on(mm.unstack[k], v, JP("x")) for k in range(2)]
    arr = xm.MpmdArray(g, xm.MpmdSharding(mm, {0, 1}, JP("x")))
    g[1].delete()  # behind the MpmdArray's back
    with pytest.raises(RuntimeError, match=r"groups \[1\] .* were deleted but those of groups \[0\] were not"):
        arr.delete()
    assert not g[0].is_deleted()
    ok = xm.MpmdArray([_on(mm.unstack[k], v, JP("x")) for k in range(2)], xm.MpmdSharding(mm, {0, 1}, JP("x")))
    ok.block_until_ready().delete()
    assert ok.is_deleted() and all(x.is_deleted() for x in ok._arrays.values())


def test_logically_stacked_matches_refsim(mm):
    from refsim.mpmd import logically_stacked as ref_stacked
    from xla_backend.convert import to_refsim

    parts = [_on(mm.unstack[k], np.full((4, 2), k, np.int32), JP("x")) for k in range(2)]
    got = to_refsim(xm.logically_stacked(parts, mm.jax_mesh, "pp", array_axis=1))
    want = ref_stacked([to_refsim(p) for p in parts], mm.mesh, "pp", array_axis=1)
    assert got.sharding == want.sharding
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_conformance_round_trips_in_process():
    results = check_mpmd(examples=EXAMPLES, seed=11)
    bad = [r for r in results if not r.passed]
    assert results and not bad, bad[0].message if bad else ""


def test_checker_reports_a_corrupted_backend():
    def corrupt(cases):
        ids, out = in_process_runner(cases)
        o = out[cases[0].case_id]
        f = o["final"][0]
        data = f.shards[0].data.copy().reshape(-1)
        data[0] = ~data[0] if data.dtype == np.bool_ else data[0] + 1
        from refsim.array import Array, Shard

        shards = [Shard(f.shards[0].device_id, f.shards[0].index, data.reshape(f.shards[0].data.shape))] + f.shards[1:]
        o["final"][0] = Array(f.shape, f.dtype, f.sharding, shards)
        return ids, out

    results = check_mpmd(examples=3, seed=5, backend_runner=corrupt)
    first = results[0]  # drawn shapes have no zero-size dimension, so one element was changed
    assert not first.passed and "leaf 0 final SPMD array" in first.message and "rerun:" in first.message
    assert all(r.passed for r in results[1:])


@pytest.mark.multiprocess
def test_conformance_round_trips_two_processes():
    results = check_mpmd(examples=6, seed=7, multiprocess=True, backend_runner=multiprocess_runner())
    bad = [r for r in results if not r.passed]
    assert len(results) >= 4 and not bad, bad[0].message if bad else ""
