"""Unreduced layouts (refsim/layouts/unreduced.py): partial sums per device, computed by hand."""
import numpy as np
import pytest

import refsim
from refsim import Mesh, NamedSharding, P
from refsim.interpreter.unreduced import all_reduced, from_array
from refsim.layouts import unreduced as U
from refsim.layouts.mesh import AxisType

X2 = Mesh((2,), ("x",), axis_types=(AxisType.Explicit,))
XYZ = Mesh((2, 2, 2), ("x", "y", "z"), axis_types=(AxisType.Explicit,) * 3)


def _array(mesh, spec, blocks: dict, shape, dtype=np.float32):
    """A refsim.Array whose device at mesh position p holds blocks[p] (its own partial sum)."""
    sh = NamedSharding(mesh, spec)
    index = sh.devices_indices_map(shape)
    shards = [refsim.Shard(int(mesh.device_ids[p]), index[int(mesh.device_ids[p])], np.asarray(b, dtype))
              for p, b in blocks.items()]
    return refsim.Array(shape, dtype, sh, shards)


def test_two_device_partial_sums_add_up():
    # device 0 holds [1, 2], device 1 holds [10, 20]: the value is [11, 22]
    arr = _array(X2, P(unreduced={"x"}), {(0,): [1, 2], (1,): [10, 20]}, (2,))
    parts = U.partial_sums(arr.to_stacked(X2), X2, arr.sharding.spec)
    np.testing.assert_array_equal(parts, [[1, 2], [10, 20]])
    np.testing.assert_array_equal(from_array(arr).total(), [11, 22])
    summed = all_reduced(arr)
    assert summed.sharding.spec == P()
    np.testing.assert_array_equal(np.asarray(summed), [11, 22])


def test_partial_sums_tile_the_sharded_dims_and_keep_one_replica():
    # 2x2x2 mesh, P('x', None, unreduced={'y'}) on (4, 2): device (i, j, k) holds rows 2i:2i+2 of
    # partial j; along z (neither named nor unreduced) the two devices are replicas.
    blocks = {(i, j, k): np.full((2, 2), 10 * i + j) for i in range(2) for j in range(2) for k in range(2)}
    arr = _array(XYZ, P("x", None, unreduced={"y"}), blocks, (4, 2))
    parts = U.partial_sums(arr.to_stacked(XYZ), XYZ, arr.sharding.spec)
    assert parts.shape == (1, 2, 1, 4, 2)
    np.testing.assert_array_equal(parts[0, 0, 0], [[0, 0], [0, 0], [10, 10], [10, 10]])
    np.testing.assert_array_equal(parts[0, 1, 0], [[1, 1], [1, 1], [11, 11], [11, 11]])
    np.testing.assert_array_equal(from_array(arr).total(), [[1, 1], [1, 1], [21, 21], [21, 21]])


def test_replicas_that_disagree_are_refused():
    blocks = {(i, j, k): np.full((2, 2), k) for i in range(2) for j in range(2) for k in range(2)}
    arr = _array(XYZ, P("x", None, unreduced={"y"}), blocks, (4, 2))
    with pytest.raises(ValueError, match=r"replicas .* hold different partial sums"):
        U.partial_sums(arr.to_stacked(XYZ), XYZ, arr.sharding.spec)


@pytest.mark.parametrize("src, want", [
    (None, [[0, 1, 2, 3], [0, 0, 0, 0]]),       # replicated: device 0 keeps it all
    (P("x"), [[0, 1, 0, 0], [0, 0, 2, 3]]),     # sharded: each keeps its own block
])
def test_decompose_keeps_what_each_device_holds(src, want):
    # JAX's test_identity_jit_out_unreduced states these shards
    np.testing.assert_array_equal(U.decompose(np.arange(4), src, X2, {"x"}), want)


def test_decompose_tuple_entry_over_three_axes():
    # P(('x','z'), 'y') -> unreduced {y, z}: row block b = 2x + z, column block y; device
    # (x, y, z) keeps rows of block 2x+z and columns of block y, zeros elsewhere
    v = np.arange(16).reshape(4, 4)
    parts = U.decompose(v, P(("x", "z"), "y"), XYZ, {"y", "z"})
    assert parts.shape == (1, 2, 2, 4, 4)
    for y in range(2):
        for z in range(2):
            want = np.zeros((4, 4), int)
            for x in range(2):
                r = 2 * x + z
                want[r, 2 * y:2 * y + 2] = v[r, 2 * y:2 * y + 2]
            np.testing.assert_array_equal(parts[0, y, z], want)
    np.testing.assert_array_equal(parts.sum(axis=(0, 1, 2)), v)


def test_device_put_onto_unreduced_sharding_and_back():
    src = refsim.device_put(np.arange(4.0), NamedSharding(X2, P("x")))
    arr = refsim.device_put(src, NamedSharding(X2, P(unreduced={"x"})))
    assert [s.data.tolist() for s in arr.shards] == [[0, 1, 0, 0], [0, 0, 2, 3]]
    rep = refsim.device_put(np.arange(4.0), NamedSharding(X2, P(unreduced={"x"})))
    assert [s.data.tolist() for s in rep.shards] == [[0, 1, 2, 3], [0, 0, 0, 0]]
    same = refsim.device_put(arr, NamedSharding(X2, P(unreduced={"x"})))
    assert [s.data.tolist() for s in same.shards] == [[0, 1, 0, 0], [0, 0, 2, 3]]
    with pytest.raises(ValueError, match="reduce it first"):
        refsim.device_put(arr, NamedSharding(XYZ, P(unreduced={"y"})))


def test_stacked_of_partials_inverts_partial_sums():
    v = np.arange(32.0).reshape(4, 8)
    parts = U.decompose(v, P("x", "y"), XYZ, {"y", "z"})
    spec = P("x", None, unreduced={"y", "z"})
    stacked = U.stacked_of_partials(parts, XYZ, spec)
    assert stacked.shape == (2, 2, 2, 2, 8)
    np.testing.assert_array_equal(U.partial_sums(stacked, XYZ, spec), parts)
