"""Property tests: each vectorised collective equals the naive per-device loop.

Meshes of 1-4 axes with sizes 1-5 (<= 64 devices), axis names drawn in any order,
axis_index_groups drawn as shuffled equal partitions, inputs possibly invariant
(size-1 mesh dims), all the dtypes JAX users reduce over. Sums are compared
bit-for-bit: both sides accumulate in ascending group position.
"""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

import naive_collectives as naive
from refsim import Mesh
from refsim.collectives import alltoall as a2a_k
from refsim.collectives import gather, permute, ragged, reductions, scatter

DTYPES = [np.float32, np.float64, ml_dtypes.bfloat16, np.float16, np.int8, np.int32, np.uint32,
          np.bool_, np.complex64]
NAMES = ("a", "b", "c", "d")


@st.composite
def meshes(draw):
    nd = draw(st.integers(1, 4))
    sizes = []
    for _ in range(nd):
        budget = 64 // int(np.prod(sizes or [1]))
        sizes.append(draw(st.integers(1, min(5, budget))))
    return Mesh(tuple(sizes), NAMES[:nd])


@st.composite
def setups(draw, groups_ok=True):
    mesh = draw(meshes())
    names = draw(st.lists(st.sampled_from(mesh.axis_names), min_size=1, max_size=mesh.ndim,
                          unique=True))
    k = int(np.prod([mesh.shape[n] for n in names]))
    groups = None
    if groups_ok and draw(st.booleans()):
        divs = [d for d in range(1, k + 1) if k % d == 0]
        gs = draw(st.sampled_from(divs))
        order = draw(st.permutations(range(k)))
        groups = [list(order[i:i + gs]) for i in range(0, k, gs)]
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    invariant = [draw(st.booleans()) and draw(st.booleans()) for _ in mesh.axis_names]
    seed = draw(st.integers(0, 2**32 - 1))
    return mesh, tuple(names), k, groups, dtype, invariant, seed


def _data(mesh, invariant, local, dtype, seed, nan=False):
    rng = np.random.default_rng(seed)
    shape = tuple(1 if inv else s for inv, s in zip(invariant, mesh.axis_sizes)) + tuple(local)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, endpoint=True, dtype=dtype)
    v = rng.standard_normal(shape) * 4
    if dtype.kind == "c":
        v = v + 1j * rng.standard_normal(shape)
    v = v.astype(dtype)
    if nan and v.size and dtype.kind == "f":
        v.reshape(-1)[rng.integers(0, v.size)] = np.nan
    return v


def assert_same(got, want, what):
    got = np.broadcast_to(got, want.shape)
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    if want.dtype.kind in "fc" or want.dtype.name == "bfloat16":
        g, w = got.astype(np.complex128 if want.dtype.kind == "c" else np.float64), \
            want.astype(np.complex128 if want.dtype.kind == "c" else np.float64)
        ok = (g == w) | (np.isnan(g) & np.isnan(w))
        assert ok.all(), f"{what}: first mismatch at {np.argwhere(~ok)[0]}: got {g[~ok][0]} want {w[~ok][0]}"
    else:
        assert np.array_equal(got, want), f"{what}: got\n{got}\nwant\n{want}"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@given(setups(), st.sampled_from(["sum", "max", "min"]), st.booleans())
def test_all_reduce_matches_naive(s, op, nan):
    mesh, names, k, groups, dtype, inv, seed = s
    if op != "sum" and dtype.kind == "c":
        dtype = np.dtype(np.float32)
    x = _data(mesh, inv, (2, 3), dtype, seed, nan)
    got = reductions.all_reduce(x, mesh=mesh, axes=names, axis_index_groups=groups, op=op)
    assert_same(got, naive.reduce(x, mesh, names, op, groups), f"p{op} {names} {groups}")


@st.composite
def unequal_groups(draw, k):
    order = draw(st.permutations(range(k)))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, k - 1)), max_size=3))) if k > 1 else []
    bounds = [0] + [c for c in cuts if c < k] + [k]
    return [list(order[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]


@given(setups(groups_ok=False), st.data())
def test_psum_unequal_groups_matches_naive(s, data):
    mesh, names, k, _, dtype, inv, seed = s
    groups = data.draw(unequal_groups(k))
    x = _data(mesh, inv, (3,), np.dtype(np.int32), seed)
    got = reductions.psum(x, mesh=mesh, axes=names, axis_index_groups=groups)
    assert_same(got, naive.reduce(x, mesh, names, "sum", groups), f"psum {names} {groups}")


@given(setups(), st.booleans(), st.integers(-3, 2))
def test_all_gather_matches_naive(s, tiled, axis):
    mesh, names, k, groups, dtype, inv, seed = s
    x = _data(mesh, inv, (2, 3), dtype, seed)
    gs = len(groups[0]) if groups else k
    nd = 2 if tiled else 3
    axis = axis % nd
    got = gather.all_gather(x, mesh=mesh, axis_name=names, all_gather_dimension=axis,
                            axis_size=gs, axis_index_groups=groups, tiled=tiled)
    assert_same(got, naive.all_gather(x, mesh, names, axis, tiled, groups), "all_gather")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@given(setups(), st.booleans(), st.integers(0, 1), st.integers(1, 2))
def test_reduce_scatter_matches_naive(s, tiled, dim, mult):
    mesh, names, k, groups, dtype, inv, seed = s
    gs = len(groups[0]) if groups else k
    local = [2, 2]
    local[dim] = gs * (mult if tiled else 1)
    x = _data(mesh, inv, local, dtype, seed)
    if dtype == np.bool_:  # JAX's reduce_scatter adds with `add`, which rejects bool
        with pytest.raises(TypeError, match="does not accept dtype bool"):
            scatter.reduce_scatter(x, mesh=mesh, axis_name=names, scatter_dimension=dim,
                                   axis_size=gs, axis_index_groups=groups, tiled=tiled)
        return
    got = scatter.reduce_scatter(x, mesh=mesh, axis_name=names, scatter_dimension=dim,
                                 axis_size=gs, axis_index_groups=groups, tiled=tiled)
    assert_same(got, naive.reduce_scatter(x, mesh, names, dim, tiled, groups), "reduce_scatter")


@given(setups(), st.integers(0, 2), st.integers(0, 2), st.integers(1, 2))
def test_all_to_all_matches_naive(s, split, concat, mult):
    mesh, names, k, groups, dtype, inv, seed = s
    gs = len(groups[0]) if groups else k
    local = [2, 3, 1]
    local[split] = gs * mult
    x = _data(mesh, inv, local, dtype, seed)
    got = a2a_k.all_to_all(x, mesh=mesh, axis_name=names, split_axis=split, concat_axis=concat,
                           axis_index_groups=groups, tiled=True)
    assert_same(got, naive.all_to_all(x, mesh, names, split, concat, groups), "all_to_all")


@given(setups(groups_ok=False), st.data())
def test_ppermute_matches_naive(s, data):
    mesh, names, k, _, dtype, inv, seed = s
    srcs = data.draw(st.permutations(range(k)))
    dsts = data.draw(st.permutations(range(k)))
    n = data.draw(st.integers(0, k))
    perm = list(zip(srcs[:n], dsts[:n]))
    x = _data(mesh, inv, (2,), dtype, seed)
    got = permute.ppermute(x, mesh=mesh, axis_name=names, perm=perm)
    assert_same(got, naive.ppermute(x, mesh, names, perm), f"ppermute {perm}")


@given(setups(groups_ok=False), st.data())
def test_pbroadcast_and_axis_index_match_naive(s, data):
    mesh, names, k, _, dtype, inv, seed = s
    source = data.draw(st.integers(0, k - 1))
    x = _data(mesh, inv, (2,), dtype, seed)
    got = permute.pbroadcast(x, mesh=mesh, axis_name=names, source=source)
    assert_same(got, naive.pbroadcast(x, mesh, names, source), "pbroadcast")
    assert_same(permute.axis_index(mesh=mesh, axis_name=names), naive.axis_index(mesh, names),
                "axis_index")


@given(setups(), st.data())
def test_ragged_all_to_all_matches_naive(s, data):
    mesh, names, k, groups, dtype, inv, seed = s
    gs = len(groups[0]) if groups else k
    rng = np.random.default_rng(seed)
    spd = data.draw(st.integers(1, 2))
    n = gs * spd
    sizes = mesh.axis_sizes
    # every sender sends slice i of size send[i] to member i // spd, which stores it in its
    # own disjoint region [slot * 3, slot * 3 + size) with slot = sender_pos * spd + i % spd
    send = rng.integers(0, 4, sizes + (n,))
    in_off = rng.integers(0, 3, sizes + (n,))
    out_off = np.zeros_like(send)
    gsz = (gs * spd) * 3
    lin = naive.axis_index(mesh, names)
    pos_in_group = np.zeros_like(lin)
    for g in (groups or [list(range(k))]):
        for j, m in enumerate(g):
            pos_in_group[lin == m] = j
    for i in range(n):
        out_off[..., i] = (pos_in_group * spd + i % spd) * 3
    # recv_sizes: the all_to_all of send sizes, computed with the naive reference
    recv = naive.all_to_all(send, mesh, names, 0, 0, groups)
    operand = _data(mesh, [False] * mesh.ndim, (6, 2), dtype, seed + 1)
    output = _data(mesh, [False] * mesh.ndim, (gsz, 2), dtype, seed + 2)
    got = ragged.ragged_all_to_all(operand, output, in_off, send, out_off, recv, mesh=mesh,
                                   axis_name=names, axis_index_groups=groups)
    want = naive.ragged_all_to_all(operand, output, in_off, send, out_off, recv, mesh, names,
                                   groups)
    assert_same(got, want, "ragged_all_to_all")
