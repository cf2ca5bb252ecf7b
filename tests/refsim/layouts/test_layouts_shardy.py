"""Shardy text: hand-written expectations, then JAX's own printed attribute."""
import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType as JaxAxisType
from jax.sharding import Mesh as JaxMesh
from jax.sharding import NamedSharding as JaxNamedSharding
from jax.sharding import PartitionSpec as JaxP

from refsim import UNCONSTRAINED, AxisType, Mesh, NamedSharding, P
from refsim import compat as _compat
from refsim.layouts.shardy import mesh_op, mesh_to_shardy

MESH = Mesh((2, 4), ("x", "y"))


def test_closed_and_open_dims():
    assert NamedSharding(MESH, P("x")).to_shardy(2) == '#sdy.sharding<@mesh, [{"x"}, {}]>'
    assert NamedSharding(MESH, P(("y", "x"))).to_shardy() == '#sdy.sharding<@mesh, [{"y", "x"}]>'
    assert NamedSharding(MESH, P(None, UNCONSTRAINED)).to_shardy(3) == '#sdy.sharding<@mesh, [{}, {?}, {}]>'
    assert NamedSharding(MESH, P("x")).to_shardy(2, open_dims=True) == '#sdy.sharding<@mesh, [{"x", ?}, {?}]>'
    assert NamedSharding(MESH, P("x")).to_shardy(1, mesh_name="m2") == '#sdy.sharding<@m2, [{"x"}]>'


def test_unreduced_and_replicated_axes():
    m = Mesh((2, 2, 2), ("a", "b", "c"), axis_types=(AxisType.Explicit,) * 3)
    assert NamedSharding(m, P("b", unreduced={"c", "a"})).to_shardy(1) == \
        '#sdy.sharding<@mesh, [{"b"}], unreduced={"a", "c"}>'
    m = Mesh((2, 2, 2), ("a", "b", "c"), axis_types=(AxisType.Explicit, AxisType.Auto, AxisType.Manual))
    assert NamedSharding(m, P(None, "b")).to_shardy(2, modify_wrt_axis_types=True) == \
        '#sdy.sharding<@mesh, [{?}, {"b", ?}], replicated={"a"}>'


def test_mesh_text_with_permuted_ids():
    assert mesh_to_shardy(MESH) == '#sdy.mesh<["x"=2, "y"=4]>'
    m = Mesh((2, 4), ("x", "y"), device_ids=np.array([[3, 1, 0, 2], [7, 6, 5, 4]]))
    assert mesh_to_shardy(m) == '#sdy.mesh<["x"=2, "y"=4], device_ids=[3, 1, 0, 2, 7, 6, 5, 4]>'
    assert mesh_op(m, device_ids=False) == 'sdy.mesh @mesh = <["x"=2, "y"=4]>'
    assert NamedSharding(m, P("y")).to_shardy(1, mesh_name=None) == '#sdy.sharding<mesh<["x"=2, "y"=4]>, [{"y"}]>'


def test_lowered_module_uses_the_same_text():
    jm = JaxMesh(np.array(jax.devices()[:8])[::-1].reshape(2, 4), ("x", "y"))
    js = JaxNamedSharding(jm, JaxP("y", "x"))
    text = jax.jit(lambda a: a, in_shardings=js).lower(np.zeros((8, 8), np.float32)).as_text()
    s = NamedSharding(Mesh.from_jax(jm), P("y", "x"))
    assert f"sdy.sharding = {s.to_shardy(2)}" in text
    assert mesh_op(s.mesh, device_ids=False) in text


@settings(deadline=None, max_examples=40)
@given(st.data())
def test_matches_jax_attribute(data):
    n_axes = data.draw(st.integers(1, 3))
    sizes = data.draw(st.sampled_from([s for s in [(8,), (2, 4), (4, 2), (1, 8), (2, 2, 2), (2, 1, 4), (1, 2, 1)] if len(s) == n_axes]))
    names = ("x", "y", "z")[:n_axes]
    types = tuple(data.draw(st.sampled_from(["Auto", "Explicit", "Manual"])) for _ in names)
    ndim = data.draw(st.integers(0, 3))
    spec = [None] * ndim
    for a in data.draw(st.permutations(names)):
        d = data.draw(st.integers(-1, ndim - 1))
        if d >= 0:
            spec[d] = a if spec[d] is None else (spec[d] if isinstance(spec[d], tuple) else (spec[d],)) + (a,)
    if ndim and "Auto" in types and data.draw(st.booleans()):
        free = [d for d in range(ndim) if spec[d] is None]
        if free:
            spec[free[0]] = JaxP.UNCONSTRAINED
    used = {a for e in spec if isinstance(e, (str, tuple)) for a in ((e,) if isinstance(e, str) else e)}
    free_explicit = [n for n, t in zip(names, types) if t == "Explicit" and n not in used]
    unreduced = set(data.draw(st.lists(st.sampled_from(free_explicit), unique=True))) if free_explicit else set()
    modify = data.draw(st.booleans()) if _compat.sdy_marks_unused_explicit_axes() else False
    jm = JaxMesh(np.array(jax.devices()[: int(np.prod(sizes))]).reshape(sizes), names,
                 axis_types=tuple(getattr(JaxAxisType, t) for t in types))
    js = JaxNamedSharding(jm, JaxP(*spec, unreduced=unreduced))
    ours = NamedSharding(Mesh.from_jax(jm), P(*[UNCONSTRAINED if e is JaxP.UNCONSTRAINED else e for e in spec],
                                              unreduced=unreduced))
    assert ours.to_shardy(ndim, mesh_name=None, modify_wrt_axis_types=modify) == \
        _compat.jax_sdy_sharding_text(js, ndim, modify)
