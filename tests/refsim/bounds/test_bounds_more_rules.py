"""The bound rules of sort, top_k, reduce_window, cumprod, reduce_prod, cumlogsumexp, the
scatters, atan2, lgamma, digamma, iota and bitcast_convert_type, each against a bound computed
by hand or by a naive per-element loop (exact sums and products in fractions.Fraction)."""
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import scipy.special as sp
from jax import lax

import refsim.bounds as B
from refsim.bounds import platform as PL
from refsim.bounds import values as V
from refsim.bounds import walk
from refsim.bounds.registry import BCtx
from refsim.bounds.values import BVal

U = 2.0 ** -24
HS = V.half_subnormal(np.float32)
F32 = np.dtype(np.float32)


def walk_of(fn, *ins, dtype=F32, relaxations=()):
    """[BVal per output] of `fn` on inputs given as (center, bound or None) of `dtype`."""
    B.load_rules()
    avals = [np.zeros(np.shape(c), dtype) for c, _ in ins]
    closed = jax.make_jaxpr(fn)(*avals)
    bctx = BCtx(relaxations=frozenset(relaxations))
    args = [BVal(np.asarray(c, np.float64), None if b is None else np.broadcast_to(np.asarray(b, np.float64),
                                                                                   np.shape(c)), np.dtype(dtype))
            for c, b in ins]
    return walk.eval_closed(bctx, closed, args)


def growth(k, u=U):
    return math.expm1(k * math.log1p(u))         # (1 + u)**k - 1 without rounding 1 + u


# -- the sum latitude: no addition, no latitude ---------------------------------------------------
def test_a_sum_over_one_term_keeps_an_unbounded_term_unbounded_not_undecidable():
    (out,) = walk_of(lambda x: jnp.sum(x, axis=0), (np.array([[1.0, 2.0]]), np.array([[np.inf, 0.5]])))
    assert np.isinf(out.bound[0]) and not np.isnan(out.bound).any()
    assert out.bound[1] == pytest.approx(0.5 + V.REF_U * 2 * (1 + 1e-9), rel=1e-6)


# -- sort and top_k -------------------------------------------------------------------------------
C = np.array([3.0, 1.0, 2.0, 1.05])
Bd = np.array([0.1, 0.1, 0.5, 0.01])


def test_sorted_values_are_bounded_by_the_order_statistics_of_the_interval_ends():
    (out,) = walk_of(jnp.sort, (C, Bd))
    # lower ends sorted .9 1.04 1.5 2.9, upper ends 1.06 1.1 2.5 3.1, centers 1 1.05 2 3
    assert out.center.tolist() == [1.0, 1.05, 2.0, 3.0]
    assert out.bound == pytest.approx([0.1, 0.05, 0.5, 0.1])
    assert not np.isnan(out.bound).any()          # values never undecidable


def test_argsort_positions_are_decided_only_for_elements_apart_from_every_other():
    (out,) = walk_of(jnp.argsort, (C, Bd))
    assert out.center.tolist() == [1, 3, 2, 0]
    assert np.isnan(out.bound[:2]).all() and (out.bound[2:] == 0).all()    # 1 +- .1 and 1.05 +- .01 overlap


def test_exact_ties_are_decided_by_a_stable_sort_and_undecidable_for_an_unstable_one():
    keys, payload = np.array([1.0, 1.0, 0.0]), np.array([5.0, 6.0, 7.0])
    for stable, want in ((True, [False, False, False]), (False, [False, True, True])):
        outs = walk_of(lambda k, p: lax.sort((k, p), dimension=0, is_stable=stable, num_keys=1),
                       (keys, None), (payload, np.array([0.0, 0.0, 1e-3])))
        assert outs[1].center.tolist() == [7.0, 5.0, 6.0]
        assert np.isnan(outs[1].full_bound()).tolist() == want


def test_a_second_key_decides_what_an_exact_tie_of_the_first_leaves():
    k0, k1 = np.array([1.0, 1.0, 2.0]), np.array([0.5, 0.2, 0.0])
    outs = walk_of(lambda a, b: lax.sort((a, b, jnp.arange(3.0)), dimension=0, num_keys=2),
                   (k0, None), (k1, np.array([0.1, 0.1, 0.0])))
    assert outs[2].center.tolist() == [1.0, 0.0, 2.0]
    assert not np.isnan(outs[2].full_bound()).any()          # .5 +- .1 and .2 +- .1 apart
    outs = walk_of(lambda a, b: lax.sort((a, b, jnp.arange(3.0)), dimension=0, num_keys=2),
                   (k0, None), (k1, np.array([0.2, 0.2, 0.0])))
    assert np.isnan(outs[2].full_bound()).tolist() == [True, True, False]


def test_top_k_values_by_order_statistics_and_indices_where_decided():
    vals, idx = walk_of(lambda x: lax.top_k(x, 2), (np.array([3.0, 1.0, 2.95, 1.05]),
                                                     np.array([0.1, 0.1, 0.01, 0.01])))
    assert vals.center.tolist() == [3.0, 2.95] and idx.center.tolist() == [0, 2]
    # upper ends 3.1 2.96 ..., lower ends 2.94 2.9 ... (descending)
    assert vals.bound == pytest.approx([0.1, 0.05])
    assert np.isnan(idx.bound).all()                                   # 3 +- .1 and 2.95 +- .01 overlap
    vals, idx = walk_of(lambda x: lax.top_k(x, 2), (np.array([3.0, 1.0, 2.5, 1.05]), np.array([0.1] * 4)))
    assert idx.center.tolist() == [0, 2] and idx.bound is None


# -- reduce_window ---------------------------------------------------------------------------------
def _naive_window_sums(c, b, win, pad):
    """Per output element of a stride-1 2-D window sum: (exact sum, n terms, sum |c|, sum b)."""
    cp = np.pad(c, pad, constant_values=np.nan)
    bp = np.pad(b, pad)
    out = []
    for i in range(cp.shape[0] - win[0] + 1):
        row = []
        for j in range(cp.shape[1] - win[1] + 1):
            w = cp[i:i + win[0], j:j + win[1]]
            wb = bp[i:i + win[0], j:j + win[1]]
            real = ~np.isnan(w)
            row.append((sum(Fraction(float(v)) for v in w[real]), int(real.sum()), float(np.abs(w[real]).sum()),
                        float(wb.sum())))
        out.append(row)
    return out


def test_reduce_window_sum_is_higham_over_each_window():
    rng = np.random.default_rng(1)
    c = rng.standard_normal((3, 4))
    b = np.abs(rng.standard_normal((3, 4))) * 1e-6
    (out,) = walk_of(lambda x: lax.reduce_window(x, 0.0, lax.add, (2, 3), (1, 1), "SAME"), (c, b))
    naive = _naive_window_sums(c, b, (2, 3), ((0, 1), (1, 1)))
    for i in range(3):
        for j in range(4):
            s, n, ac, sb = naive[i][j]
            assert out.center[i, j] == pytest.approx(float(s), abs=1e-15)
            want = sb + growth(n - 1) * (ac + sb) + (n - 1) * HS + growth(n, 2.0 ** -53) * ac
            assert out.bound[i, j] == pytest.approx(want, rel=1e-9)


def test_reduce_window_sum_of_exact_friendly_terms_is_exact():
    (out,) = walk_of(lambda x: lax.reduce_window(x, 0.0, lax.add, (2,), (1,), "VALID"),
                     (np.array([1.0, 2.0, 0.5, 0.25]), None))
    assert out.center.tolist() == [3.0, 2.5, 0.75] and (out.full_bound() == 0).all()


def test_reduce_window_max_and_min_take_the_largest_bound_in_the_window():
    c, b = np.array([1.0, 5.0, 2.0, 4.0]), np.array([0.1, 0.3, 0.2, np.nan])
    mx, mn = walk_of(lambda x: (lax.reduce_window(x, -jnp.inf, lax.max, (2,), (1,), "VALID"),
                                lax.reduce_window(x, jnp.inf, lax.min, (2,), (1,), "VALID")), (c, b))
    assert mx.center.tolist() == [5.0, 5.0, 4.0] and mn.center.tolist() == [1.0, 2.0, 2.0]
    for o in (mx, mn):
        assert o.bound[:2].tolist() == [0.3, 0.3] and np.isnan(o.bound[2])    # NaN: undecidable stays


# -- products ----------------------------------------------------------------------------------------
def _product_bound(cs, bs, u=U):
    """The stated product bound (reductions.product_latitude), by hand from its terms."""
    n = len(cs)
    g = growth(n, 2.0 ** -53)
    mag = math.prod(abs(c) + b for c, b in zip(cs, bs))
    mag1 = math.prod(max(1.0, abs(c) + b) for c, b in zip(cs, bs))
    ac = abs(math.prod(cs))
    return (mag - ac) + g * (mag + ac) + growth(n - 1, u) * mag * (1 + g) + (n - 1) * HS * mag1 * (1 + growth(n, u)) \
        + g * ac


def test_cumprod_bound_per_prefix():
    c, b = [2.0, -3.0, 0.5], [0.5, 0.25, 0.0]
    (out,) = walk_of(jnp.cumprod, (np.array(c), np.array(b)))
    assert out.center.tolist() == [2.0, -6.0, -3.0]
    for k in range(3):
        assert out.bound[k] == pytest.approx(_product_bound(c[:k + 1], b[:k + 1]), rel=1e-12)
    (rev,) = walk_of(lambda x: lax.cumprod(x, reverse=True), (np.array(c), np.array(b)))
    assert rev.center.tolist() == [-3.0, -1.5, 0.5]
    assert rev.bound[0] == pytest.approx(_product_bound(c, b), rel=1e-12)


def test_reduce_prod_bound_and_exact_value():
    c = np.array([[1.5, -2.0, 3.0], [0.1, 0.2, 0.3]])
    (out,) = walk_of(lambda x: jnp.prod(x, axis=1), (c, None))
    assert out.center[0] == -9.0
    assert out.bound[0] == pytest.approx(_product_bound([1.5, -2.0, 3.0], [0, 0, 0]), rel=1e-12)
    exact = Fraction(0.1) * Fraction(0.2) * Fraction(0.3)
    assert abs(Fraction(float(out.center[1])) - exact) <= Fraction(float(out.bound[1]))


def test_a_product_whose_partial_products_may_overflow_is_unbounded():
    (out,) = walk_of(lambda x: jnp.prod(x), (np.array([1e30, 1e30, 1e-30]), None))
    assert np.isinf(out.bound)


# -- cumlogsumexp ----------------------------------------------------------------------------------
def test_cumlogsumexp_is_its_largest_operand_bound_plus_m_combines():
    c, b = np.array([0.5, -1.0, 2.0]), np.array([1e-3, 2e-3, 0.0])
    (out,) = walk_of(lambda x: lax.cumlogsumexp(x), (c, b))
    assert out.center == pytest.approx(np.logaddexp.accumulate(c), rel=1e-15)
    ke, kl = PL.transcendental_ulps("exp", F32), PL.transcendental_ulps("log1p", F32)
    for m in (1, 2, 3):
        big = max(np.abs(c[:m]) + b[:m]) + math.log(m)
        step = (V.half_ulp(2 * big, F32) + 2 * ke * V.half_ulp(1.0, F32) + 2 * kl * V.half_ulp(math.log(2), F32)
                + V.half_ulp(big, F32) + V.flush_threshold(F32))
        want = max(b[:m]) + m * step + 4 * m * V.REF_U * big
        assert out.bound[m - 1] == pytest.approx(want, rel=1e-12)


# -- scatters --------------------------------------------------------------------------------------
IDX = np.array([0, 2, 2, 2])


def test_scatter_add_is_a_sum_over_the_operand_and_the_updates_landing_on_it():
    op, up = np.array([1.0, 2.0, 3.0]), np.array([0.1, 0.2, 0.3, 0.4])
    ob, ub = np.array([1e-6, 0.0, 2e-6]), np.array([1e-7, 0.0, 1e-7, 3e-7])
    (out,) = walk_of(lambda o, u: o.at[IDX].add(u), (op, ob), (up, ub))
    for i, landing in ((0, [0]), (1, []), (2, [1, 2, 3])):
        n = 1 + len(landing)
        s = Fraction(op[i]) + sum(Fraction(up[j]) for j in landing)
        ac = abs(op[i]) + sum(abs(up[j]) for j in landing)
        sb = ob[i] + sum(ub[j] for j in landing)
        assert out.center[i] == pytest.approx(float(s), abs=1e-15)
        want = sb + growth(n - 1) * (ac + sb) + (n - 1) * HS + growth(n, 2.0 ** -53) * ac
        assert out.bound[i] == pytest.approx(want, rel=1e-9)


def test_scatter_add_of_exact_friendly_values_is_exact_and_sub_subtracts():
    outs = walk_of(lambda o, u: (o.at[IDX].add(u), o.at[IDX].subtract(u)),
                   (np.array([1.0, 2.0, 3.0]), None), (np.array([0.5, 0.25, 1.0, 2.0]), None))
    assert outs[0].center.tolist() == [1.5, 2.0, 6.25] and (outs[0].full_bound() == 0).all()
    assert outs[1].center.tolist() == [0.5, 2.0, -0.25] and (outs[1].full_bound() == 0).all()


def test_scatter_mul_is_a_product_of_the_operand_and_its_updates():
    (out,) = walk_of(lambda o, u: o.at[IDX].multiply(u), (np.array([1.0, 2.0, 3.0]), np.array([0.0, 0.0, 0.5])),
                     (np.array([2.0, -1.5, 4.0, 0.5]), None))
    assert out.center.tolist() == [2.0, 2.0, -9.0]
    assert out.bound[2] == pytest.approx(_product_bound([3.0, -1.5, 4.0, 0.5], [0.5, 0, 0, 0]), rel=1e-12)
    assert out.bound[1] == pytest.approx(_product_bound([2.0], [0.0]), rel=1e-12)


def test_scatter_min_max_take_the_largest_bound_among_the_combined_elements():
    mn, mx = walk_of(lambda o, u: (o.at[IDX].min(u), o.at[IDX].max(u)),
                     (np.array([1.0, 2.0, 3.0]), np.array([0.1, 0.2, 0.3])),
                     (np.array([0.0, 5.0, 1.0, 2.0]), np.array([0.01, 0.02, 0.5, 0.04])))
    assert mn.center.tolist() == [0.0, 2.0, 1.0] and mx.center.tolist() == [1.0, 2.0, 5.0]
    assert mn.bound.tolist() == [0.1, 0.2, 0.5] and mx.bound.tolist() == [0.1, 0.2, 0.5]


# -- atan2, lgamma, digamma -----------------------------------------------------------------------
def _lat(k, a):
    return 2 * k * V.half_ulp(a, F32) + 2 * V.REF_U * abs(a)


def test_atan2_of_exact_operands_is_the_platform_accuracy():
    (out,) = walk_of(jnp.arctan2, (np.array([1.0]), None), (np.array([2.0]), None))
    c = math.atan2(1.0, 2.0)
    assert out.center[0] == c
    assert out.bound[0] == pytest.approx(_lat(PL.transcendental_ulps("atan2", F32), c), rel=1e-12)


def test_atan2_over_a_box_takes_the_farthest_corner():
    (out,) = walk_of(jnp.arctan2, (np.array([1.0]), np.array([0.1])), (np.array([2.0]), np.array([0.2])))
    c = math.atan2(1.0, 2.0)
    bp = max(abs(math.atan2(1 + sa * 0.1, 2 + sb * 0.2) - c) for sa in (-1, 1) for sb in (-1, 1))
    k = PL.transcendental_ulps("atan2", F32)
    assert out.bound[0] == pytest.approx(bp + _lat(k, c + bp) - 2 * V.REF_U * (bp), rel=1e-9)


def test_atan2_across_its_branch_cut_is_undecidable_and_beyond_the_measured_domain_unbounded():
    (cut,) = walk_of(jnp.arctan2, (np.array([0.0]), np.array([1e-3])), (np.array([-1.0]), None))
    assert np.isnan(cut.bound[0])
    (far,) = walk_of(jnp.arctan2, (np.array([5e3]), None), (np.array([1.0]), None))
    assert np.isinf(far.bound[0])
    (side,) = walk_of(jnp.arctan2, (np.array([0.0]), np.array([1e-3])), (np.array([1.0]), None))
    assert np.isfinite(side.bound[0])                             # b > 0: no cut
    (origin,) = walk_of(jnp.arctan2, (np.array([0.0]), np.array([1e-3])), (np.array([1e-3]), np.array([1e-3])))
    assert np.isnan(origin.bound[0])                              # b may be a zero of either sign


def test_lgamma_and_digamma_are_the_mixed_bound_plus_the_interval():
    from refsim.interpreter.accuracy import mixed_bound

    eps = float(np.finfo(np.float32).eps)
    lg, dg = walk_of(lambda x: (lax.lgamma(x), lax.digamma(x)), (np.array([3.0, 1.4]), np.array([0.01, 0.1])))
    for out, f, name, mn in ((lg, sp.gammaln, "lgamma", 1.4616321449683622), (dg, sp.psi, "digamma", None)):
        m = 2 * mixed_bound(name) + 1
        for i, (c, b) in enumerate(((3.0, 0.01), (1.4, 0.1))):
            fc = f(c)
            bp = max(abs(f(c - b) - fc), abs(f(c + b) - fc))
            if mn is not None and c - b <= mn <= c + b:
                bp = max(bp, abs(fc - f(mn)))
            scale = max(1.0, abs(fc) + bp)
            assert out.bound[i] == pytest.approx(bp + m * eps * scale + 16 * V.REF_U * scale, rel=1e-9)


def test_lgamma_outside_its_measured_domain_is_unbounded():
    (out,) = walk_of(lax.lgamma, (np.array([-0.5, 2e3, 1e-4]), None))
    assert np.isinf(out.bound).all()


# -- iota, bitcast ----------------------------------------------------------------------------------
def test_a_float_iota_is_each_integer_correctly_rounded():
    (out,) = walk_of(lambda x: jnp.arange(300, dtype=jnp.bfloat16) + x, (np.zeros(300), None),
                     dtype=ml_dtypes.bfloat16)
    want = np.arange(300).astype(ml_dtypes.bfloat16).astype(np.float64)
    assert out.center.tolist() == want.tolist() and out.bound is None
    assert out.center[257] == 256.0                                 # 257 is not a bfloat16


def test_bitcast_of_an_exact_value_is_its_bits_and_of_a_bounded_one_undecidable():
    (out,) = walk_of(lambda x: lax.bitcast_convert_type(x, jnp.int32), (np.array([1.0, 2.0]), np.array([0.0, 1e-3])))
    assert int(out.center[0]) == int(np.float32(1.0).view(np.int32))
    assert out.bound[0] == 0 and np.isnan(out.bound[1])


# -- select_and_scatter_add (max-pooling's gradient) -----------------------------------------------
def _pool_grad(a, g):
    pool = lambda v: lax.reduce_window(v, -jnp.inf, lax.max, (2,), (2,), "VALID")  # noqa: E731
    return jax.vjp(pool, a)[1](g)[0]


def test_pool_gradient_goes_to_the_decided_maximum_and_is_undecidable_where_the_pick_is_not():
    (out,) = walk_of(_pool_grad, (np.array([1.0, 3.0, 2.0, 0.0]), np.array([0.5, 0.5, 1.0, 1.5])),
                     (np.array([10.0, 20.0]), np.array([1e-3, 0.0])))
    assert out.center.tolist() == [0.0, 10.0, 20.0, 0.0]
    # window 0: 3 +- .5 clears 1 +- .5; window 1: 2 +- 1 and 0 +- 1.5 overlap
    assert out.bound[0] == 0.0 and out.bound[1] == pytest.approx(1e-3 + growth(1, 2.0 ** -53) * 10, rel=1e-9)
    assert np.isnan(out.bound[2:]).all()


def test_pool_gradient_with_an_exact_tie_is_undecidable_and_overlapping_windows_add():
    (tie,) = walk_of(_pool_grad, (np.array([3.0, 3.0, 2.0, 0.0]), None), (np.array([10.0, 20.0]), None))
    assert np.isnan(tie.bound[:2]).all() and tie.bound[2] == 0.0
    pool = lambda v: lax.reduce_window(v, -jnp.inf, lax.max, (2,), (1,), "VALID")  # noqa: E731
    (out,) = walk_of(lambda a, g: jax.vjp(pool, a)[1](g)[0], (np.array([1.0, 5.0, 2.0]), None),
                     (np.array([0.1, 0.2]), None))
    # both windows pick 5: 0.1 + 0.2 in either order, one rounding of float32
    assert out.center[1] == pytest.approx(0.3, abs=1e-16)
    assert out.bound[1] == pytest.approx(growth(1) * 0.3 + HS + growth(2, 2.0 ** -53) * 0.3, rel=1e-9)


def test_a_rank0_bool_op_takes_the_integer_fallback():
    """`and` of two scalar comparisons (refsim's rule returns a NumPy scalar there, np.bool_) is
    exact where both are decided, so a float output it selects keeps its bound (it was "no bound
    rule: and" in the sharded suite's census: 66-150 elements a seed)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from refsim import bounds

    f = lambda x, y: jnp.where(jnp.logical_and(x.sum() > 0, y.sum() > 0), x * 1.5, y)  # noqa: E731
    x, y = np.array([1.0, 2.0], np.float32), np.array([3.0, -1.0], np.float32)
    closed = jax.make_jaxpr(f)(x, y)
    assert "and" in [e.primitive.name for e in closed.jaxpr.eqns]
    out = bounds.evaluate(closed, [x, y]).outputs[0]
    assert isinstance(out, bounds.BVal)
    assert out.center.tolist() == [1.5, 3.0]        # both sums positive: x * 1.5, exact here
    b = out.full_bound() if out.bound is not None else np.zeros(2)
    assert (np.asarray(b) == 0).all()               # 1.5 * 1.0 and 1.5 * 2.0 are exact in float32


def test_square_of_integers_is_exact():
    """`square` of int32 values takes refsim's own rule on the exact values (it raised a TypeError
    before, an injected `y` param, so the walk failed and the whole program lost its allowed set)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from refsim import bounds

    x = np.array([-3, 0, 7], np.int32)
    out = bounds.evaluate(jax.make_jaxpr(lambda a: jnp.square(a))(x), [x]).outputs[0]
    assert isinstance(out, bounds.BVal) and out.center.tolist() == [9, 0, 49] and out.bound is None


def test_a_scatter_add_folded_into_an_addend_is_a_declared_relaxation():
    """XLA's algebraic simplifier computes A + ScatterAdd(zeros, I, U) as ScatterAdd(A, I, U) (the
    compiled module of a gather's pullback scatters into the other cotangents' sum), so an element
    reached by two updates is summed in another order than the jaxpr's: here 1.3 times the walk's
    bound without relaxations from the exact value (jax 0.10.2 and 0.12; a false alarm of issue 39's
    seed sweep, jax 0.10.2 seed 24, with erf in place of the product). `xla-scatter-add-folding`
    widens the add by Higham's bound for its 1 + k terms and names itself."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from refsim import bounds

    def g(a0):
        v1 = a0[jnp.array([0, -1, -3], dtype=jnp.int32)]            # indices 0, 2, 0
        return (a0, v1 * np.float32(1e-3), jnp.pad(a0, [(1, 2)], mode="wrap"))

    def f(a0):
        outs, pull = jax.vjp(g, a0)
        return pull(outs)[0]

    a = np.array([-3.5, 3.5, 4.0], np.float32)
    closed = jax.make_jaxpr(f)(a)
    strict = bounds.evaluate(closed, [a], relaxations=()).outputs[0]
    relaxed_res = bounds.evaluate(closed, [a], relaxations={"xla-scatter-add-folding"})
    relaxed = relaxed_res.outputs[0]
    assert "xla-scatter-add-folding" in relaxed_res.used
    xla = np.asarray(jax.jit(f)(a)).astype(np.float64)
    diff = np.abs(xla - strict.center)
    # element 0: a0 and the pad's two copies (-3.5 - 7) and two updates of -3.5e-6, in XLA's order
    assert strict.full_bound()[0] < diff[0] <= relaxed.full_bound()[0], (xla, strict.full_bound())
    assert (diff <= relaxed.full_bound()).all()
    assert relaxed.full_bound()[1] == strict.full_bound()[1]          # no update reaches element 1


def test_a_scatter_add_of_constants_folded_into_an_addend_is_allowed():
    """A gather's pullback whose cotangents are constants (the loss's weights) is a scatter-add of
    constants only, which the walk marks a constant (XLA may fold it into one); XLA folds the add of
    the other cotangent into it instead (the 0.12 host_offload hunt, seed 6302: `expm1` beside a
    gather under grad, 1.2x the bound without the relaxation). The relaxation keys on the
    scatter-add's terms, not on its origin."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from refsim import bounds

    w = (np.arange(24, dtype=np.float32).reshape(4, 6) % 3 + 1)

    def loss(a):
        return jnp.sum(jnp.expm1(a) * w) + jnp.sum(a[jnp.array([-1, 3, 0, 1], dtype=jnp.int32)] * w)

    x = np.linspace(-4.0, 0.5, 24, dtype=np.float32).reshape(4, 6)
    closed = jax.make_jaxpr(jax.grad(loss))(x)
    res = bounds.evaluate(closed, [x], relaxations=bounds.platform.RELAXATIONS)
    out = res.outputs[0]
    assert "xla-scatter-add-folding" in res.used
    # row 3 takes two updates (indices -1 and 3) beside the expm1 cotangent w * exp(x): three terms
    x64 = x.astype(np.float64)
    three = np.abs(w[3] * np.exp(x64[3])) + 2 * np.abs(w[3])
    assert (out.full_bound()[3] >= ((1 + 2.0 ** -24) ** 2 - 1) * three).all()
    xla = np.asarray(jax.jit(jax.grad(loss))(x)).astype(np.float64)
    assert (np.abs(xla - out.center) <= out.full_bound()).all()


def test_a_gather_fill_value_is_exact():
    """Elements a mode='fill' gather fills are exact (bound 0): the walk gave them the fill value as
    their bound (-1.0: a negative bound, so even XLA's exact -1.0 disagreed; the 0.10.2 donation hunt,
    `log + at_get(mode='fill') + mean` under vjp), and NaN for the default fill (undecidable)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from refsim import bounds

    x = np.array([[0.5, 2.0], [3.0, 4.0]], np.float32)
    for fill in (-1.0, None):
        f = lambda a: jnp.log(a).at[jnp.array([-3, 1, 3])].get(mode="fill", fill_value=fill)  # noqa: E731
        out = bounds.evaluate(jax.make_jaxpr(f)(x), [x]).outputs[0]
        b = out.full_bound()
        assert b.shape == (3, 2) and (b[[0, 2]] == 0).all()       # rows 0 and 2 are filled: exact
        assert (b[1] > 0).all()                                    # row 1 is log(x[1]): one rounding each
        dom = bounds.evaluate(jax.make_jaxpr(f)(x), [x], explain=True).outputs[0].dom
        assert (np.asarray(dom)[[0, 2]] == -1).all()               # explain: no op dominates a filled element


def test_one_minus_square_is_bounded_where_jax_binds_it():
    """jax >= 0.12 binds one_minus_square in tanh's JVP: its bound covers (1 + x)(1 - x) rounded
    three times in float32, checked against a float32 evaluation in every order of roundings."""
    import jax
    import numpy as np
    import pytest

    from refsim import bounds
    from refsim.compat import jax_version

    if jax_version() < (0, 12):
        pytest.skip("one_minus_square is a primitive from jax 0.12 on")
    x = np.linspace(-0.99, 0.99, 41).astype(np.float32)
    closed = jax.make_jaxpr(lambda a: jax.jvp(jax.numpy.tanh, (a,), (jax.numpy.ones_like(a),))[1])(x)
    assert any(e.primitive.name == "one_minus_square" for e in closed.jaxpr.eqns) or \
        "one_minus_square" in str(closed)
    out = bounds.evaluate(closed, [x]).outputs[0]
    assert isinstance(out, bounds.BVal)
    t = np.tanh(x.astype(np.float64)).astype(np.float32)
    for value in ((np.float32(1) + t) * (np.float32(1) - t), np.float32(1) - t * t):
        assert (np.abs(value.astype(np.float64) - out.center) <= out.full_bound()).all()


def test_polynomial_walks_horners_rule():
    """jax 0.12's `polynomial` (coefficients lowest degree first): the walk goes through Horner's rule
    as JAX lowers it. On small integers and integer coefficients every step is exact (bound 0, the
    value by hand); on other floats XLA's result lies within the bound of the exact value."""
    import jax
    import numpy as np
    import pytest

    from refsim import bounds

    if not hasattr(jax.lax, "polynomial"):
        pytest.skip("lax.polynomial is a primitive from jax 0.12 on")
    x = np.array([-2, -1, 0, 1, 3], np.float32)
    closed = jax.make_jaxpr(lambda a: jax.lax.polynomial(a, [1.0, -2.0, 0.0, 3.0]))(x)
    assert "polynomial" in str(closed)
    out = bounds.evaluate(closed, [x]).outputs[0]
    assert isinstance(out, bounds.BVal)
    # 1 - 2x + 3x**3 by hand: x=-2: 1+4-24 = -19; -1: 1+2-3 = 0; 0: 1; 1: 2; 3: 1-6+81 = 76
    np.testing.assert_array_equal(out.center, [-19.0, 0.0, 1.0, 2.0, 76.0])
    assert not out.full_bound().any()
    y = np.linspace(-1.7, 2.3, 33).astype(np.float32)
    coef = [0.1, -0.7, 1.3, 0.01, -0.45]
    f = lambda a: jax.lax.polynomial(a, coef)    # noqa: E731
    out = bounds.evaluate(jax.make_jaxpr(f)(y), [y], relaxations=bounds.platform.RELAXATIONS).outputs[0]
    # every result the spec allows lies within the bound of the center: Horner's rule in float32
    # by NumPy (each product and sum rounded, or each step fused as XLA:CPU's FMA), and XLA's result
    c32 = np.float32(coef)
    plain, fused = np.full_like(y, c32[-1]), np.full_like(y, c32[-1])
    for c in c32[-2::-1]:
        plain = plain * y + c
        fused = (fused.astype(np.float64) * y + c).astype(np.float32)
    got = np.asarray(jax.jit(f)(y))
    assert np.isfinite(out.full_bound()).all() and (out.full_bound() > 0).any()
    for allowed in (plain, fused, got):
        assert (np.abs(allowed.astype(np.float64) - out.center) <= out.full_bound()).all()
