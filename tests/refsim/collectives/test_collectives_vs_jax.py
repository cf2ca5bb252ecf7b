"""refsim.collectives against real JAX: the same collective under jax.shard_map on 8 CPU devices.

The global input is the stacked array itself (mesh dims first, each device holds its
own block); the shard_map output, with out_specs over the same mesh dims, is the
stacked result, compared device by device with refsim's (broadcast over size-1 dims).
"""
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import refsim.collectives as C
from refsim import Mesh
from refsim.compat import binds_nonnegative_collective_dims

MESHES = [((8,), ("a",)), ((2, 4), ("a", "b")), ((2, 2, 2), ("a", "b", "c"))]


def run_jax(shape, names, fn, x, check_vma=True):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(shape), names)
    nm = len(shape)
    spec = P(*names)

    def body(blk):
        out = fn(blk.reshape(blk.shape[nm:]))
        return out.reshape((1,) * nm + out.shape)
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=check_vma))
    return np.asarray(f(x))


def compare(shape, names, jax_fn, ref_fn, local=(4, 4), dtype=np.float32, check_vma=True):
    x = (np.arange(int(np.prod(shape + local))) % 13 - 6).astype(dtype).reshape(shape + local)
    want = run_jax(shape, names, jax_fn, x, check_vma)
    got = np.broadcast_to(ref_fn(x, Mesh(shape, names)), want.shape)
    for pos in np.ndindex(*shape):
        np.testing.assert_array_equal(got[pos], want[pos], err_msg=f"device at mesh position {pos}")


def _axes(names, which):
    return {"first": names[0], "all": names, "rev": names[::-1], "last": names[-1]}[which]


@pytest.mark.parametrize("shape,names", MESHES)
@pytest.mark.parametrize("which", ["first", "all", "rev", "last"])
def test_reductions(shape, names, which):
    ax = _axes(names, which)
    for jf, rf in [(jax.lax.psum, C.psum), (jax.lax.pmax, C.pmax), (jax.lax.pmin, C.pmin)]:
        compare(shape, names, lambda v: jf(v, ax), lambda x, m: rf(x, ax, mesh=m), dtype=np.int32)
    compare(shape, names, lambda v: jax.lax.pmean(v, ax), lambda x, m: C.pmean(x, ax, mesh=m))


@pytest.mark.parametrize("shape,names", MESHES)
def test_psum_groups(shape, names):
    ax = names[-1] if len(shape) > 1 else names[0]
    k = shape[-1]
    groups = [list(range(0, k, 2)), list(range(1, k, 2))]  # strided
    compare(shape, names, lambda v: jax.lax.psum(v, ax, axis_index_groups=groups),
            lambda x, m: C.psum(x, ax, axis_index_groups=groups, mesh=m), check_vma=False)


@pytest.mark.parametrize("groups", [[[0], [1, 2, 3, 4, 5, 6, 7]], [[6, 1], [0, 2, 3, 4, 5, 7]]])
def test_pmean_unequal_groups(groups):
    """JAX divides every group's sum by len(groups[0]); refsim.collectives.pmean does the same.
    (First groups of 1 and 2 devices: a power-of-2 n, which XLA:CPU's reciprocal multiply divides exactly.)"""
    compare((8,), ("a",), lambda v: jax.lax.pmean(v, "a", axis_index_groups=groups),
            lambda x, m: C.pmean(x, "a", axis_index_groups=groups, mesh=m), check_vma=False)


@pytest.mark.parametrize("shape,names", MESHES)
@pytest.mark.parametrize("tiled,axis", [(False, 0), (False, -1), (True, 1), (True, 0)])
def test_all_gather(shape, names, tiled, axis):
    for which in ("first", "rev"):
        ax = _axes(names, which)
        compare(shape, names, lambda v: jax.lax.all_gather(v, ax, axis=axis, tiled=tiled),
                lambda x, m: C.all_gather(x, ax, axis=axis, tiled=tiled, mesh=m))


@pytest.mark.parametrize("shape,names", MESHES)
def test_all_gather_groups(shape, names):
    k = shape[0]
    groups = [[i] for i in range(k)][::-1] if k == 2 else [[0, 2, 4, 6], [7, 5, 3, 1]]
    compare(shape, names, lambda v: jax.lax.all_gather(v, names[0], axis_index_groups=groups),
            lambda x, m: C.all_gather(x, names[0], axis_index_groups=groups, mesh=m),
            check_vma=False)


@pytest.mark.parametrize("shape,names", MESHES)
@pytest.mark.parametrize("dim,tiled", [(0, False), (1, True), (-1, True)])
def test_psum_scatter(shape, names, dim, tiled):
    if dim < 0 and not binds_nonnegative_collective_dims():
        pytest.skip("JAX < 0.11 binds a negative scatter_dimension unchanged and the StableHLO "
                    "verifier rejects it (0.11 and later count it from the end)")
    ax = _axes(names, "rev")
    k = int(np.prod(shape))
    local = (k, 2) if dim == 0 else (2, k)
    compare(shape, names, lambda v: jax.lax.psum_scatter(v, ax, scatter_dimension=dim, tiled=tiled),
            lambda x, m: C.psum_scatter(x, ax, scatter_dimension=dim, tiled=tiled, mesh=m),
            local=local, dtype=np.int32)


@pytest.mark.parametrize("shape,names", MESHES)
@pytest.mark.parametrize("split,concat,tiled", [(0, 0, False), (0, 1, False), (1, 0, False),
                                                (0, 1, True), (1, 1, True)])
def test_all_to_all(shape, names, split, concat, tiled):
    for which in ("first", "all", "rev"):
        ax = _axes(names, which)
        k = int(np.prod([dict(zip(names, shape))[n] for n in (ax if isinstance(ax, tuple) else (ax,))]))
        local = [3, 3]
        local[split] = k * (2 if tiled else 1)
        compare(shape, names, lambda v: jax.lax.all_to_all(v, ax, split, concat, tiled=tiled),
                lambda x, m: C.all_to_all(x, ax, split, concat, tiled=tiled, mesh=m),
                local=tuple(local))


@pytest.mark.parametrize("shape,names", MESHES)
def test_ppermute_and_axis_index(shape, names):
    # multi-axis ppermute only in mesh order: JAX's lowering sorts the group's device ids,
    # which contradicts axis_index order for other orders (JAX 0.12 raises for them).
    for ax in (names[0], names):
        k = int(np.prod([dict(zip(names, shape))[n] for n in (ax if isinstance(ax, tuple) else (ax,))]))
        for perm in ([(i, (i + 1) % k) for i in range(k)], [(0, k - 1)], [(i, i) for i in range(k)]):
            compare(shape, names, lambda v: jax.lax.ppermute(v, ax, perm),
                    lambda x, m: C.ppermute(x, ax, perm, mesh=m))
    for ax in (names, names[::-1]):
        compare(shape, names, lambda v: v + jax.lax.axis_index(ax).astype(v.dtype),
                lambda x, m: x + C.axis_index(ax, mesh=m)[(...,) + (None,) * 2].astype(x.dtype))


def _needs_platform(op: str, why: str):
    """Skip (with the reason) where the platform cannot run `op`; run everywhere else."""
    if jax.devices()[0].platform == "cpu":
        pytest.skip(f"XLA:CPU cannot run {op}: {why}; this test runs on a GPU or TPU with 8 devices")
    if len(jax.devices()) < 8:
        pytest.skip(f"needs 8 devices, {jax.devices()[0].platform} has {len(jax.devices())}")


@pytest.mark.parametrize("shape,names", MESHES)
def test_pbroadcast(shape, names):
    _needs_platform("pbroadcast", "jax 0.10-0.12 register its collective_broadcast lowering for GPU only")
    for ax in (names[0], names):
        k = int(np.prod([dict(zip(names, shape))[n] for n in (ax if isinstance(ax, tuple) else (ax,))]))
        for source in sorted({0, k - 1, k // 2}):
            compare(shape, names, lambda v: jax.lax.pbroadcast(v, ax, source=source),
                    lambda x, m: C.pbroadcast(x, ax, source, mesh=m), check_vma=False)


def _ragged_body(ax, k):
    """Every device sends rows [2j, 2j+2) of its operand to device j, which writes them at rows
    [2i, 2i+2) of its output (i the sender): a ragged all-to-all whose sizes happen to be equal."""
    import jax.numpy as jnp

    def body(v):
        i = jax.lax.axis_index(ax)
        sizes = jnp.full((k,), 2, jnp.int32)
        in_off = jnp.arange(k, dtype=jnp.int32) * 2
        out_off = jnp.full((k,), 2, jnp.int32) * i.astype(jnp.int32)
        return jax.lax.ragged_all_to_all(v, jnp.zeros_like(v), in_off, sizes, out_off, sizes, axis_name=ax)
    return body


@pytest.mark.parametrize("shape,names", MESHES)
def test_ragged_all_to_all(shape, names):
    import refsim

    ax, k, n = names[0], shape[0], int(np.prod(shape))
    mesh = Mesh(shape, names)
    x = (np.arange(n * 2 * k * 3) % 13 - 6).astype(np.float32).reshape(-1, 3)
    spec = refsim.PartitionSpec(names)
    want = np.asarray(refsim.shard_map(_ragged_body(ax, k), mesh=mesh, in_specs=spec, out_specs=spec)(x))
    # by hand: device (j, rest) receives rows 2j..2j+2 of device (i, rest) at rows 2i..2i+2
    blocks = x.reshape(n, 2 * k, 3)
    pos = np.arange(n).reshape(shape)
    by_hand = np.zeros_like(blocks)
    for idx in np.ndindex(*shape):
        for i in range(k):
            by_hand[pos[idx], 2 * i:2 * i + 2] = blocks[pos[(i,) + idx[1:]], 2 * idx[0]:2 * idx[0] + 2]
    np.testing.assert_array_equal(want, by_hand.reshape(x.shape))
    _needs_platform("ragged_all_to_all", "its thunk emitter rejects ragged-all-to-all (UNIMPLEMENTED)")
    jmesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(shape), names)
    got = jax.jit(jax.shard_map(_ragged_body(ax, k), mesh=jmesh, in_specs=P(names), out_specs=P(names)))(x)
    np.testing.assert_array_equal(np.asarray(got), want)
