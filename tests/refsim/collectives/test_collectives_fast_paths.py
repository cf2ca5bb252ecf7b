"""Fast paths of all_to_all (cache-blocked transpose) and ppermute (slice runs, cached
plans) against independent per-device loops, at sizes that take those paths."""
from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from refsim import Mesh
from refsim.collectives import alltoall, permute


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint8).reshape(a.shape + (a.itemsize,)) if a.dtype != bool else a


def assert_bits(got, want, what):
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    assert np.array_equal(_bits(got), _bits(want)), f"{what}: values differ"


@pytest.fixture
def tiled_calls(monkeypatch):
    calls = []
    orig = alltoall._tiled_copy

    def spy(dst, src, *a):
        calls.append(src.shape)
        return orig(dst, src, *a)
    monkeypatch.setattr(alltoall, "_tiled_copy", spy)
    return calls


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.float16, np.complex128, np.bool_])
@pytest.mark.parametrize("shape,perm", [((600, 1100), (1, 0)), ((600, 3, 300), (2, 1, 0)),
                                        ((512, 512, 4), (1, 0, 2))])
def test_transpose_copy_equals_numpy_copy(dtype, shape, perm, tiled_calls):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(shape) * 50).astype(dtype)
    v = a.transpose(perm)
    got = alltoall.transpose_copy(v)
    assert got.flags.c_contiguous
    assert_bits(got, np.array(v, order="C"), f"{dtype} {shape} {perm}")
    if v.nbytes >= alltoall._SMALL:
        assert tiled_calls, "the blocked path was not taken"


def test_transpose_copy_bit_exact_nan_payload_negative_zero_and_odd_views():
    f = np.full((1536, 1024), -0.0, np.float32)
    f[::3] = np.frombuffer(np.uint32(0x7FC01234).tobytes(), np.float32)[0]
    for v in (f.T, f.T[::-1], f.T[:, ::2], np.broadcast_to(f[:1], (700, 1024)).T):
        assert_bits(alltoall.transpose_copy(v), np.array(v, order="C"), "view")
    assert alltoall.transpose_copy(np.empty((0, 5)).T).shape == (5, 0)


def _naive_a2a_1d(x, split, concat, groups):
    """Loop over devices: member i of a group gets block i of each sender, by sender order."""
    out = [None] * x.shape[0]
    for g in groups:
        blocks = {s: np.split(x[s], len(g), axis=split) for s in g}
        for i, me in enumerate(g):
            out[me] = np.concatenate([blocks[s][i] for s in g], concat)
    return np.stack(out)


@pytest.mark.parametrize("k,local,split,concat", [
    (512, (512,), 0, 0),          # one element per block: element-wise blocked transpose
    (256, (1024,), 0, 0),         # 4-element (16 B) blocks read as one wide element
    (128, (256, 8), 0, 1),        # split != concat
    (64, (16, 256), 1, 0),
])
@pytest.mark.parametrize("grouping", ["none", "blocks", "strided", "irregular"])
def test_all_to_all_large_matches_naive(k, local, split, concat, grouping):
    rng = np.random.default_rng(k)
    x = rng.integers(-1000, 1000, (k,) + local).astype(np.float32)
    gs = k if grouping == "none" else k // 4
    ng = k // gs
    groups = {"none": lambda: np.arange(k).reshape(1, k),
              "blocks": lambda: np.arange(k).reshape(ng, gs),
              "strided": lambda: np.arange(k).reshape(gs, ng).T,
              "irregular": lambda: rng.permutation(k).reshape(ng, gs)}[grouping]()
    if local[split] % gs:
        pytest.skip("split size not divisible")
    aig = None if grouping == "none" else groups.tolist()
    got = alltoall.all_to_all(x, mesh=Mesh((k,), ("i",)), axis_name=("i",), split_axis=split,
                              concat_axis=concat, axis_index_groups=aig)
    assert_bits(got, _naive_a2a_1d(x, split, concat, groups), f"{k} {local} {grouping}")


def _naive_ppermute_1d(x, perm):
    out = np.zeros_like(x)
    for s, d in perm:
        out[d] = x[s]
    return out


@pytest.mark.parametrize("kind", ["shift", "halves", "random", "partial_random", "partial_shift"])
def test_ppermute_large_matches_naive(kind):
    k = 300
    rng = np.random.default_rng(1)
    x = rng.standard_normal((k, 33)).astype(np.float32)
    perm = {"shift": [(j, (j + 7) % k) for j in range(k)],
            "halves": [(j, (j + k // 2) % k) for j in range(k)],
            "random": list(zip(range(k), rng.permutation(k).tolist())),
            "partial_random": list(zip(rng.permutation(k)[:200].tolist(),
                                       rng.permutation(k)[:200].tolist())),
            "partial_shift": [(j, j + 5) for j in range(k - 100)]}[kind]
    mesh = Mesh((k,), ("i",))
    for _ in range(2):  # the second call is served from the plan cache
        got = permute.ppermute(x, mesh=mesh, axis_name=("i",), perm=perm)
        assert_bits(got, _naive_ppermute_1d(x, perm), kind)


def test_ppermute_non_leading_axis_keeps_layout_and_accepts_iterators():
    mesh = Mesh((3, 5), ("x", "y"))
    x = np.arange(3 * 5 * 4, dtype=np.int32).reshape(3, 5, 4)
    perm = [(j, (j + 1) % 5) for j in range(5)]
    got = permute.ppermute(x, mesh=mesh, axis_name=("y",), perm=iter(perm))
    assert got.flags.c_contiguous
    want = np.zeros_like(x)
    for s, d in perm:
        want[:, d] = x[:, s]
    assert_bits(got, want, "axis y")
    inv = np.broadcast_to(x[:, :1], (3, 1, 4))  # invariant along y: every receiver gets it
    got = permute.ppermute(inv, mesh=mesh, axis_name="y", perm=[(0, 1), (1, 2)])
    assert got[:, 1].tolist() == x[:, 0].tolist() and got[:, 0].tolist() == [[0] * 4] * 3


def test_normalize_perm_cache_keeps_errors_and_read_only_results():
    src, dst = permute.normalize_perm(((0, 1), (1, -4)), 4)
    assert src.tolist() == [0, 1] and dst.tolist() == [1, 0]
    with pytest.raises(ValueError):
        src[0] = 3
    for _ in range(2):
        with pytest.raises(ValueError, match="sources and destinations must be unique"):
            permute.normalize_perm(((0, 1), (0, 2)), 4)
        with pytest.raises(IndexError, match="out of range for an axis of size 4"):
            permute.normalize_perm([(0, 4)], 4)
    with pytest.raises(TypeError, match="must be an iterable of"):
        permute.normalize_perm(3, 4)
    with pytest.raises(TypeError, match="must be an iterable of"):
        permute.normalize_perm([(0.5, 1)], 4)


def test_bench_runs_and_reports_ratios():
    from bench import collectives as bench

    rows = bench.run(1, [8], 2, "cpu")
    assert [r["op"] for r in rows] == ["psum", "all_gather", "all_to_all", "ppermute"]
    for r in rows:
        assert r["bench"] == "collectives" and r["devices"] == 8 and r["clock"] == "cpu"
        assert r["timing"]["passes"] == r["copy_timing"]["passes"] == 2  # equal, interleaved passes
        assert r["timing"]["min"] <= r["seconds"] == r["timing"]["median"] <= r["timing"]["max"]
        assert r["copy_seconds"] == r["copy_timing"]["median"] > 0 and r["ratio_to_copy"] > 0
    bench.show(rows)


@settings(deadline=None)
@given(k=st.integers(2, 40), b=st.sampled_from([1, 2, 3, 4]), r=st.integers(1, 3),
       dtype=st.sampled_from([np.int8, np.float16, np.float32, np.complex128]),
       concat=st.integers(0, 1), area=st.integers(256, 1024),
       grouping=st.sampled_from(["none", "blocks", "strided", "irregular"]), seed=st.integers(0, 2**16))
def test_all_to_all_tiled_path_matches_naive_loop(k, b, r, dtype, concat, area, grouping, seed):
    """The cache-blocked path on small arrays (its size threshold lowered, tiles of `area`
    wide elements so several tiles and trimmed edge tiles occur) against the per-device loop."""
    import naive_collectives as naive

    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((k, k * b, r)) * 100).astype(dtype)
    if grouping == "none" or k % 2:
        grouping, groups = "none", None
    else:
        gs = k // 2
        groups = {"blocks": np.arange(k).reshape(2, gs), "strided": np.arange(k).reshape(gs, 2).T,
                  "irregular": rng.permutation(k).reshape(2, gs)}[grouping].tolist()
    calls = []
    orig = alltoall._tiled_copy

    def spy(*a):
        calls.append(a[1].shape)
        return orig(*a)
    wide = b * r * np.dtype(dtype).itemsize
    with mock.patch.object(alltoall, "_SMALL", 0), mock.patch.object(alltoall, "_TILE_BYTES", area * wide), \
            mock.patch.object(alltoall, "_tiled_copy", spy):
        got = alltoall.all_to_all(x, mesh=Mesh((k,), ("i",)), axis_name=("i",), split_axis=0,
                                  concat_axis=concat, axis_index_groups=groups)
    mesh = Mesh((k,), ("i",))
    want = naive.all_to_all(x, mesh, "i", 0, concat, groups)
    assert_bits(got, want, f"k={k} b={b} r={r} {np.dtype(dtype)} concat={concat} {grouping}")
    if grouping == "none" and concat == 0 and wide <= alltoall._WIDE_RUN and k >= 16:
        assert calls, "the blocked path was not taken"


@pytest.mark.parametrize("threads", ["1", "2", "3", "5"])
def test_threaded_blocked_copy_is_bit_identical(threads, monkeypatch):
    """The blocked copy split over threads (rows of tiles dealt round-robin, uneven counts
    included) writes the same bits as NumPy's own copy, for an axis swap and a 3-axis
    permutation, whatever the thread count."""
    monkeypatch.setenv("REFSIM_NUM_THREADS", threads)
    monkeypatch.setattr(alltoall, "_PARALLEL_BYTES", 0)
    monkeypatch.setattr(alltoall, "_SMALL", 0)
    monkeypatch.setattr(alltoall, "_TILE_BYTES", 4096)
    jobs = []
    orig = alltoall._copy_tile_rows

    def spy(*a):
        import threading
        jobs.append(threading.current_thread() is threading.main_thread())
        return orig(*a)
    monkeypatch.setattr(alltoall, "_copy_tile_rows", spy)
    rng = np.random.default_rng(int(threads))
    f = rng.standard_normal((300, 257)).astype(np.float32)
    f[::7] = np.frombuffer(np.uint32(0x7FC01234).tobytes(), np.float32)[0]  # a NaN payload survives
    for v in (f.T, f.reshape(30, 10, 257).transpose(2, 0, 1), f.T[::-1]):
        jobs.clear()
        assert_bits(alltoall.transpose_copy(v), np.array(v, order="C"), f"threads={threads} {v.shape}")
        # one job per thread, run in the pool (on the calling thread when there is one)
        assert len(jobs) == int(threads) and all(jobs) == (threads == "1"), (v.shape, jobs)


def test_thread_count_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("REFSIM_NUM_THREADS", "3")
    assert alltoall.threads() == 3
    monkeypatch.delenv("REFSIM_NUM_THREADS")
    assert 1 <= alltoall.threads() <= alltoall._MAX_THREADS
    for bad, msg in (("two", "is not an integer"), ("0", "positive number")):
        monkeypatch.setenv("REFSIM_NUM_THREADS", bad)
        with pytest.raises(ValueError, match=msg):
            alltoall.threads()
