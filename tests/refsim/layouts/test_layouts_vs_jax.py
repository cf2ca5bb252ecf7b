"""refsim's layout engine against JAX itself on the 8 virtual CPU devices.

Each case draws a mesh shape (1-3 axes, size-1 axes included, product dividing
8), a device permutation, a spec (None, single axes, tuples in and out of mesh
order) and a shape divisible as the spec requires, then checks placement, HLO
text, shard shapes and the data `jax.device_put` puts on every device.
"""
import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType as JaxAxisType
from jax.sharding import Mesh as JaxMesh
from jax.sharding import NamedSharding as JaxNamedSharding
from jax.sharding import PartitionSpec as JaxP

import refsim
from refsim import compat as _compat
from refsim.layouts.hlo_sharding import HloSharding, hlo_to_named

NAMES = ("x", "y", "z")


@st.composite
def layout_cases(draw, axis_types=("Auto",)):
    n_axes = draw(st.integers(1, 3))
    sizes, budget = [], 8
    for _ in range(n_axes):
        size = draw(st.sampled_from([s for s in (1, 2, 4, 8) if budget % s == 0]))
        sizes.append(size)
        budget //= size
    names = NAMES[:n_axes]
    perm = draw(st.permutations(range(8)))
    ids = np.array(perm[: int(np.prod(sizes))]).reshape(sizes)
    types = tuple(draw(st.sampled_from(axis_types)) for _ in names)
    ndim = draw(st.integers(0, 3))
    order = draw(st.permutations(names))  # tuples come out in and out of mesh order
    entries = [[] for _ in range(ndim)]
    for a in order:
        target = draw(st.integers(-1, ndim - 1))
        if target >= 0:
            entries[target].append(a)
    spec = [None if not e else e[0] if len(e) == 1 and draw(st.booleans()) else tuple(e) for e in entries]
    last_used = max([d for d, e in enumerate(entries) if e], default=-1)
    spec = spec[: draw(st.integers(last_used + 1, ndim))]
    mesh_size = dict(zip(names, sizes))
    shape = tuple(
        int(np.prod([mesh_size[a] for a in entries[d]], dtype=int)) * draw(st.integers(1, 3)) for d in range(ndim)
    )
    return sizes, names, ids, types, spec, shape


def _jax_mesh(sizes, names, ids, types):
    devices = np.array(jax.devices(), dtype=object)[ids.ravel()].reshape(sizes)
    return JaxMesh(devices, names, axis_types=tuple(getattr(JaxAxisType, t) for t in types))


def _norm(index_map):
    return {k: tuple((s.start, s.stop, s.step) for s in v) for k, v in index_map.items()}


@settings(max_examples=200, deadline=None)
@given(layout_cases())
def test_named_sharding_matches_jax(case):
    sizes, names, ids, types, spec, shape = case
    jmesh = _jax_mesh(sizes, names, ids, types)
    js = JaxNamedSharding(jmesh, JaxP(*spec))
    mesh = refsim.Mesh.from_jax(jmesh)
    np.testing.assert_array_equal(mesh.device_ids, ids)
    s = refsim.NamedSharding(mesh, refsim.P(*spec))
    ndim = len(shape)
    where = f"mesh={dict(zip(names, sizes))} ids={ids.ravel().tolist()} spec={spec} shape={shape}"

    jax_map = _norm({d.id: idx for d, idx in js.devices_indices_map(shape).items()})
    ours = s.devices_indices_map(shape)
    assert _norm(ours) == jax_map, where
    assert s.shard_shape(shape) == js.shard_shape(shape), where
    assert s.is_fully_replicated == js.is_fully_replicated, where

    jax_text = _compat.jax_hlo_sharding_text(js, ndim)
    assert str(s.to_hlo(ndim)) == jax_text, where
    parsed = HloSharding.parse(jax_text)
    assert _norm(parsed.devices_indices_map(shape, mesh.device_ids.ravel())) == jax_map, where
    assert hlo_to_named(parsed, mesh).to_hlo(ndim) == parsed, where

    x = np.arange(int(np.prod(shape, dtype=int)), dtype=np.int32).reshape(shape)
    placed = jax.device_put(x, js)
    jax_blocks = {sh.device.id: np.asarray(sh.data) for sh in placed.addressable_shards}
    assert sorted(jax_blocks) == sorted(ours), where
    for dev, idx in ours.items():
        np.testing.assert_array_equal(jax_blocks[dev], x[idx], err_msg=f"device {dev}; {where}")
    arr = refsim.device_put(x, s)
    for shard in arr.shards:
        np.testing.assert_array_equal(shard.data, jax_blocks[shard.device_id], err_msg=f"device {shard.device_id}; {where}")


@settings(deadline=None)
@given(layout_cases(axis_types=("Auto", "Explicit", "Manual")), st.data())
def test_hlo_text_matches_jax_with_axis_types(case, data):
    """Manual axes become `manual` subgroups, unreduced Explicit axes `unreduced` ones."""
    sizes, names, ids, types, spec, shape = case
    used = {a for e in spec if e is not None for a in ((e,) if isinstance(e, str) else e)}
    if any(types[names.index(a)] == "Manual" for a in used):
        spec = [None] * len(spec)  # JAX cannot lower a Manual axis sharding a dimension
        used = set()
    free_explicit = [n for n, t in zip(names, types) if t == "Explicit" and n not in used]
    unreduced = set(data.draw(st.lists(st.sampled_from(free_explicit), unique=True))) if free_explicit else set()
    jmesh = _jax_mesh(sizes, names, ids, types)
    js = JaxNamedSharding(jmesh, JaxP(*spec, unreduced=unreduced))
    mesh = refsim.Mesh.from_jax(jmesh)
    s = refsim.NamedSharding(mesh, refsim.P(*spec, unreduced=unreduced))
    ndim = len(shape)
    jax_text = _compat.jax_hlo_sharding_text(js, ndim)
    assert str(s.to_hlo(ndim)) == jax_text, (types, spec, unreduced)
    assert hlo_to_named(HloSharding.parse(jax_text), mesh).to_hlo(ndim) == HloSharding.parse(jax_text)


def test_hlo_text_of_a_replicated_array_unreduced_over_every_device():
    """The draw the version matrix met on jax 0.9.2 (2026-12-06): a rank-1 array whose dimension is
    replicated, unreduced over the only axis of size > 1; jax 0.9 prints it as a tiling with a leading
    1 (`{devices=[1,8]<=[8] last_tile_dims={unreduced}}`), 0.10 on as `{unreduced}`: refsim.compat
    gives the latter for both, and refsim prints the same."""
    sizes, names = (8, 1, 1), ("x", "y", "z")
    types = ("Explicit", "Auto", "Manual")
    ids = np.arange(8).reshape(sizes)
    jmesh = _jax_mesh(sizes, names, ids, types)
    mesh = refsim.Mesh.from_jax(jmesh)
    for ndim in (0, 1, 2):
        spec = [None] * ndim
        jax_text = _compat.jax_hlo_sharding_text(JaxNamedSharding(jmesh, JaxP(*spec, unreduced={"x"})), ndim)
        assert jax_text == "{unreduced}"
        assert str(refsim.NamedSharding(mesh, refsim.P(*spec, unreduced={"x"})).to_hlo(ndim)) == jax_text

def test_hlo_text_on_a_one_device_manual_mesh():
    """The version matrix's draw on jax 0.9.2 (2026-12-06): a one-device mesh whose axis is Manual; jax
    0.9 prints `{manual}`, 0.10 on `{replicated}` (on two devices all print `{manual}`); refsim.compat
    gives 0.10's text for every version, and refsim prints it."""
    for n, want in ((1, "{replicated}"), (2, "{manual}")):
        jmesh = _jax_mesh([n], ("x",), np.arange(n), ("Manual",))
        mesh = refsim.Mesh.from_jax(jmesh)
        for ndim in (0, 1):
            spec = [None] * ndim
            assert _compat.jax_hlo_sharding_text(JaxNamedSharding(jmesh, JaxP(*spec)), ndim) == want
            assert str(refsim.NamedSharding(mesh, refsim.P(*spec)).to_hlo(ndim)) == want

def test_manual_axis_sharding_a_dim_is_a_valueerror():
    mesh = refsim.Mesh((2, 4), ("x", "y"), axis_types=(refsim.AxisType.Manual, refsim.AxisType.Auto))
    with pytest.raises(ValueError, match="shards a dimension over Manual mesh axis 'x'"):
        refsim.NamedSharding(mesh, refsim.P("x")).to_hlo(1)
