"""Manual-region layout moves (split by in_specs, tile by out_specs) against a naive per-device oracle."""
from __future__ import annotations

import numpy as np
import pytest

from refsim import Mesh, NamedSharding, P
from refsim.interpreter.rules.sharding import first_replica_mismatch, split_by_spec, tile_by_spec

CASES = [
    ((2, 4), ("x", "y"), P("x", "y"), (4, 8)),
    ((2, 4), ("x", "y"), P("y", "x"), (8, 4)),
    ((2, 4), ("x", "y"), P(("x", "y")), (16, 3)),
    ((2, 4), ("x", "y"), P(("y", "x"), None), (8, 2)),
    ((2, 4), ("x", "y"), P(None, "y"), (3, 8)),
    ((2, 2, 2), ("a", "b", "c"), P("c", None, ("a", "b")), (4, 3, 8)),
    ((8,), ("i",), P(), (5,)),
]


def naive_blocks(x, mesh, spec):
    """Each device's block, read off NamedSharding.devices_indices_map (JAX's placement)."""
    idx = NamedSharding(mesh, spec).devices_indices_map(x.shape)
    return {d: x[i] for d, i in idx.items()}


@pytest.mark.parametrize("shape,names,spec,gshape", CASES)
def test_split_matches_named_sharding_placement(shape, names, spec, gshape):
    mesh = Mesh(shape, names)
    x = np.arange(np.prod(gshape)).reshape(gshape)
    stacked = split_by_spec(x.reshape((1,) * mesh.ndim + gshape), mesh, spec)
    expect = naive_blocks(x, mesh, spec)
    for pos in np.ndindex(*shape):
        blk = stacked[tuple(p if stacked.shape[k] > 1 else 0 for k, p in enumerate(pos))]
        np.testing.assert_array_equal(blk, expect[int(mesh.device_ids[pos])], err_msg=f"position {pos}")


@pytest.mark.parametrize("shape,names,spec,gshape", CASES)
def test_tile_inverts_split(shape, names, spec, gshape):
    mesh = Mesh(shape, names)
    x = np.arange(np.prod(gshape)).reshape(gshape)
    stacked = split_by_spec(x.reshape((1,) * mesh.ndim + gshape), mesh, spec)
    back = tile_by_spec(stacked, mesh, spec)
    np.testing.assert_array_equal(back.reshape(gshape), x)


def test_tile_broadcasts_invariant_blocks():
    # A block invariant over 'y' (size-1 mesh dim) tiled by P(None, 'y') repeats 4 times, as
    # shard_map concatenates the (equal) blocks of the 4 devices along y.
    mesh = Mesh((2, 4), ("x", "y"))
    blk = np.array([[[[1, 2]]], [[[3, 4]]]])  # shape (2, 1, 1, 2): x-varying, y-invariant
    out = tile_by_spec(blk, mesh, P(None, "y"))
    assert out.shape == (2, 1, 1, 8)
    np.testing.assert_array_equal(out[0, 0, 0], [1, 2] * 4)
    np.testing.assert_array_equal(out[1, 0, 0], [3, 4] * 4)


def test_split_rejects_axis_already_split():
    mesh = Mesh((2, 4), ("x", "y"))
    with pytest.raises(ValueError, match="already split over 'x'"):
        split_by_spec(np.zeros((2, 1, 4)), mesh, P("x"))


def test_first_replica_mismatch_names_positions_and_index():
    y = np.zeros((2, 4, 3))
    y[1, 2, 1] = 5.0
    assert first_replica_mismatch(y, 2, [0]) == ((0, 2), (1, 2), (1,))
    assert first_replica_mismatch(y, 2, [1]) == ((1, 0), (1, 2), (1,))
    nan = np.full((2, 1, 2), np.nan)
    assert first_replica_mismatch(nan, 2, [0]) is None  # NaN replicas agree bitwise
