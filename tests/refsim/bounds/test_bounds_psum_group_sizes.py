"""psum's group sizes (the collective of ones) are computed once per equation, mesh and shapes in
a walk: a psum in a scan's body, met at every step, gives the bounds the per-step computation gives."""
import jax
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

import refsim.bounds as B
from refsim.bounds.rules import collectives


def _program():
    mesh = jax.make_mesh((4,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))

    def body(v):
        def step(c, x):
            s = lax.psum(c * x + 0.1, "i")                # a bounded operand: the Higham path
            return c + s * 1e-3, s
        return lax.scan(step, v, v * 0.5 + 1.0)

    f = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=(P("i"), P("i")))
    x = np.linspace(0.1, 1.7, 12 * 2, dtype=np.float32).reshape(12, 2)
    return jax.make_jaxpr(f)(x), x


def _same(a, b):
    for p, q in zip(a.outputs, b.outputs):
        assert np.array_equal(p.center, q.center) and np.asarray(p.center).strides == np.asarray(q.center).strides
        assert np.array_equal(p.bound, q.bound, equal_nan=True)
        assert np.asarray(p.bound).strides == np.asarray(q.bound).strides


def test_cached_group_sizes_give_the_per_step_bounds(monkeypatch):
    closed, x = _program()
    cached = B.evaluate(closed, [x], relaxations=B.platform.RELAXATIONS)
    calls = []
    real = collectives._group_sizes

    def each_time(bctx, eqn, run, ins):
        calls.append(eqn)
        return run([np.ones(np.shape(v.center)) for v in ins])

    monkeypatch.setattr(collectives, "_group_sizes", each_time)
    fresh = B.evaluate(closed, [x], relaxations=B.platform.RELAXATIONS)
    assert len(calls) >= 2 and all(e is calls[0] for e in calls)     # one psum, met at every step
    _same(cached, fresh)
    assert real is not each_time
