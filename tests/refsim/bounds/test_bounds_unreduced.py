"""The bound walk on unreduced values: ``reduce_sum(..., out_sharding=P(unreduced=...))`` leaves each
device a partial sum; ``u1 + u2`` (``u1 - u2`` on jax 0.12) adds the devices' partial values, and the
reshard to a reduced type adds the devices' results. The value is one sum of both operands' terms in
an order of additions no rule fixes, so its allowed set is Higham's bound for all of them."""
import itertools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import refsim.bounds as B
from refsim import compat

pytestmark = pytest.mark.skipif(not compat.supports_unreduced_specs(), reason="this JAX has no P(unreduced=...)")

U32 = 2.0 ** -24


def _program(n_dev, rows, cols, sub):
    mesh = jax.make_mesh((n_dev,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))

    def f(v, w):
        v = jax.sharding.reshard(v, P("x"))
        w = jax.sharding.reshard(w, P("x"))
        a = jax.lax.reduce_sum(v, (0,), out_sharding=P(unreduced={"x"}))
        b = jax.lax.reduce_sum(w, (0,), out_sharding=P(unreduced={"x"}))
        return jax.sharding.reshard(a - b if sub else a + b, P())

    spec = jax.ShapeDtypeStruct((rows, cols), np.float32)
    with jax.set_mesh(mesh):
        return jax.make_jaxpr(f)(spec, spec)


def _sub():
    return compat.unreduced_subtracts()     # jax < 0.12 has no unreduced rule for sub


def _growth(k, u):
    """(1 + u)**k - 1, exactly (fractions), as a float: the relative error of k roundings."""
    from fractions import Fraction

    return float((1 + Fraction(u)) ** k - 1)


def test_the_bound_covers_one_sum_of_both_operands_terms():
    # 3 devices, one row each: the result is a sum of 6 exact terms, 5 additions in some order
    v = np.array([[1.0, 3.0], [2.0 ** -20, -5.0], [-1.0, 7.0]], np.float32)
    w = np.array([[0.5, 3.0], [1.0, -5.0], [0.25, 7.0]], np.float32)
    sub = _sub()
    out = B.evaluate(_program(3, 3, 2, sub), [v, w]).outputs[0]
    exact = v.astype(np.float64).sum(0) + (-1 if sub else 1) * w.astype(np.float64).sum(0)
    np.testing.assert_allclose(out.center, exact, rtol=0, atol=1e-15)
    mags = np.abs(v.astype(np.float64)).sum(0) + np.abs(w.astype(np.float64)).sum(0)
    # Higham: |error| <= ((1 + u)**5 - 1) * sum |terms| for any order of 5 float32 additions
    assert np.all(out.bound >= _growth(5, U32) * mags), (out.bound, _growth(5, U32) * mags)
    # and not far more than that (the float64 center's own rounding and the subnormal terms)
    assert np.all(out.bound <= _growth(5, U32) * mags * (1 + 1e-6) + 1e-30)


def _device_orders(v, w, n_dev, sub):
    """Every result XLA may give: per device the partial sums (rows in order and reversed), the
    devices' partial results added or subtracted, the devices' results added in every order;
    float32 throughout."""
    out = []
    for rev in (False, True):
        parts = []
        for vd, wd in zip(np.split(v, n_dev), np.split(w, n_dev)):
            rows_v, rows_w = (vd[::-1], wd[::-1]) if rev else (vd, wd)
            pa = np.float32(0) * rows_v[0]
            pb = np.float32(0) * rows_w[0]
            for r in rows_v:
                pa = (pa + r).astype(np.float32)
            for r in rows_w:
                pb = (pb + r).astype(np.float32)
            parts.append((pa - pb if sub else pa + pb).astype(np.float32))
        for order in itertools.permutations(range(n_dev)):
            acc = parts[order[0]]
            for d in order[1:]:
                acc = (acc + parts[d]).astype(np.float32)
            out.append(acc)
    return out


@settings(max_examples=60, deadline=None, database=None)
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from([1, 2]), st.sampled_from([-3, 0, 20]))
def test_every_order_of_the_devices_additions_is_allowed(seed, rows_per_device, scale):
    n_dev, cols = 3, 4
    rng = np.random.default_rng(seed)
    rows = n_dev * rows_per_device
    # magnitudes spread over many binades and near-cancelling operands: the partial results round
    v = (rng.standard_normal((rows, cols)) * 2.0 ** rng.integers(-8, 8, (rows, cols)) * 2.0 ** scale).astype(np.float32)
    w = (v.astype(np.float64) * (1 + rng.standard_normal((rows, cols)) * 1e-3)).astype(np.float32)
    sub = _sub()
    if not sub:
        w = -w
    out = B.evaluate(_program(n_dev, rows, cols, sub), [v, w]).outputs[0]
    for got in _device_orders(v, w, n_dev, sub):
        err = np.abs(got.astype(np.float64) - out.center)
        assert np.all(err <= out.bound), (got, out.center, out.bound)


def test_an_unreduced_operand_of_unknown_terms_is_undecidable():
    # the walk knows the terms of an unreduced reduce_sum only; any other unreduced operand makes
    # the sum's bound undecidable (NaN: the comparison falls back to the stated tolerance)
    from refsim.bounds.rules import arith
    from refsim.bounds.values import BVal

    class _Ctx:
        explain = False

        def op_id(self, eqn):
            return 0

    a = BVal(np.ones(2), None, np.dtype(np.float32), partial_terms=(3, np.full(2, 3.0), np.full(2, 3.0), 0.0))
    b = BVal(np.ones(2), None, np.dtype(np.float32))
    out = arith._unreduced_sum(_Ctx(), None, a, b, np.full(2, 2.0), np.dtype(np.float32), False)
    assert np.all(np.isnan(out.bound))
