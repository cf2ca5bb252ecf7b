"""Part 4: per-process views. refsim simulates processes; JAX's docstring examples and
one-process behaviour check the rules here, and a real 2-process run checks agreement."""
import json
import sys

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding as JNS, PartitionSpec as JP

import refsim
from refsim import Mesh, NamedSharding, P
from refsim.layouts.process import (NonUniformShardingError, ProcessMap, global_array_to_host_local_array,
                                    host_local_array_to_global_array, make_array_from_process_local_data)

M24 = Mesh((2, 4), ("x", "y"))
TWO = ProcessMap.contiguous(range(8), 2)      # process 0: devices 0-3 (mesh row 0), 1: 4-7


def test_process_map_basics():
    assert TWO.devices_of(1) == (4, 5, 6, 7) and TWO.num_processes == 2
    assert TWO.process_grid(M24.device_ids).tolist() == [[0] * 4, [1] * 4]
    assert ProcessMap.from_jax() == ProcessMap.contiguous([d.id for d in jax.devices()], 1)
    with pytest.raises(ValueError, match="must be a positive int dividing the 8 devices"):
        ProcessMap.contiguous(range(8), 3)


def test_addressability():
    s = NamedSharding(M24, P("x"))
    assert TWO.addressable_devices(s, 0) == {0, 1, 2, 3}
    assert not TWO.is_fully_addressable(s, 0)
    row0 = NamedSharding(Mesh((4,), ("y",), device_ids=np.arange(4)), P("y"))
    assert TWO.is_fully_addressable(row0, 0) and not TWO.is_fully_addressable(row0, 1)
    # one process: everything is addressable, as JAX reports on this run
    one = ProcessMap.from_jax()
    jm = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    assert one.is_fully_addressable(s, 0) == JNS(jm, JP("x")).is_fully_addressable
    assert one.local_mesh(M24, 0) == Mesh.from_jax(jm.local_mesh)


def test_local_mesh_is_a_subcube_or_an_error_as_jax():
    assert TWO.local_mesh(M24, 1).device_ids.tolist() == [[4, 5, 6, 7]]
    interleaved = Mesh((2, 4), ("x", "y"), device_ids=np.array([[0, 4, 1, 5], [2, 6, 3, 7]]))
    assert TWO.local_mesh(interleaved.__class__((2, 4), ("x", "y"), device_ids=np.array(
        [[0, 1, 4, 5], [2, 3, 6, 7]])), 0).device_ids.tolist() == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="must form a contiguous subcube of the global device mesh"):
        TWO.local_mesh(interleaved, 0)


def test_docstring_example_of_local_to_global_shape():
    # jax local_to_global_shape docstring: mesh {'a': 2, 'b': 2, 'c': 2}, 2 devices per host, 4 hosts.
    m = Mesh((2, 2, 2), ("a", "b", "c"))
    four = ProcessMap.contiguous(range(8), 4)
    g = lambda spec: four.local_to_global_shape(NamedSharding(m, spec), (6, 10), 0)  # noqa: E731
    assert g(P()) == (6, 10)
    assert g(P(("a", "b", "c"), None)) == (24, 10)
    assert g(P(("a", "b"), None)) == (24, 10)
    assert g(P(None, ("a", "c"))) == (6, 20)
    assert g(P(("a", "c"), "b")) == (12, 20)
    # Permuted devices: along (b, c) process 0 holds blocks {0, 1} and process 1 blocks {1, 3},
    # overlapping but unequal, so that dim is non-uniform; along a every process holds both rows.
    shuffled = Mesh((2, 2, 2), ("a", "b", "c"), device_ids=np.array([0, 2, 5, 7, 4, 1, 6, 3]).reshape(2, 2, 2))
    assert four.local_to_global_shape(NamedSharding(shuffled, P("a", ("b", "c"))), (6, 10), 0) == (6, None)


def test_docstring_example_of_process_index_and_count():
    # "1212 / 3434": 4 processes, one device column pair each
    m = Mesh((2, 4), ("x", "y"), device_ids=np.array([[0, 2, 1, 3], [4, 6, 5, 7]]))
    four = ProcessMap.contiguous(range(8), 4)
    s = NamedSharding(m, P("x", "y"))
    assert [four.process_index_and_count(s, 0, 2, p)[1] for p in range(4)] == [2] * 4
    assert [four.process_index_and_count(s, 1, 2, p) for p in range(4)] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    # process 0 (devices 0, 1) holds row 0 only, process 1 (devices 2, 3) both rows
    bad = Mesh((2, 4), ("x", "y"), device_ids=np.array([[0, 1, 2, 4], [3, 5, 6, 7]]))
    with pytest.raises(NonUniformShardingError, match="different number of slices"):
        four.process_index_and_count(NamedSharding(bad, P("x")), 0, 1, 0)
    assert issubclass(NonUniformShardingError, ValueError)


def test_make_array_from_process_local_data_two_processes():
    s = NamedSharding(M24, P("x", None))
    d0, d1 = np.arange(8.0).reshape(2, 4), 100 + np.arange(8.0).reshape(2, 4)
    arr = make_array_from_process_local_data(s, {0: d0, 1: d1}, processes=TWO)
    assert arr.shape == (4, 4) and np.array_equal(np.asarray(arr), np.concatenate([d0, d1]))
    # the docstring's "each dim matches global or process shape" error
    with pytest.raises(ValueError, match="In dimension 0, the process data has 3 elements. Process addresses 2"):
        make_array_from_process_local_data(s, {0: np.zeros((3, 4)), 1: np.zeros((3, 4))}, (4, 4), processes=TWO)
    # a dim whose local size is the global size is read directly
    full = make_array_from_process_local_data(s, {0: np.arange(16.0).reshape(4, 4)} | {1: np.arange(16.0).reshape(4, 4)},
                                              (4, 4), processes=TWO)
    assert np.array_equal(np.asarray(full), np.arange(16.0).reshape(4, 4))


def test_make_array_packs_discontiguous_slices_in_order():
    # Process 0 holds rows [0:2] and [4:6] of 8: they are local rows 0:2 and 2:4.
    m = Mesh((4,), ("x",), device_ids=np.array([0, 4, 1, 5]))
    s = NamedSharding(m, P("x"))
    two = ProcessMap({0: 0, 1: 0, 4: 1, 5: 1})
    local = {0: np.array([0, 1, 4, 5.0]), 1: np.array([2, 3, 6, 7.0])}
    arr = make_array_from_process_local_data(s, local, processes=two)
    assert np.array_equal(np.asarray(arr), np.arange(8.0))


def test_one_process_equals_jax():
    jm = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    x = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    jarr = jax.make_array_from_process_local_data(JNS(jm, JP("x", "y")), x)
    arr = make_array_from_process_local_data(NamedSharding(M24, P("x", "y")), x, processes=ProcessMap.from_jax())
    assert {s.device.id: s.index for s in jarr.addressable_shards} == {s.device_id: s.index for s in arr.shards}
    with pytest.raises(ValueError) as jerr:
        jax.make_array_from_process_local_data(JNS(jm, JP("x")), x, (16, 4))
    with pytest.raises(ValueError) as ours:
        make_array_from_process_local_data(NamedSharding(M24, P("x")), x, (16, 4), processes=ProcessMap.from_jax())
    assert str(ours.value) == str(jerr.value)


def test_host_local_and_global_round_trip():
    local = {0: np.arange(8.0).reshape(2, 4), 1: 10 + np.arange(8.0).reshape(2, 4)}
    glob = host_local_array_to_global_array(local, M24, P("x", "y"), processes=TWO)
    assert glob.shape == (4, 4)  # dim 0 split over the 2 processes along x; y is inside each process
    assert np.array_equal(np.asarray(glob), np.concatenate([local[0], local[1]]))
    back = global_array_to_host_local_array(glob, M24, P("x", "y"), processes=TWO)
    assert all(np.array_equal(back[p], local[p]) for p in (0, 1))
    with pytest.raises(ValueError, match="`None` is not a valid input to the pspecs argument"):
        host_local_array_to_global_array(local, M24, None, processes=TWO)


@pytest.mark.multiprocess
def test_two_real_processes_agree_with_refsim(tmp_path):
    from xla_backend.launch import run_local

    out = tmp_path / "views_{process_id}.json"
    run_local([sys.executable, "-m", "xla_backend.process_views", "--json", str(out)],
              processes=2, devices_per_process=4, timeout_s=150)
    for pid in (0, 1):
        rep = json.loads((tmp_path / f"views_{pid}.json").read_text())
        assert rep["process_count"] == 2 and rep["contiguous"]
        assert rep["disagreements"] == [], rep["disagreements"]
        assert len(rep["cases"]) >= 9
        assert any("local_mesh" in c and isinstance(c["local_mesh"][0], str) for c in rep["cases"])
