"""Two placement rules refsim and xla_backend share.

1. `refsim.jit` traces under the mesh its shardings name (as `xla_backend.jit` runs under
   `jax.set_mesh` of it), so a bare `PartitionSpec` in `with_sharding_constraint` finds its mesh.
2. `xla_backend.shard_map` with `axis_names` (partially manual) pins every output to
   `NamedSharding(mesh, out_spec)`: replicated over the auto axes, as refsim lays it out,
   instead of the layout XLA's partitioner would pick.
Expected values are worked out by hand / with plain NumPy below.
"""
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as JP

import refsim
import xla_backend
from refsim import Mesh, NamedSharding, PartitionSpec as P

MESH = Mesh((2, 4), ("x", "y"), device_ids=np.array([[3, 1, 0, 2], [7, 6, 5, 4]]))
A = np.arange(32, dtype=np.float32).reshape(8, 4)


def _constrained(a):
    return jax.lax.with_sharding_constraint(a * 2, JP("y", None)) + 1


def _blocks(arr):
    return {s.device_id: (tuple((i.start or 0, i.stop) for i in s.index), np.asarray(s.data)) for s in arr.shards}


@pytest.mark.parametrize("engine", [refsim, xla_backend])
def test_bare_spec_constraint_finds_the_shardings_mesh(engine):
    s = NamedSharding(MESH, P("x", None))
    out = engine.jit(_constrained, in_shardings=s, out_shardings=s)(A)
    # P('x', None): mesh row i (devices [3,1,0,2] or [7,6,5,4]) holds rows 4i:4i+4, all columns
    for dev, (index, data) in _blocks(out).items():
        row = 0 if dev in (3, 1, 0, 2) else 1
        assert index[0] == (4 * row, 4 * row + 4)
        np.testing.assert_array_equal(data, 2 * A[4 * row:4 * row + 4] + 1)


def test_refsim_and_xla_place_the_constraint_program_alike():
    s = NamedSharding(MESH, P(None, "y"))
    want = _blocks(xla_backend.jit(_constrained, out_shardings=s)(A))
    got = _blocks(refsim.jit(_constrained, out_shardings=s)(A))
    assert want.keys() == got.keys()
    for dev in want:
        assert want[dev][0] == got[dev][0]
        np.testing.assert_array_equal(want[dev][1], got[dev][1])


def test_pmap_inside_jit_traces_under_the_context_mesh():
    """jax.pmap builds a shard_map over concrete devices; its mesh must match the context's."""
    m = Mesh((8,), ("i",))
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    g = lambda v: jax.pmap(lambda r: jax.lax.psum(r, "i") + r, axis_name="i")(v)  # noqa: E731
    out = refsim.jit(g, out_shardings=NamedSharding(m, P("i")))(x)
    np.testing.assert_array_equal(np.asarray(out), x.sum(axis=0, keepdims=True) + x)


def test_without_a_mesh_the_constraint_fails_as_in_jax():
    with pytest.raises(RuntimeError, match="requires a non-empty mesh in context"):
        jax.jit(_constrained)(A)
    with pytest.raises(RuntimeError, match="requires a non-empty mesh in context"):
        refsim.jit(_constrained)(A)


def _nested(a):
    inner = jax.shard_map(lambda b: jax.lax.psum(b, "y") + b, in_specs=JP("y"), out_specs=JP("y"),
                          axis_names={"y"})
    return inner(a) * 2


def test_partially_manual_outputs_are_replicated_over_the_auto_axes():
    """Unpinned, XLA:CPU returns this program sharded P(('x', 'y')); pinned, it is P('x')."""
    mesh = Mesh((2, 4), ("x", "y"))
    a = np.arange(16, dtype=np.float32)
    kw = dict(mesh=mesh, in_specs=P("x"), out_specs=P("x"), axis_names={"x"})
    out = xla_backend.shard_map(_nested, **kw)(a)
    # outer block i = a[8i:8i+8]; its y-blocks are pairs; psum over y adds the 4 pairs
    want = np.concatenate([2 * (blk + np.tile(blk.reshape(4, 2).sum(0), 4)) for blk in (a[:8], a[8:])])
    np.testing.assert_array_equal(np.asarray(out), want)
    assert out.sharding.spec == P("x")
    for dev, (index, data) in _blocks(out).items():
        i = dev // 4                       # row-major ids: devices 0-3 are x=0, 4-7 are x=1
        assert index == ((8 * i, 8 * i + 8),)
        np.testing.assert_array_equal(data, want[8 * i:8 * i + 8])
    ref = _blocks(refsim.shard_map(_nested, **kw)(a))
    assert {d: b[0] for d, b in ref.items()} == {d: b[0] for d, b in _blocks(out).items()}
