"""One test per bound rule (refsim.bounds), each against a bound computed by hand from the
rule's stated formula (docs/comparison.md, "The allowed set")."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import refsim.bounds as B
from refsim.bounds import platform as PL
from refsim.bounds import values as V
from refsim.bounds import walk
from refsim.bounds.registry import BCtx
from refsim.bounds.values import BVal, Unknown

U = 2.0 ** -24          # float32 unit roundoff
REF = V.REF_U
F32 = np.dtype(np.float32)


def bounds_of(fn, *ins, relaxations=()):
    """Walk `fn`'s jaxpr with BVal inputs (center, bound) of float32: [BVal or Unknown per output]."""
    B.load_rules()
    avals = [np.zeros(np.shape(c), np.float32) for c, _ in ins]
    closed = jax.make_jaxpr(fn)(*avals)
    bctx = BCtx(relaxations=frozenset(relaxations))
    args = [BVal(np.asarray(c, np.float64), None if b is None else np.asarray(b, np.float64), F32) for c, b in ins]
    return walk.eval_closed(bctx, closed, args), bctx


def one(fn, *ins, **kw):
    outs, _ = bounds_of(fn, *ins, **kw)
    return outs[0]


def hu(a):  # half an ulp of float32 at magnitude a (a normal number)
    return U * 2.0 ** math.floor(math.log2(a))


# -- IEEE-exact operations ----------------------------------------------------------------------
def test_an_operation_on_exact_operands_has_one_allowed_result():
    out = one(lambda x, y: x + y, (1.0, None), (2.0 ** -30, None))
    assert out.bound is None and out.center == 1.0                     # fl32(1 + 2**-30)
    q = one(lambda x, y: x / y, (1.0, None), (3.0, None))
    assert q.bound is None and q.center == float(np.float32(1) / np.float32(3))


def test_add_propagates_its_operands_bounds_and_adds_half_an_ulp():
    out = one(lambda x, y: x + y, (1.0, 2.0 ** -20), (2.0, 2.0 ** -21))
    bp = 2.0 ** -20 + 2.0 ** -21
    assert out.center == 3.0
    assert float(out.bound) == pytest.approx(bp + hu(3 + bp) + REF * 3, rel=1e-12)


def test_mul_keeps_the_second_order_term():
    out = one(lambda x, y: x * y, (3.0, 0.5), (-2.0, 0.25))
    bp = 2 * 0.5 + 3 * 0.25 + 0.5 * 0.25                                 # 1.875
    assert out.center == -6.0
    assert float(out.bound) == pytest.approx(bp + hu(6 + bp) + REF * 6, rel=1e-12)


def test_div_uses_the_shrunk_denominator_and_is_unbounded_across_zero():
    out = one(lambda x, y: x / y, (1.0, None), (4.0, 1.0))
    bp = 0.25 * 1.0 / (4.0 - 1.0)
    assert float(out.bound) == pytest.approx(bp + hu(0.25 + bp) + REF * 0.25, rel=1e-12)
    assert np.isinf(one(lambda x, y: x / y, (1.0, None), (0.5, 1.0)).bound)          # unbounded


def test_sqrt_over_the_interval():
    out = one(jnp.sqrt, (4.0, 0.5))
    bp = 2.0 - math.sqrt(3.5)
    assert float(out.bound) == pytest.approx(bp + hu(2 + bp) + REF * 2, rel=1e-12)
    assert np.isinf(one(jnp.sqrt, (0.1, 0.5)).bound)                    # may be negative: NaN or not
    assert np.isfinite(one(lambda x: jnp.sqrt(jnp.abs(x)), (0.1, 0.5)).bound)    # known >= 0


def test_convert_rounds_once_and_float_to_int_is_decided_by_the_interval():
    out = one(lambda x: x.astype(jnp.bfloat16), (1.0, 2.0 ** -12))
    assert float(out.bound) == pytest.approx(2.0 ** -12 + 2.0 ** -8 + REF, rel=1e-12)   # half ulp of bf16 at 1
    assert one(lambda x: x.astype(jnp.int32), (2.5, 0.25)).bound is None           # trunc 2 throughout
    assert np.isnan(one(lambda x: x.astype(jnp.int32), (2.9, 0.25)).bound)         # 2 or 3


# -- non-expansive and exact ----------------------------------------------------------------------
def test_max_min_neg_abs_take_the_largest_operand_bound():
    assert float(one(jnp.maximum, (1.0, 0.1), (5.0, 0.3)).bound) == 0.3
    assert float(one(jnp.minimum, (1.0, 0.1), (5.0, 0.3)).bound) == 0.3
    assert float(one(lambda x: -jnp.abs(x), (-2.0, 0.1)).bound) == 0.1


def test_data_movement_moves_the_bound_with_the_value():
    c = np.arange(6.0).reshape(2, 3)
    b = np.arange(6.0).reshape(2, 3) / 100
    out = one(lambda x: jnp.concatenate([x.T[1:], x.T[:1]]), (c, b))
    np.testing.assert_array_equal(out.center, np.concatenate([c.T[1:], c.T[:1]]))
    np.testing.assert_array_equal(out.bound, np.concatenate([b.T[1:], b.T[:1]]))
    bc = one(lambda x: jnp.broadcast_to(x[:, :1], (2, 4)), (c, b))
    np.testing.assert_array_equal(bc.bound, np.broadcast_to(b[:, :1], (2, 4)))


# -- sums and dots ------------------------------------------------------------------------------
def test_reduce_sum_is_higham_for_any_order():
    out = one(jnp.sum, (np.array([1.0, U, U]), None))
    s = 1 + 2 * U
    want = float(V.growth(2, U)) * s + 2 * V.half_subnormal(F32) + float(V.growth(3, 2.0 ** -53)) * s
    assert float(out.bound) == pytest.approx(want, rel=1e-12)


def test_reduce_sum_of_exact_friendly_terms_is_exact():
    out = one(jnp.sum, (np.array([1.0, 2.0, 3.0, 0.5]), None))
    assert float(out.bound) == 0 and out.center == 6.5


def test_reduce_sum_propagates_the_terms_bounds():
    out = one(jnp.sum, (np.array([1.0, -1.0]), np.array([0.5, 0.25])))
    want = 0.75 + float(V.growth(1, U)) * 2.75 + V.half_subnormal(F32) + float(V.growth(2, 2.0 ** -53)) * 2
    assert float(out.bound) == pytest.approx(want, rel=1e-12)


def test_dot_general_is_the_inner_product_bound_plus_propagation():
    a = np.array([[1.0, U]])
    b = np.array([[1.0], [1.0]])
    out = one(lambda x, y: x @ y, (a, None), (b, np.array([[0.5], [0.0]])))
    p = 1 + U
    prop = 1.0 * 0.5
    want = (prop + float(V.growth(3, U)) * (p + prop) + float(V.growth(2, 2.0 ** -53)) * p
            + 3 * V.half_subnormal(F32) + REF * p)
    assert float(out.bound[0, 0]) == pytest.approx(want, rel=1e-12)


# -- transcendentals: the platform table --------------------------------------------------------
def test_exp_latitude_is_the_platform_table_at_the_result():
    k = PL.transcendental_ulps("exp", np.float32)
    assert k == 2 * 1 + 1          # measured 1 ulp on XLA:CPU (refsim.interpreter.accuracy), doubled + 1
    out = one(jnp.exp, (0.0, None))
    assert out.center == 1.0
    assert float(out.bound) == pytest.approx(2 * k * hu(1.0) + 2 * REF, rel=1e-12)
    wide = one(jnp.exp, (0.0, 0.5))
    assert float(wide.bound) == pytest.approx((math.exp(0.5) - 1) + 2 * k * hu(math.exp(0.5)) + 2 * REF, rel=1e-9)


def test_exp_overflow_is_certain_or_unbounded():
    assert one(jnp.exp, (100.0, 0.1)).center == np.inf
    assert np.isinf(one(jnp.exp, (88.72, 0.1)).bound)


def test_log_of_an_interval_reaching_zero_is_unbounded_and_a_comparison_of_it_undecidable():
    assert np.isinf(one(jnp.log, (0.05, 0.1)).bound)
    assert np.isnan(one(lambda x: jnp.log(x) > 0, (0.05, 0.1)).bound)


# -- decisions: three-valued --------------------------------------------------------------------
def test_comparisons_closer_than_their_bounds_are_undecidable():
    assert np.isnan(one(lambda x, y: x < y, (1.0, 0.1), (1.05, 0.1)).bound)
    assert one(lambda x, y: x < y, (1.0, 0.01), (1.05, 0.01)).bound is None
    assert one(lambda x: x == x, (1.0, 0.5)).bound is None                # the same value


def test_select_takes_the_union_where_the_cases_overlap_else_undecidable():
    def f(x, y, z):
        return jnp.where(x > 0, y, z)

    out = one(f, (0.0, 0.1), (1.0, 0.2), (1.1, 0.2))                 # undecidable predicate
    assert float(out.bound) == pytest.approx(max(0.2, 0.1 + 0.2) if out.center == 1.1 else 0.1 + 0.2)
    assert np.isnan(one(f, (0.0, 0.1), (1.0, 0.01), (5.0, 0.01)).bound)
    assert float(one(f, (1.0, 0.1), (1.0, 0.01), (5.0, 0.01)).bound) == 0.01


def test_argmax_floor_and_sign_are_decided_by_the_intervals():
    assert one(jnp.argmax, (np.array([1.0, 2.0, 3.0]), np.array([0.1, 0.1, 0.1]))).bound is None
    assert np.isnan(one(jnp.argmax, (np.array([1.0, 2.95, 3.0]), np.array([0.1, 0.1, 0.1]))).bound)
    assert np.isnan(one(jnp.floor, (2.95, 0.1)).bound) and one(jnp.floor, (2.5, 0.1)).bound is None
    assert np.isnan(one(jnp.sign, (0.05, 0.1)).bound)


def test_comparing_a_value_with_its_own_max_is_decided_where_the_max_is():
    grad = jax.grad(lambda x: jnp.max(x))
    out = one(grad, (np.array([1.0, 3.0, 2.0]), np.array([0.1, 0.1, 0.1])))
    assert not np.isnan(out.bound).any() and out.center.tolist() == [0, 1, 0]
    tie = one(grad, (np.array([1.0, 3.0, 2.95]), np.array([0.1, 0.1, 0.1])))
    assert np.isnan(tie.bound[1:]).all()


def test_while_with_an_undecidable_predicate_makes_the_carry_undecidable():
    def f(x):
        return lax.while_loop(lambda v: v < 10.0, lambda v: v * 2.0, x)

    assert one(f, (1.0, None)).center == 16.0
    assert np.isnan(one(f, (1.25, 0.01)).bound)            # 1.25 * 8 = 10: stop or not


# -- collectives --------------------------------------------------------------------------------
def test_psum_in_a_shard_map_is_exact_when_no_order_rounds_else_higham():
    mesh = jax.make_mesh((4,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    f = jax.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())
    out = one(f, (np.array([1.0, 2.0, 3.0, 4.0]), None))
    assert out.center.tolist() == [10.0] and float(out.bound[0]) == 0
    x = np.array([1.0, U / 2, U / 2, U / 2])
    out = one(f, (x, None))
    s = float(np.sum(np.abs(x)))
    want = float(V.growth(3, U)) * s + 3 * V.half_subnormal(F32) + float(V.growth(4, 2.0 ** -53)) * s
    assert float(out.bound[0]) == pytest.approx(want, rel=1e-12)


# -- what has no rule, and relaxations ------------------------------------------------------------
def test_a_primitive_without_a_rule_makes_only_what_depends_on_it_unknown():
    outs, _ = bounds_of(lambda x: (lax.bessel_i1e(x) + 1.0, x * 2.0), (3.0, None))
    assert isinstance(outs[0], Unknown) and outs[0].reasons == frozenset({"bessel_i1e"})
    assert isinstance(outs[1], BVal) and outs[1].center == 6.0


def test_flush_to_zero_widens_only_subnormal_results_and_is_recorded():
    tiny = float(np.finfo(np.float32).tiny)
    out, bctx = bounds_of(lambda x: x * 0.25, (tiny, None), relaxations={"xla-cpu-ftz"})
    assert float(out[0].bound) == out[0].center == tiny / 4 and "xla-cpu-ftz" in bctx.used
    out, bctx = bounds_of(lambda x: x * 0.25, (tiny, None))
    assert out[0].bound is None and not bctx.used


def test_reciprocal_division_widens_only_a_division_by_a_constant_that_is_not_a_power_of_two():
    relax = {"xla-reciprocal-division"}
    out, bctx = bounds_of(lambda x: x / 5.0, (9.0, None), relaxations=relax)
    assert float(out[0].bound) > 0 and "xla-reciprocal-division" in bctx.used
    out, bctx = bounds_of(lambda x: x / 4.0, (9.0, None), relaxations=relax)
    assert out[0].bound is None and not bctx.used
    out, bctx = bounds_of(lambda x, y: x / y, (9.0, None), (5.0, None), relaxations=relax)
    assert out[0].bound is None and not bctx.used                      # a computed divisor


def test_division_reassociation_widens_a_division_of_or_by_a_quotient():
    # XLA's simplifier: (A / B) / C as A / (B * C), A / (B / C) as (A * C) / B. Plain JAX, XLA:CPU:
    # 10 / 11 / 11 is 10 / fl(121) = 0.082644626, where fl(fl(10 / 11) / 11) = 0.082644634 (the center)
    relax = {"xla-division-reassociation"}
    xla = float(np.float32(10) / np.float32(121))
    out, bctx = bounds_of(lambda a, d: a / d / d, (10.0, None), (11.0, None), relaxations=relax)
    c = float(np.float32(np.float32(10) / np.float32(11)) / np.float32(11))
    assert out[0].center == c and abs(xla - c) <= float(out[0].bound) and "xla-division-reassociation" in bctx.used
    assert float(out[0].bound) == 2 * U * c + hu(c)
    out, bctx = bounds_of(lambda a, b, c: a / (b / c), (1.0, None), (3.0, None), (7.0, None), relaxations=relax)
    assert float(out[0].bound) > 0 and "xla-division-reassociation" in bctx.used
    out, bctx = bounds_of(lambda a, d: a / d / d, (10.0, None), (11.0, None))
    assert out[0].bound is None and not bctx.used                      # the spec alone: two correct roundings
    out, bctx = bounds_of(lambda a, d: (a / d) * d, (10.0, None), (11.0, None), relaxations=relax)
    assert not bctx.used                                               # no division of a quotient


def test_explain_names_the_dominating_op_of_a_sum_over_a_leading_axis():
    # explain mode (allowed.explain_disagreements) on a reduction whose axis is not the last: the kept
    # axes were reshaped in the operand's order and a (3, 4) sum over axis 0 raised a broadcast error
    x = np.linspace(1.0, 2.0, 12, dtype=np.float32).reshape(3, 4)
    closed = jax.make_jaxpr(lambda a: jnp.sum(a * 1.1, axis=0))(x)
    res = B.evaluate(closed, [x], explain=True)
    out = res.outputs[0]
    assert out.dom.shape == (4,) and out.bound.shape == (4,) and (out.bound > 0).all()
    assert {res.ops[i] for i in np.unique(out.dom)} <= set(res.ops)


def test_every_rule_is_registered_once_and_named_by_its_primitive():
    table = B.load_rules()
    for name in ("add", "mul", "div", "sqrt", "exp", "tanh", "reduce_sum", "dot_general", "psum", "transpose",
                 "select_n", "while", "scan", "cond", "shard_map", "pjit", "convert_element_type"):
        assert name in table, name
    with pytest.raises(ValueError, match="already has a bound rule"):
        B.register("add")(lambda *a: None)


def test_conv_is_the_inner_product_bound_over_the_kernel():
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]])            # N=1, C=1, W=4
    w = np.array([[[1.0, U]]])                        # O=1, I=1, K=2
    out = one(lambda a, b: lax.conv_general_dilated(a, b, (1,), "VALID"), (x, None), (w, None))
    np.testing.assert_allclose(out.center[0, 0], [1 + 2 * U, 2 + 3 * U, 3 + 4 * U], rtol=0)
    p = out.center[0, 0]
    want = (V.growth(3, U) * p + V.growth(2, 2.0 ** -53) * p + 3 * V.half_subnormal(F32) + REF * p)
    np.testing.assert_allclose(out.bound[0, 0], want, rtol=1e-12)


def test_custom_linear_solve_is_its_solve():
    def f(b):
        a = jnp.array([[2.0, 0.0], [0.0, 4.0]], jnp.float32)
        return lax.custom_linear_solve(lambda x: a @ x, b, lambda mv, r: r / jnp.diag(a))

    out = one(f, (np.array([1.0, 3.0]), None))
    assert out.center.tolist() == [0.5, 0.75] and out.bound is None
