"""The bound walk's shortcuts give what the long way gives: `finish` is not run again on data
movement (it would change nothing), `values.replaced` is `dataclasses.replace`, `dtype_of` and
equation labels are computed once."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import refsim.bounds as B
from refsim.bounds import walk
from refsim.bounds import values as V
from refsim.bounds.registry import BCtx

F32 = np.float32
TINY = float(np.finfo(F32).tiny)
BIG = float(np.finfo(F32).max)
RELAX = frozenset(B.platform.RELAXATIONS)


def _edge_values(shape, rng):
    """Centers and bounds that reach every branch of `finish`: subnormal, near overflow, infinite,
    NaN, exact and undecidable."""
    c = rng.standard_normal(shape) * 10.0 ** rng.integers(-40, 39, shape)
    c.flat[:6] = [TINY / 3, -TINY / 7, BIG * 0.9999999, np.inf, np.nan, 0.0]
    b = np.abs(rng.standard_normal(shape)) * 1e-6 * np.abs(c)
    b.flat[:6] = [0.0, TINY, BIG * 1e-6, 0.0, np.nan, 0.0]
    b.flat[6] = np.nan
    return c, b


MOVES = [
    ("transpose", lambda x: x.T),
    ("reshape", lambda x: x.reshape(-1)),
    ("slice", lambda x: x[1:, ::2]),
    ("rev", lambda x: x[::-1]),
    ("concatenate", lambda x: jnp.concatenate([x, x[:1]])),
    ("pad", lambda x: lax.pad(x, F32(0), [(1, 2, 1), (0, 1, 0)])),
    ("gather", lambda x: x[jnp.array([3, 0, 0, 2])]),
    ("broadcast_in_dim", lambda x: jnp.broadcast_to(x, (2,) + x.shape)),
    ("dynamic_update_slice", lambda x: lax.dynamic_update_slice(x, x[2:, 4:], (1, 1))),
]


@pytest.mark.parametrize("name,fn", MOVES, ids=[m[0] for m in MOVES])
@pytest.mark.parametrize("relaxations", [frozenset(), RELAX], ids=["spec", "relaxed"])
def test_finish_gives_a_moved_result_back_unchanged(name, fn, relaxations):
    B.load_rules()
    rng = np.random.default_rng(len(name))
    x = np.zeros((4, 6), F32)
    closed = jax.make_jaxpr(fn)(x)
    bctx = BCtx(relaxations=relaxations)
    c, b = _edge_values(x.shape, rng)
    v = walk.finish(bctx, None, V.BVal(c, b, np.dtype(F32)))       # a finished operand, as the walk has them
    env = {closed.jaxpr.invars[0]: v}
    for var, const in zip(closed.jaxpr.constvars, closed.consts):
        env[var] = walk.from_value(np.asarray(const), walk.dtype_of(var), bctx)
    for eqn in closed.jaxpr.eqns:
        ins = [walk._literal(a, bctx) if isinstance(a, walk.Literal) else env[a] for a in eqn.invars]
        outs = walk.apply(bctx, eqn, ins)
        for var, o in zip(eqn.outvars, outs):
            env[var] = o
        if walk.BOUND_RULES[eqn.primitive.name].moves:
            for o in outs:
                again = walk.finish(bctx, eqn, o)
                assert np.array_equal(again.center, o.center, equal_nan=True)
                assert np.array_equal(again.full_bound(), o.full_bound(), equal_nan=True)
                assert (again.bound is None) == (o.bound is None)
    assert not bctx.used or set(bctx.used) == {"xla-cpu-ftz"}


def test_replaced_is_dataclasses_replace():
    v = V.BVal(np.arange(3.0), np.ones(3), np.dtype(F32), True, None, "constant")
    a, b = V.replaced(v, bound=None, center=np.zeros(3)), dataclasses.replace(v, bound=None, center=np.zeros(3))
    assert {f.name for f in dataclasses.fields(V.BVal)} <= set(vars(a))
    for f in dataclasses.fields(V.BVal):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert (np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y), f.name
    assert a is not v and v.bound is not None


def test_dtype_of_and_labels_are_the_long_way_s():
    closed = jax.make_jaxpr(lambda x, k: (x.astype(jnp.bfloat16) * 2, jax.random.split(k)))(
        np.ones(3, F32), jax.random.key(0))
    from refsim import compat

    for eqn in closed.jaxpr.eqns:
        for var in [*eqn.invars, *eqn.outvars]:
            aval = var.aval
            want = np.dtype(compat.physical_dtype(aval.dtype)) if getattr(aval, "shape", None) is not None else None
            assert walk.dtype_of(var) == want and walk.dtype_of(var) == want
    bctx = BCtx()
    eqn = closed.jaxpr.eqns[0]
    first = bctx.label(eqn)
    assert first.startswith(eqn.primitive.name) and bctx.label(eqn) is first
    assert bctx.label(closed.jaxpr.eqns[1]) != first or closed.jaxpr.eqns[1].primitive == eqn.primitive
