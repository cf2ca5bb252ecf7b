"""One walk carrying both bounds (`refsim.bounds.evaluate(..., strict=True)`): its outputs equal a
walk with the platform's relaxations and its strict outputs equal a second walk without them, bit
for bit, on programs where a relaxation applies (XLA:CPU's pmean over 5 devices as a multiply,
flush to zero, fused multiply-add) and through every structural rule (shard_map, scan, while and
cond, including a predicate that only the walk without relaxations decides)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, PartitionSpec as P

import refsim.bounds as B
from refsim.bounds import platform as PL
from refsim.bounds.registry import BCtx

RELAX = PL.default_relaxations("cpu")
F32 = np.float32


def _same(a, b, what):
    assert type(a) is type(b), what
    if not isinstance(a, B.BVal):
        assert a == b, what
        return
    assert a.dtype == b.dtype and a.nonneg == b.nonneg, what
    assert np.array_equal(np.asarray(a.center), np.asarray(b.center), equal_nan=True), what
    assert (a.bound is None) == (b.bound is None), what
    assert np.array_equal(a.full_bound(), b.full_bound(), equal_nan=True), what


def both_ways(fn, *args):
    """The dual walk of `fn` on `args`, checked against the two separate walks; returns it."""
    closed = jax.make_jaxpr(fn)(*args)
    relaxed = B.evaluate(closed, list(args), relaxations=RELAX)
    spec = B.evaluate(closed, list(args), relaxations=())
    dual = B.evaluate(closed, list(args), relaxations=RELAX, strict=True)
    assert dual.used == relaxed.used
    for k, (a, b) in enumerate(zip(dual.outputs, relaxed.outputs)):
        _same(a, b, f"output {k} with relaxations")
    for k, (a, b) in enumerate(zip(dual.strict_outputs, spec.outputs)):
        _same(a, b, f"output {k} without relaxations")
    assert all(getattr(o, "strict", None) is None for o in dual.outputs)
    return dual, relaxed, spec


def _bound(x):
    return np.asarray(x.full_bound())


def test_pmean_of_int32_over_five_devices_is_widened_only_with_the_relaxation():
    mesh = jax.make_mesh((5,), ("i",), axis_types=(AxisType.Auto,))
    f = jax.shard_map(lambda v: lax.pmean(v, "i") * 3.0 + 1.0, mesh=mesh, in_specs=P("i"), out_specs=P())
    dual, _, _ = both_ways(f, np.array([9, 0, 0, 0, 0], np.int32))
    assert "xla-reciprocal-division" in dual.used
    assert (_bound(dual.outputs[0]) > 0).all()
    assert (_bound(dual.strict_outputs[0]) < _bound(dual.outputs[0])).all()


def test_without_any_relaxation_applying_the_strict_outputs_are_the_outputs_themselves():
    x = np.linspace(-2, 2, 12, dtype=F32).reshape(3, 4)
    dual, _, _ = both_ways(lambda x: jnp.tanh(x) * 2.0 + jnp.sum(x, axis=0), x)
    assert not dual.used
    assert dual.strict_outputs[0] is dual.outputs[0]
    assert dual.strict_result().outputs == dual.strict_outputs


def test_a_training_step_whose_mean_divides_by_a_constant():
    rng = np.random.default_rng(0)
    w, x, y = (rng.standard_normal(s).astype(F32) for s in ((6, 5), (7, 6), (7, 5)))

    def step(w, x, y):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((jnp.tanh(x @ w) - y) ** 2))(w)
        return loss, w - 0.1 * g

    dual, _, _ = both_ways(step, w, x, y)
    assert "xla-reciprocal-division" in dual.used


def test_subnormal_inputs_under_flush_to_zero_through_a_shard_map():
    mesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Auto,))
    tiny = float(np.finfo(F32).tiny)
    a = np.array([tiny / 8, 1.0, -tiny / 4, 3.0], F32)
    f = jax.shard_map(lambda v: lax.psum(v * 3.0, "x") + v, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    dual, _, spec = both_ways(f, a)
    assert "xla-cpu-ftz" in dual.used and not spec.used


def test_a_scan_carrying_a_relaxed_value_and_stacking_it():
    xs = np.arange(1, 6, dtype=F32)
    dual, _, _ = both_ways(lambda xs: lax.scan(lambda c, x: (c + x / 3.0, c * 2.0), F32(0), xs), xs)
    assert "xla-reciprocal-division" in dual.used


def test_a_loop_whose_predicate_only_the_walk_without_relaxations_decides():
    # 9 / 5 is 1.8 in float32 exactly as the literal: decided without the relaxation, not with it
    def f(x):
        return lax.while_loop(lambda c: c / 5.0 < F32(1.8), lambda c: c + 1.0, x)

    dual, relaxed, spec = both_ways(f, F32(9))
    assert np.isnan(_bound(relaxed.outputs[0])).all() and not np.isnan(_bound(spec.outputs[0])).any()


def test_a_loop_with_a_relaxed_carry_and_a_decided_counter():
    dual, _, _ = both_ways(lambda x: lax.fori_loop(0, 3, lambda i, c: c / 3.0 + 1.0, x), np.arange(4, dtype=F32))
    assert (_bound(dual.outputs[0]) > _bound(dual.strict_outputs[0])).all()


@pytest.mark.parametrize("x", [F32(9), F32(10)])
def test_a_branch_whose_index_only_the_walk_without_relaxations_decides(x):
    def f(x):
        return lax.cond(x / 5.0 < F32(1.8), lambda v: v * 2.0, lambda v: v / 3.0, x)

    both_ways(f, x)


def test_the_strict_context_records_nothing():
    bctx = BCtx(relaxations=RELAX, dual=True)
    s = bctx.strict()
    assert not s.relaxations and not s.dual and s.touched is not bctx.touched
    s.note("xla-cpu-ftz", None)
    assert not bctx.used and bctx.touched == [0]
    bctx.widened()
    assert bctx.touched == [1] and not bctx.used
