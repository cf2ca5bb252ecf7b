"""conformance.faults: every fault changes XLA's result exactly as its bug model says,
leaves refsim's result alone, and is gone (rules and compiled executables) after the block.

Expected faulty values come from NumPy models of each bug written here, per device.
"""
import numpy as np
import pytest

import jax
from jax.sharding import PartitionSpec as JP

import refsim
import xla_backend
from refsim import Mesh, NamedSharding, PartitionSpec as P
from refsim import compat as _compat
from conformance.faults import lowering as faults

N = 8
X = (np.arange(N * 2, dtype=np.float32).reshape(N, 2) + 1) * np.array([1, -3], np.float32)  # distinct rows


@pytest.fixture(scope="module")
def m8():
    return xla_backend.mesh((N,), ("i",))


@pytest.fixture(scope="module")
def m24():
    return xla_backend.mesh((2, 4), ("x", "y"))


def smap(api, f, mesh, x, in_spec, out_spec):
    return np.asarray(api.shard_map(f, mesh=mesh, in_specs=(in_spec,), out_specs=out_spec)(x))


def check(fault, f, mesh, x, in_spec, out_spec, faulty):
    """refsim == XLA without the fault; XLA == `faulty` (the bug model) with it; refsim and
    XLA are unchanged inside and after the block."""
    want = smap(refsim, f, mesh, x, in_spec, out_spec)
    np.testing.assert_array_equal(smap(xla_backend, f, mesh, x, in_spec, out_spec), want)
    with faults.inject(fault):
        got = smap(xla_backend, f, mesh, x, in_spec, out_spec)
        np.testing.assert_array_equal(smap(refsim, f, mesh, x, in_spec, out_spec), want)
    assert not np.array_equal(got, want), f"{fault} did not change XLA's result"
    np.testing.assert_array_equal(got, faulty)
    np.testing.assert_array_equal(smap(xla_backend, f, mesh, x, in_spec, out_spec), want)


# -- ppermute ----------------------------------------------------------------------------------
def test_ppermute_pairs_reversed(m8):
    ring = [(i, (i + 1) % N) for i in range(N)]
    f = lambda a: jax.lax.ppermute(a, "i", perm=ring)
    check("ppermute_pairs_reversed", f, m8, X, P("i"), P("i"), np.roll(X, -1, axis=0))


def test_ppermute_fixed_points_dropped(m8):
    perm = [(0, 0), (5, 5)] + [(s, d) for s, d in [(1, 2), (2, 3), (3, 4), (4, 6), (6, 7), (7, 1)]]
    f = lambda a: jax.lax.ppermute(a, "i", perm=perm)
    faulty = np.zeros_like(X)
    for s, d in perm:
        if s != d:
            faulty[d] = X[s]
    check("ppermute_fixed_points_dropped", f, m8, X, P("i"), P("i"), faulty)


def test_ppermute_one_cycle_kept(m8):
    perm = [(0, 1), (1, 0), (2, 3), (3, 4), (4, 2), (5, 6), (6, 7), (7, 5)]
    f = lambda a: jax.lax.ppermute(a, "i", perm=perm)
    faulty = np.zeros_like(X)
    faulty[1], faulty[0] = X[0], X[1]
    check("ppermute_one_cycle_kept", f, m8, X, P("i"), P("i"), faulty)


def test_components_split_cycles_and_chains():
    assert faults._components([(0, 1), (1, 0), (2, 2), (3, 4)]) == [[(0, 1), (1, 0)], [(2, 2)], [(3, 4)]]
    assert faults._components([(4, 5), (3, 4)]) == [[(3, 4), (4, 5)]]


# -- groups and axis order ------------------------------------------------------------------------
def test_groups_strided_as_contiguous_pmap():
    groups = [[0, 2, 4, 6], [1, 3, 5, 7]]
    f = lambda a: jax.lax.psum(a, "i", axis_index_groups=groups)
    want = np.asarray(refsim.pmap(f, axis_name="i")(X))
    np.testing.assert_array_equal(want[0], X[::2].sum(0))
    with faults.inject("groups_strided_as_contiguous"):
        got = np.asarray(xla_backend.pmap(f, axis_name="i")(X))
    faulty = np.concatenate([np.broadcast_to(X[:4].sum(0), (4, 2)), np.broadcast_to(X[4:].sum(0), (4, 2))])
    np.testing.assert_array_equal(got, faulty)
    np.testing.assert_array_equal(np.asarray(xla_backend.pmap(f, axis_name="i")(X)), want)


def test_groups_strided_as_contiguous_all_gather(m8):
    groups = [[0, 4], [1, 5], [2, 6], [3, 7]]          # strided: range(i, 8, 4)
    f = lambda a: jax.lax.all_gather(a, "i", axis_index_groups=groups, tiled=True)
    # contiguous [[0,1],[2,3],...]: device d gathers rows 2*(d//2), 2*(d//2)+1
    faulty = np.concatenate([np.concatenate([X[2 * (d // 2)], X[2 * (d // 2) + 1]])[None] for d in range(N)])
    check("groups_strided_as_contiguous", f, m8, X, P("i"), P("i"), faulty.reshape(N * 2, 2))


def test_contiguous_groups_are_left_alone():
    assert faults._is_strided([[0, 2], [1, 3]]) and faults._is_strided([[0, 3, 6], [1, 4, 7], [2, 5, 8]])
    assert not faults._is_strided([[0, 1], [2, 3]]) and not faults._is_strided([[0], [1]])
    assert not faults._is_strided([[1, 3], [0, 2]])


def test_multi_axis_mesh_order(m24):
    x = X                                               # row p on mesh position p = 4 * x + y
    f = lambda a: jax.lax.all_gather(a, ("y", "x"), tiled=True)
    # ('y', 'x') numbers position (x, y) as 2 * y + x; mesh order numbers it 4 * x + y
    faulty = np.tile(X, (N, 1))
    check("multi_axis_mesh_order", f, m24, x, P(("x", "y")), P(("x", "y")), faulty)


# -- data layout of all_to_all / all_gather / psum_scatter ------------------------------------------
def test_all_to_all_split_concat_swapped(m8):
    x = np.arange(N * 16 * 3, dtype=np.int32).reshape(N * 16, 3)   # local (16, 3): split 0, concat 1
    f = lambda a: jax.lax.all_to_all(a, "i", 0, 1, tiled=True)
    blocks = x.reshape(N, 16, 3)
    faulty = []
    for d in range(N):
        chunks = [blocks[j][2 * d:2 * d + 2] for j in range(N)]          # what device d receives
        faulty.append(np.concatenate(chunks, axis=0).reshape(2, 24))     # stacked on split, read as (2, 24)
    check("all_to_all_split_concat_swapped", f, m8, x, P("i"), P("i"), np.concatenate(faulty))


def test_all_to_all_split_concat_swapped_concat_before_split(m8):
    x = np.arange(N * 2 * 8, dtype=np.int32).reshape(N * 2, 8)    # local (2, 8): split 1, concat 0
    f = lambda a: jax.lax.all_to_all(a, "i", 1, 0, tiled=True)
    blocks = x.reshape(N, 2, 8)
    faulty = []
    for d in range(N):
        chunks = [blocks[j][:, d:d + 1] for j in range(N)]               # (2, 1) from each device
        faulty.append(np.concatenate(chunks, axis=1).reshape(16, 1))
    check("all_to_all_split_concat_swapped", f, m8, x, P("i"), P("i"), np.concatenate(faulty))


def test_all_gather_reversed_order(m8):
    f = lambda a: jax.lax.all_gather(a, "i", axis=1, tiled=True)
    faulty = np.tile(X[::-1].reshape(1, -1), (N, 1))
    check("all_gather_reversed_order", f, m8, X, P("i"), P("i"), faulty)


def test_all_gather_reversed_order_untiled(m8):
    f = lambda a: jax.lax.all_gather(a[0], "i")
    faulty = np.tile(X[::-1], (N, 1))
    check("all_gather_reversed_order", f, m8, X, P("i"), P("i"), faulty)


def test_psum_scatter_wrong_dimension(m8):
    x = np.arange(N * 2 * 8, dtype=np.int32).reshape(N * 2, 8) % 7 - 3   # local (2, 8)
    f = lambda a: jax.lax.psum_scatter(a, "i", scatter_dimension=1, tiled=True)
    total = x.reshape(N, 2, 8).sum(0)
    faulty = np.concatenate([total.reshape(N, 2)[d].reshape(2, 1) for d in range(N)])
    check("psum_scatter_wrong_dimension", f, m8, x, P("i"), P("i"), faulty)


# -- reductions ----------------------------------------------------------------------------------------
def test_pmax_wrong_start_float(m8):
    x = -np.abs(X) - 1
    f = lambda a: jax.lax.pmax(a, "i")
    faulty = np.full((2,), np.finfo(np.float32).tiny, np.float32)[None]
    check("pmax_pmin_wrong_start", f, m8, x, P("i"), P(), faulty)


def test_pmin_wrong_start_int(m8):
    x = np.arange(N * 3, dtype=np.int32).reshape(N, 3) + 1
    f = lambda a: jax.lax.pmin(a, "i")
    check("pmax_pmin_wrong_start", f, m8, x, P("i"), P(), np.zeros((1, 3), np.int32))


def test_psum_drop_member(m8):
    f = lambda a: jax.lax.psum(a, "i")
    faulty = np.concatenate([np.broadcast_to(X[:7].sum(0), (7, 2)), X[7:]])
    want = smap(refsim, f, m8, X, P("i"), P())
    with faults.inject("psum_drop_member"):
        res = xla_backend.shard_map(f, mesh=m8, in_specs=(P("i"),), out_specs=P())(X)
        per_device = np.concatenate([np.asarray(s.data) for s in sorted(res.shards, key=lambda s: s.device_id)])
    np.testing.assert_array_equal(per_device, faulty)
    np.testing.assert_array_equal(smap(xla_backend, f, m8, X, P("i"), P()), want)


def test_psum_drop_member_groups_pmap():
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    f = lambda a: jax.lax.psum(a, "i", axis_index_groups=groups)
    with faults.inject("psum_drop_member"):
        got = np.asarray(xla_backend.pmap(f, axis_name="i")(X))
    faulty = np.concatenate([np.broadcast_to(X[:3].sum(0), (3, 2)), X[3:4],
                             np.broadcast_to(X[4:7].sum(0), (3, 2)), X[7:]])
    np.testing.assert_array_equal(got, faulty)


# -- axis_index and output placement ---------------------------------------------------------------------
def test_axis_index_reversed(m24):
    f = lambda a: a + jax.lax.axis_index("y").astype(a.dtype)
    y_of_row = np.arange(N) % 4
    check("axis_index_reversed", f, m24, X, P(("x", "y")), P(("x", "y")), X + (3 - y_of_row)[:, None])


def test_output_shards_swapped(m8):
    f = lambda a: a * 2
    faulty = 2 * X[[1, 0, 2, 3, 4, 5, 6, 7]]
    check("output_shards_swapped", f, m8, X, P("i"), P("i"), faulty)


def test_output_shards_swapped_picks_a_differing_block(m24):
    # out P(None, 'x'): positions 0..3 (x = 0) share a block; position 4 is the first that differs
    x = np.arange(2 * 8, dtype=np.float32).reshape(2, 8)
    f = lambda a: a + 1
    faulty = np.concatenate([x[:, 4:], x[:, :4]], axis=1) + 1
    check("output_shards_swapped", f, m24, x, P(None, "x"), P(None, "x"), faulty)


def test_reshard_permutation_ignored(m8):
    rev = Mesh((N,), ("i",), device_ids=np.arange(N)[::-1])
    a = np.arange(N * 2.0).reshape(N, 2)

    def shards(api):
        placed = api.device_put(a, NamedSharding(m8, P("i")))
        out = api.device_put(placed, NamedSharding(rev, P("i")))
        return {s.device_id: np.asarray(s.data) for s in out.shards}

    want = shards(refsim)
    assert all(np.array_equal(want[d], a[N - 1 - d:N - d]) for d in range(N))
    with faults.inject("reshard_permutation_ignored"):
        got = shards(xla_backend)
    assert all(np.array_equal(got[d], a[d:d + 1]) for d in range(N)), got
    after = shards(xla_backend)
    assert all(np.array_equal(after[d], want[d]) for d in range(N))


# -- faults on ops XLA:CPU cannot run: checked in the lowered module -------------------------------------
def _lowered_text(f, mesh, x, platform):
    jm = xla_backend.jax_mesh(mesh)
    g = jax.jit(jax.shard_map(f, mesh=jm, in_specs=JP("i"), out_specs=JP("i")))
    return g.trace(jax.ShapeDtypeStruct(x.shape, x.dtype)).lower(lowering_platforms=(platform,)).as_text()


def test_pbroadcast_wrong_source_lowering(m8):
    f = lambda a: jax.lax.pbroadcast(a, "i", source=3)
    good = _lowered_text(f, m8, X, "cuda")
    with faults.inject("pbroadcast_wrong_source"):
        bad = _lowered_text(f, m8, X, "cuda")
    # the collective_broadcast's first group member is the source
    assert "[3, 0, 1, 2, 4, 5, 6, 7]" in good.replace("\n", "")
    assert "[4, 0, 1, 2, 3, 5, 6, 7]" in bad.replace("\n", "")
    assert _lowered_text(f, m8, X, "cuda") == good
    assert not faults.FAULTS["pbroadcast_wrong_source"].cpu


def test_ragged_all_to_all_single_device_offsets_lowering(m24):
    mesh = xla_backend.mesh((N, 1), ("i", "j"))

    def f(op, out, io, ss, oo, rs):
        return jax.lax.ragged_all_to_all(op[0], out[0], io[0], ss[0], oo[0], rs[0], axis_name="j")[None]

    jm = xla_backend.jax_mesh(mesh)
    args = [jax.ShapeDtypeStruct((N, 4), np.float32), jax.ShapeDtypeStruct((N, 6), np.float32)] + \
        [jax.ShapeDtypeStruct((N, 1), np.int32)] * 4
    g = jax.jit(jax.shard_map(f, mesh=jm, in_specs=(JP("i"),) * 6, out_specs=JP("i")))
    text = lambda: g.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    good = text()
    with faults.inject("ragged_all_to_all_single_device_offsets"):
        bad = text()
    assert "ragged_all_to_all" in good and "multiply" not in good
    assert "multiply" in bad          # output_offsets * 0 feeds the custom call
    # groups of two devices are not touched
    mesh2 = xla_backend.mesh((4, 2), ("i", "j"))
    g2 = jax.jit(jax.shard_map(f, mesh=xla_backend.jax_mesh(mesh2), in_specs=(JP("i"),) * 6, out_specs=JP("i")))
    args2 = [jax.ShapeDtypeStruct((4,) + a.shape[1:], a.dtype) for a in args]
    with faults.inject("ragged_all_to_all_single_device_offsets"):
        assert "multiply" not in g2.trace(*args2).lower(lowering_platforms=("cuda",)).as_text()


# -- numerics, device ids, the jit path ------------------------------------------------------------------
def test_pmax_pmin_drop_nan(m8):
    # XLA:CPU itself ignores NaN in pmax (-inf where every member is NaN: xfails/cpu.txt); the fault
    # substitutes the lowest finite value, which an all-NaN column and a -inf member tell apart.
    x = X.copy()
    x[:, 0] = np.nan
    x[:, 1] = -np.inf
    x[3, 1] = np.nan
    f = lambda a: jax.lax.pmax(a, "i")
    base = smap(xla_backend, f, m8, x, P("i"), P())
    np.testing.assert_array_equal(base, [[-np.inf, -np.inf]])
    low = np.finfo(np.float32).min
    with faults.inject("pmax_pmin_drop_nan"):
        got = smap(xla_backend, f, m8, x, P("i"), P())
        got_min = smap(xla_backend, lambda a: jax.lax.pmin(a, "i"), m8, x, P("i"), P())
    np.testing.assert_array_equal(got, np.where(np.isnan(x), low, x).max(axis=0, keepdims=True))
    np.testing.assert_array_equal(got_min, np.where(np.isnan(x), -low, x).min(axis=0, keepdims=True))


def test_psum_accumulates_in_bf16(m8):
    # 1 + k * 2**-10 (k < 4: under half of bfloat16's ulp 2**-7 at 1) rounds to 1 in bfloat16;
    # the float32 sum keeps it
    x = (1 + (np.arange(N * 2, dtype=np.float32).reshape(N, 2) % 4) * 2.0 ** -10) * np.float32([1, 2])
    import ml_dtypes

    faulty = x.astype(ml_dtypes.bfloat16).astype(np.float32).sum(axis=0, keepdims=True)   # 8s and 16s: exact
    check("psum_accumulates_in_bf16", lambda a: jax.lax.psum(a, "i"), m8, x, P("i"), P(), faulty)


def test_axis_index_wrong_device_id(m8):
    f = lambda a: a + jax.lax.axis_index("i").astype(a.dtype)
    check("axis_index_wrong_device_id", f, m8, X, P("i"), P("i"), X + ((np.arange(N) + 1) % N)[:, None])


def _jit(api, f, mesh, x, spec_in, spec_out):
    return np.asarray(api.jit(f, in_shardings=(NamedSharding(mesh, spec_in),),
                              out_shardings=NamedSharding(mesh, spec_out))(x))


def test_partitioned_reduction_drops_shard(m8):
    f = lambda a: a.sum(axis=0, keepdims=True) * 2
    want = _jit(refsim, f, m8, X, P("i", None), P())
    np.testing.assert_array_equal(_jit(xla_backend, f, m8, X, P("i", None), P()), want)
    with faults.inject("partitioned_reduction_drops_shard"):
        got = _jit(xla_backend, f, m8, X, P("i", None), P())
        inside = smap(xla_backend, lambda a: a.sum(axis=0, keepdims=True), m8, X, P(), P())
    # 8 rows over 8 devices: the last device's row is left out; inside shard_map nothing changes
    np.testing.assert_array_equal(got, X[:-1].sum(axis=0, keepdims=True) * 2)
    np.testing.assert_array_equal(inside, X.sum(axis=0, keepdims=True))


def test_sharding_constraint_wrong_permutation(m8):
    f = lambda a: jax.lax.with_sharding_constraint(a + 1, JP("i", None)) * 2
    want = _jit(refsim, f, m8, X, P(), P())
    np.testing.assert_array_equal(_jit(xla_backend, f, m8, X, P(), P()), want)
    with faults.inject("sharding_constraint_wrong_permutation"):
        got = _jit(xla_backend, f, m8, X, P(), P())
    faulty = (X + 1) * 2
    faulty[[0, 1]] = faulty[[1, 0]]          # device 0's row and device 1's (the first other block) swapped
    np.testing.assert_array_equal(got, faulty)


# -- the context manager ----------------------------------------------------------------------------------
def test_names_cover_the_issue_classes():
    assert faults.names() == (
        "ppermute_pairs_reversed", "ppermute_fixed_points_dropped", "ppermute_one_cycle_kept",
        "groups_strided_as_contiguous", "multi_axis_mesh_order", "all_to_all_split_concat_swapped",
        "all_gather_reversed_order", "psum_scatter_wrong_dimension", "pmax_pmin_wrong_start",
        "psum_drop_member", "pbroadcast_wrong_source", "axis_index_reversed",
        "ragged_all_to_all_single_device_offsets", "pmax_pmin_drop_nan", "psum_accumulates_in_bf16",
        "axis_index_wrong_device_id", "partitioned_reduction_drops_shard", "sharding_constraint_wrong_permutation",
        "reshard_permutation_ignored", "output_shards_swapped")


def test_inject_restores_rules_even_on_error():
    default, per_platform, _ = _compat.lowering_tables()
    dispatch = _compat.reshard_dispatch_module()
    logical_ids = dispatch._cached_logical_device_ids
    snapshot = dict(default), {p: dict(t) for p, t in per_platform.items()}
    with pytest.raises(RuntimeError, match="boom"):
        with faults.inject(list(faults.names())):
            assert default[_compat.primitive_by_name("ppermute")] is not snapshot[0][_compat.primitive_by_name("ppermute")]
            raise RuntimeError("boom")
    assert dict(default) == snapshot[0]
    assert {p: dict(t) for p, t in per_platform.items() if t or p in snapshot[1]} == \
        {p: t for p, t in snapshot[1].items() if t or p in per_platform}
    assert dispatch._cached_logical_device_ids is logical_ids


def test_inject_drops_cached_executables(m8):
    ring = [(i, (i + 1) % N) for i in range(N)]
    f = lambda a: jax.lax.ppermute(a, "i", perm=ring)
    g = xla_backend.shard_map(f, mesh=m8, in_specs=(P("i"),), out_specs=P("i"))
    good = np.asarray(g(X))                          # compiled and cached outside
    jitted = jax.jit(jax.shard_map(f, mesh=xla_backend.jax_mesh(m8), in_specs=JP("i"), out_specs=JP("i")))
    np.testing.assert_array_equal(np.asarray(jitted(X)), good)
    with faults.inject("ppermute_pairs_reversed"):
        assert xla_backend.stats()["cached_executables"] == 0
        np.testing.assert_array_equal(np.asarray(g(X)), np.roll(X, -1, 0))
        np.testing.assert_array_equal(np.asarray(jitted(X)), np.roll(X, -1, 0))
    assert xla_backend.stats()["cached_executables"] == 0
    np.testing.assert_array_equal(np.asarray(g(X)), good)
    np.testing.assert_array_equal(np.asarray(jitted(X)), good)


def test_unknown_fault_name():
    with pytest.raises(ValueError, match=r"unknown fault 'psum_wrong'; choose from ppermute_pairs_reversed"):
        with faults.inject("psum_wrong"):
            pass


# -- one inject over every stage ------------------------------------------------------------------
def test_inject_dispatches_on_the_stage_and_removes_everything_after():
    from conformance import faults as all_faults
    from conformance.debug import region
    from conformance.debug.explain import xla_side
    from conformance.faults import compiler, jaxpr, numerics

    assert all_faults.stage_of("psum_drop_member") == "lowering"
    assert all_faults.stage_of(numerics.DOT_GENERAL_BF16) == "lowering"
    assert all_faults.stage_of(compiler.reversed_permute_pairs) == "compiler"
    runner = jaxpr.reversed_ppermute()
    assert all_faults.stage_of(runner) == "jaxpr"
    planted = [compiler.reversed_permute_pairs, compiler.all_reduce_sum_as_max, runner]
    with all_faults.inject(planted, warn=False) as names:      # nothing runs: none fires
        assert names == ["reversed_permute_pairs", "all_reduce_sum_as_max", "reversed_ppermute"]
        assert xla_side.PLANTED_EDITS == [compiler.reversed_permute_pairs, compiler.all_reduce_sum_as_max]
        assert region.planted_runner is runner
    assert xla_side.PLANTED_EDITS == [] and region.planted_runner is None
    with pytest.raises(RuntimeError), all_faults.inject(compiler.reversed_permute_pairs):
        raise RuntimeError("leaving by an exception")
    assert xla_side.PLANTED_EDITS == []


def test_planted_edits_run_after_explains_own_edit_in_order():
    from conformance.debug.explain import xla_side
    from conformance.faults import inject, mark

    @mark("compiler")
    def add_b(text):
        return text + "b"

    assert xla_side.with_planted(None) is None
    with inject(add_b):
        assert xla_side.with_planted(lambda t: t + "a")("x") == "xab"
        assert xla_side.with_planted(None)("x") == "xb"


def test_inject_refuses_what_is_not_a_fault_and_two_runners():
    from conformance.faults import inject, jaxpr

    with pytest.raises(TypeError, match="not a fault.*conformance.faults.mark"):
        with inject(lambda text: text):
            pass
    with pytest.raises(ValueError, match="2 jaxpr-stage faults"):
        with inject([jaxpr.reversed_ppermute(), jaxpr.regrouped_psum(groups=((0,), (1,)))]):
            pass
    with pytest.raises(ValueError, match="unknown fault 'no_such_fault'"):
        with inject("no_such_fault"):
            pass
