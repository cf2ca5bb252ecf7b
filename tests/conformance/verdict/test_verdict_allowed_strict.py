"""`allowed.build` asks for the bounds without relaxations only where the verdict reads them: at
the elements held to the allowed set (`AllowedSet.governed`). Its verdicts equal those with the
strict bound computed for every output (the walk repeated with ``relaxations=()``)."""
import dataclasses

import jax
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

import refsim
import refsim.bounds as B
from conformance.verdict import allowed, compare

MESH5 = jax.make_mesh((5,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
XLA = np.float32(9) * (np.float32(1) / np.float32(5))     # XLA:CPU's pmean of 9 over 5: 1.8000001


def _pmean5_case():
    f = jax.jit(jax.shard_map(lambda v: lax.pmean(v, "i") * 2.0, mesh=MESH5, in_specs=P("i"), out_specs=P()))
    x = np.array([9, 0, 0, 0, 0], np.int32)
    closed = jax.make_jaxpr(f)(x)
    (ref,) = refsim.evaluate(closed, [x])
    return closed, [x], ref


class _Heuristic:
    """A stand-in heuristic policy allowing `diff` everywhere."""

    def __init__(self, diff):
        self.diff = diff

    def allowed(self, dtype):
        return self.diff

    def describe(self):
        return "heuristic"

    def why(self, exact=False):
        return "the heuristic"


def _xla_like(ref, value):
    return refsim.device_put(np.full(np.shape(np.asarray(ref)), value, np.float32), ref.sharding)


def _always_strict(closed, args, pols, ref):
    """The policies with the strict bound of every AllowedSet, as before the lazy repeat."""
    spec = B.evaluate(closed, args, relaxations=())
    out = []
    for p, s in zip(pols, spec.outputs):
        full = s.full_bound()
        out.append(dataclasses.replace(p, strict={int(sh.device_id): full[tuple(sh.index)] for sh in ref.shards}))
    return out


def test_an_element_held_to_the_allowed_set_gets_its_strict_bound_and_counts_as_relaxed_only():
    closed, args, ref = _pmean5_case()
    pols, notes, result = allowed.build(closed, args, [ref], [True], [_Heuristic(1e-3)])
    (p,) = pols
    assert "xla-reciprocal-division" in result.used and p.governed(0).all() and p.strict is not None
    xla = _xla_like(ref, XLA * 2)
    (v,) = allowed.verdicts(pols, [xla])
    assert v.relaxed_only == v.elements > 0 and v.outside == 0
    (w,) = allowed.verdicts(_always_strict(closed, args, pols, ref), [xla])
    assert dataclasses.asdict(v) == dataclasses.asdict(w)


def test_without_an_element_held_to_the_allowed_set_the_walk_is_not_repeated_and_the_verdict_is_the_same():
    closed, args, ref = _pmean5_case()
    pols, _, result = allowed.build(closed, args, [ref], [True], [_Heuristic(0.0)])   # the heuristic tighter
    (p,) = pols
    assert "xla-reciprocal-division" in result.used and not p.governed(0).any() and p.strict is None
    for value in (XLA * 2, np.float32(3.6), np.float32(3.7)):
        xla = _xla_like(ref, value)
        (v,) = allowed.verdicts(pols, [xla])
        (w,) = allowed.verdicts(_always_strict(closed, args, pols, ref), [xla])
        assert dataclasses.asdict(v) == dataclasses.asdict(w) and v.relaxed_only == 0
