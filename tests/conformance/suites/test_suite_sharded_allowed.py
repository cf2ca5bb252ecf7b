"""The sharded suite holds a program's inexact outputs to the tighter of the value model and the
allowed set (`conformance.strategies._sharded_allowed`, issue 39 point 4). Expected values by
hand: a planted error of a few units of roundoff passes the value model's bound and fails the
allowed set's."""
from __future__ import annotations

import numpy as np

import refsim
from conformance.strategies.sharded import ErrorBound, ShardedProgram
from conformance.verdict import allowed, compare
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec as P

SOURCE = "def f(a, b):\n    return a * b + 1.0, a + 0.0\n"


def _case(a, b, err=1e-3):
    mesh = Mesh((2, 4), ("x", "y"))
    sh = NamedSharding(mesh, P("x", None))
    return ShardedProgram(family="sharded", source=SOURCE, entry="jit", mesh=mesh, args=(a, b),
                          in_shardings=(sh, sh), out_shardings=(sh, sh), outputs=("exact", "exact"),
                          policies=(("abs", err), ("exact", 0)))


def test_an_inexact_output_is_held_to_the_allowed_set_where_it_is_tighter():
    a = np.linspace(0.5, 2.0, 16, dtype=np.float32).reshape(4, 4)
    b = np.full((4, 4), 3.1, np.float32)
    case = _case(a, b)
    want = case.run(refsim)
    pols = case.tolerances()
    assert isinstance(pols[0], allowed.AllowedSet) and pols[0].judge_undecidable
    assert type(pols[1]) is compare.Exact                       # an exact output stays bit for bit
    # a * b + 1 on these values: every element is held to its allowed set (a few 1e-7, by the two
    # roundings of a float32 multiply and add), not to the value model's 2e-3
    assert all(pols[0].governed(d).all() for d in pols[0].abs_sum)
    assert pols[0].allowed(np.float32) < 1e-5
    # 8 units of roundoff of each element planted in the product: within the value model's bound,
    # outside the allowed set
    bumped = refsim.make_array_from_single_device_arrays(
        (4, 4), want[0].sharding, {s.device_id: np.asarray(s.data) * np.float32(1 + 8 * 2.0 ** -24)
                                    for s in want[0].shards})
    assert compare.compare([want[0]], [bumped], tolerances=[ErrorBound.around(want[0], 2e-3)]).ok
    assert not compare.compare([want[0]], [bumped], tolerances=[pols[0]]).ok
    assert compare.compare([want[0]], [want[0]], tolerances=[pols[0]]).ok


def test_undecidable_elements_stay_held_to_the_value_model():
    pol = allowed.AllowedSet(n=1, exact={0: np.array([1.0, 2.0])}, abs_sum={0: np.array([1e-7, np.nan])},
                             fallback_ref={0: np.array([1.0, 2.0], np.float32)}, fallback_allowed=1e-3,
                             judge_undecidable=True)
    ref, bound = pol.reference_and_bound(0, np.float32)
    assert ref.tolist() == [1.0, 2.0] and bound[1] == 1e-3          # not infinite: the value model judges
    assert not any(m.any() for m in pol.allowed_nonfinite(0, np.float32))


# The walk bounds the program XLA runs: traced with the arguments placed by their in_shardings (on an
# Explicit mesh their avals carry the sharding type), as xla_backend.jit traces it. Traced with bare
# NumPy arguments, the pullback below accumulated a1's three cotangents in another order, (a1 + relu)
# + t instead of (t + a1) + relu, and its bound missed a rounding: XLA and refsim alike gave
# 14.995979309 for the exact 14.99597997 (0.69 ulp), outside the 4.9e-7 the walk allowed (hunt on jax
# 0.12, scan_layers class, 2026-12-06; a false alarm, "refsim result outside allowed set").
SCAN_SOURCE = """def g(a0, a1):
    v1 = a1 - 0.5
    v2 = a0
    v3 = jax.nn.relu(a1)
    v4 = jax.sharding.reshard(a1, P())
    v5 = jnp.ceil(v2)
    v6 = v1
    v7 = jax.nn.softmax(v6, axis=0)
    return (v3, v4, v5, v7)


def model(a0, a1):
    def layer(c, xs):
        o = g(c, *xs)
        return jax.sharding.reshard(jnp.clip(jnp.round(o[2] * 4.0) / 4.0, -16.0, 16.0), P(('x', 'z'), 'w')), o
    c, ys = jax.lax.scan(layer, a0, (a1,))
    return (c,) + tuple(ys)


def f(a0, a1):
    def h(a0, a1):
        o = model(a0, a1)
        return (o[0], o[1], o[2], o[3], o[4],)
    outs, pull = jax.vjp(h, a0, a1)
    return outs + pull(outs)
"""


def test_the_walk_traces_the_program_with_its_arguments_placed():
    import xla_backend
    from conformance.strategies import _sharded_allowed

    mesh = Mesh((1, 1, 1, 1), ("x", "y", "z", "w"), axis_types=(refsim.AxisType.Explicit,) * 4)
    rep = NamedSharding(mesh, P())
    a0 = np.full((1, 1, 1), 2.0, np.float32)
    a1 = np.array([3.0, 7.5, 13.0], np.float32).reshape(1, 3, 1, 1)
    case = ShardedProgram(family="sharded", source=SCAN_SOURCE, entry="jit", mesh=mesh, args=(a0, a1),
                          in_shardings=(NamedSharding(mesh, P(("x", "z"), "w", None)), rep),
                          out_shardings=(rep,) * 7, outputs=("exact",) * 7,
                          policies=(("exact", 0),) * 6 + (("rel", 2.0 ** -10),))
    closed = _sharded_allowed._closed(case)
    assert tuple(closed.jaxpr.invars[0].aval.sharding.spec) == (("x", "z"), "w", None)   # a0's sharding type
    got = case.run(xla_backend)
    pols = case.tolerances()
    assert isinstance(pols[6], allowed.AllowedSet)
    assert np.asarray(got[6])[0, 1, 0, 0] == np.float32(14.995979309082031)   # two roundings, as traced
    assert compare.compare([case.run(refsim)[6]], [got[6]], tolerances=[pols[6]]).ok


def test_a_jit_chain_is_walked_as_the_composition_of_its_calls():
    """A ``jit_chain_orders`` program (one step jitted on several meshes, its carry moved between
    them) gets the allowed set of its chained calls: the walk's centers are refsim's values within
    their bounds, XLA agrees, and an element moved twice its bound away is caught."""
    import xla_backend
    from conformance.strategies import _sharded_allowed
    from conformance.strategies.sharded import sharded_programs
    from conformance.suites.base import draw

    cases = draw(sharded_programs(max_devices=8, classes=("jit_chain_orders",), dtypes=("float32",)), 60, 2)
    case = next(c for c in cases if any(k != "exact" for k, _ in c.policies) and c.dtype == "float32")
    closed = _sharded_allowed._chain_closed(case)
    assert len(closed.jaxpr.outvars) == len(case.policies)
    want = case.run(refsim)
    got = case.run(xla_backend)
    pols = case.tolerances()
    held = [k for k, p in enumerate(pols) if isinstance(p, allowed.AllowedSet)]
    assert held == [k for k, (kind, _) in enumerate(case.policies) if kind != "exact"]
    assert compare.compare(want, got, tolerances=pols).ok
    k = held[0]
    p = pols[k]
    d = next(d for d in p.abs_sum if p.governed(d).any())
    # refsim's own value lies within the bound of the walk's center, element by element
    ref, bound = p.reference_and_bound(d, np.float32)
    sh = {int(s.device_id): s for s in want[k].shards}[d]
    assert (np.abs(np.asarray(sh.data, np.float64) - ref) <= bound).all()
    # moved twice its bound away, one governed element is outside
    i = np.unravel_index(int(np.argmax(p.governed(d))), np.shape(ref))
    moved = {int(s.device_id): np.array(s.data) for s in want[k].shards}
    moved[d][i] = np.float32(ref[i] + 2 * bound[i] + np.spacing(np.float32(abs(ref[i]) + 2 * bound[i])))
    bad = refsim.make_array_from_single_device_arrays(want[k].shape, want[k].sharding, moved)
    assert not compare.compare([want[k]], [bad], tolerances=[p]).ok
