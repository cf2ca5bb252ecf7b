"""Properties of the newer bound rules: for operands anywhere in their allowed sets and any
order the spec allows, the true result (exact in fractions.Fraction for sums and products,
float64 for the functions) lies within center +- bound, decided positions are the same in
every such implementation, and XLA:CPU's result on random inputs is judged "agree"."""
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special as sp
from hypothesis import given, strategies as st
from jax import lax

import conformance
import refsim.bounds as B
from refsim.bounds import values as V
from refsim.bounds import walk
from refsim.bounds.registry import BCtx
from refsim.bounds.values import BVal

F32 = np.float32
MARGIN = 1 + 2.0 ** -40


def _walk(fn, centers, bounds):
    B.load_rules()
    closed = jax.make_jaxpr(fn)(*[np.zeros(np.shape(c), F32) for c in centers])
    args = [BVal(np.asarray(c, np.float64), None if b is None else np.asarray(b, np.float64), np.dtype(F32))
            for c, b in zip(centers, bounds)]
    return walk.eval_closed(BCtx(), closed, args)


def _inside(got, out, where=None):
    got = np.asarray(got, np.float64)
    b = out.full_bound()
    ok = (np.abs(got - out.center) <= b * MARGIN) | np.isnan(b) | (got == out.center)
    if where is not None:
        ok = ok | ~where
    return bool(ok.all())


@st.composite
def rows(draw, n_min=2, n_max=12):
    """Float32 centers in [-4, 4] with near-ties, and bounds from 0 to 1e-2 relative."""
    n = draw(st.integers(n_min, n_max), label="n")
    base = draw(st.lists(st.floats(-4, 4, width=32), min_size=n, max_size=n))
    c = np.array(base, F32).astype(np.float64)
    if n > 2 and draw(st.booleans()):
        c[1] = c[0] + draw(st.sampled_from([0.0, 1e-4, -1e-3]))      # a near or exact tie
    c = c.astype(F32).astype(np.float64)
    rel = np.array(draw(st.lists(st.sampled_from([0.0, 1e-6, 1e-4, 1e-2]), min_size=n, max_size=n)))
    return c, rel * (np.abs(c) + 1e-3)


def _allowed(c, b, rng):
    """One allowed operand: each element anywhere in [c - b, c + b] (ends included)."""
    t = rng.choice([-1.0, 1.0, 0.0, 0.5, -0.5], size=np.shape(c))
    return np.where(b == 0, c, c + t * b)          # an exact -0 stays -0


@given(data=rows(), seed=st.integers(0, 2 ** 32 - 1))
def test_sorting_allowed_operands_stays_within_the_bound_and_decided_positions_hold(data, seed):
    c, b = data
    rng = np.random.default_rng(seed)
    vals, perm = _walk(lambda x: lax.sort((x, lax.iota(jnp.int32, x.shape[0])), num_keys=1), [c], [b])
    decided = ~np.isnan(perm.full_bound())
    for _ in range(10):
        x = _allowed(c, b, rng)
        order = np.argsort(x, kind="stable")
        assert _inside(x[order], vals)
        assert (order[decided] == perm.center[decided]).all()


@given(data=rows(3, 10), seed=st.integers(0, 2 ** 32 - 1), k=st.integers(1, 3))
def test_top_k_of_allowed_operands_stays_within_the_bound(data, seed, k):
    c, b = data
    rng = np.random.default_rng(seed)
    vals, idx = _walk(lambda x: lax.top_k(x, k), [c], [b])
    decided = ~np.isnan(idx.full_bound())
    for _ in range(10):
        x = _allowed(c, b, rng)
        order = np.lexsort((np.signbit(x), -x))[:k]     # top_k's total order: +0 before -0
        assert _inside(x[order], vals)
        assert (order[decided] == idx.center[decided]).all()


def _tree(terms, op, rng):
    """A random order and tree of float32 `op`s (each correctly rounded)."""
    items = [F32(t) for t in rng.permutation(np.asarray(terms, F32))]
    while len(items) > 1:
        i = int(rng.integers(len(items) - 1))
        items[i:i + 2] = [F32(op(np.float64(items[i]), np.float64(items[i + 1])))]
    return float(items[0])


@given(data=rows(2, 10), seed=st.integers(0, 2 ** 32 - 1))
def test_every_tree_of_a_float32_cumprod_is_within_the_bound(data, seed):
    c, _ = data
    c = np.where(np.abs(c) < 0.25, c + 1.0, c).astype(F32).astype(np.float64)
    (out,) = _walk(jnp.cumprod, [c], [None])
    rng = np.random.default_rng(seed)
    for m in range(1, len(c) + 1):
        exact = Fraction(1)
        for v in c[:m]:
            exact *= Fraction(float(v))
        assert abs(exact - Fraction(float(out.center[m - 1]))) <= Fraction(float(out.bound[m - 1]))
        for _ in range(5):
            got = _tree(c[:m], lambda a, b: a * b, rng)
            assert abs(got - out.center[m - 1]) <= out.bound[m - 1] * MARGIN


@given(data=rows(2, 10), seed=st.integers(0, 2 ** 32 - 1))
def test_every_order_of_a_float32_scatter_add_is_within_the_bound(data, seed):
    c, b = data
    idx = np.arange(len(c)) % 2
    (out,) = _walk(lambda o, u: o.at[idx].add(u), [np.array([0.5, -0.25]), c], [None, b])
    rng = np.random.default_rng(seed)
    for _ in range(5):
        x = _allowed(c, b, rng).astype(F32)
        u = np.where(np.abs(x - c) <= b, x, c.astype(F32))        # float32 operands inside their sets
        for t in (0, 1):
            terms = [0.5 if t == 0 else -0.25, *u[idx == t]]
            exact = sum(Fraction(float(v)) for v in terms)
            got = _tree(terms, lambda a, b: a + b, rng)
            assert abs(got - out.center[t]) <= out.bound[t] * MARGIN
            assert abs(exact - Fraction(float(out.center[t]))) <= Fraction(float(out.bound[t]))


@given(data=rows(2, 10), seed=st.integers(0, 2 ** 32 - 1))
def test_window_sums_of_exact_operands_in_any_order_are_within_the_bound(data, seed):
    c, _ = data
    (out,) = _walk(lambda x: lax.reduce_window(x, 0.0, lax.add, (3,), (1,), "SAME"), [c], [None])
    rng = np.random.default_rng(seed)
    padded = np.concatenate([[0.0], c, [0.0]])
    for i in range(len(c)):
        w = padded[i:i + 3]
        assert abs(sum(Fraction(float(v)) for v in w) - Fraction(float(out.center[i]))) <= Fraction(float(out.bound[i]))
        got = _tree(w, lambda a, b: a + b, rng)
        assert abs(got - out.center[i]) <= out.bound[i] * MARGIN


@given(data=rows(2, 8), seed=st.integers(0, 2 ** 32 - 1))
def test_functions_of_allowed_operands_are_within_the_bound(data, seed):
    c, b = data
    rng = np.random.default_rng(seed)
    pos = np.abs(c) + 0.5
    outs = _walk(lambda x, y: (jnp.arctan2(x, y + 5.0), lax.lgamma(y), lax.digamma(y), lax.cumlogsumexp(x)),
                 [c, pos], [b, b])
    for _ in range(10):
        x, y = _allowed(c, b, rng), _allowed(pos, b, rng)
        assert _inside(np.arctan2(x, y + 5.0), outs[0])
        assert _inside(sp.gammaln(y), outs[1])
        assert _inside(sp.psi(y), outs[2])
        assert _inside(np.logaddexp.accumulate(x), outs[3])


# -- XLA:CPU on random inputs: every decided element agrees --------------------------------------
IDX = np.array([0, 2, 2, 5, 1])

PROGRAMS = {
    "sort": lambda a, b: jnp.sort(a * b + a, axis=1),
    "argsort": lambda a, b: jnp.argsort(a * b + a, axis=1),
    "sort_multi": lambda a, b: lax.sort((a * b, b * 1.5, a), dimension=0, num_keys=2),
    "top_k": lambda a, b: lax.top_k(a * b + a, 3),
    "reduce_window_sum": lambda a, b: lax.reduce_window(a * b, 0.0, lax.add, (2, 3), (1, 2), "SAME"),
    "reduce_window_max": lambda a, b: lax.reduce_window(a * b, -jnp.inf, lax.max, (2, 2), (1, 1), "VALID"),
    "reduce_window_min": lambda a, b: lax.reduce_window(a * b, jnp.inf, lax.min, (3, 2), (1, 1), "SAME"),
    "cumprod": lambda a, b: (jnp.cumprod(a * b + 1, axis=1), lax.cumprod(a + 1.5, axis=0, reverse=True)),
    "reduce_prod": lambda a, b: jnp.prod(a * b + 1, axis=1),
    "cumlogsumexp": lambda a, b: lax.cumlogsumexp(a * b, axis=1),
    "scatter_add": lambda a, b: a.at[:, IDX].add(b[:, :5] * a[:, :5]),
    "scatter_mul": lambda a, b: a.at[:, IDX].multiply(b[:, :5] * 1.5),
    "scatter_min_max": lambda a, b: (a.at[:, IDX].min(b[:, :5] * a[:, :5]), a.at[:, IDX].max(b[:, :5])),
    "atan2": lambda a, b: jnp.arctan2(a * b, b + 0.5),
    "lgamma_digamma": lambda a, b: (lax.lgamma(jnp.abs(a * b) + 0.1), lax.digamma(jnp.abs(a) + 0.5)),
    "iota": lambda a, b: jnp.arange(6.0) * a,
    "select_and_scatter_add": lambda a, b: jax.vjp(
        lambda v: lax.reduce_window(v, -jnp.inf, lax.max, (2, 2), (2, 2), "VALID"), a * 1.5)[1](b[:2, :3])[0],
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_xla_on_random_inputs_is_judged_agree(name):
    fn = PROGRAMS[name]
    jitted = jax.jit(fn)
    closed = jax.make_jaxpr(fn)(np.zeros((4, 6), F32), np.zeros((4, 6), F32))
    for seed in range(3):
        rng = np.random.default_rng(seed)
        x, y = (rng.standard_normal((4, 6)) * 2).astype(F32), rng.standard_normal((4, 6)).astype(F32)
        res = B.evaluate(closed, [x, y], relaxations=B.platform.default_relaxations("cpu"))
        for out, got in zip(res.outputs, jax.tree.leaves(jitted(x, y))):
            assert isinstance(out, BVal), out
            assert _inside(got, out), (name, seed, np.asarray(got), out.center, out.bound)


def test_a_bfloat16_iota_past_256_is_what_xla_gives():
    fn = lambda x: lax.iota(jnp.bfloat16, 2000) + x  # noqa: E731
    x = np.zeros(2000, jnp.bfloat16)
    (out,) = B.evaluate(jax.make_jaxpr(fn)(x), [x]).outputs
    got = np.asarray(jax.jit(fn)(x)).astype(np.float64)
    assert out.bound is None and (got == out.center).all()


@pytest.mark.parametrize("name", ["sort", "top_k", "cumprod", "scatter_add", "lgamma_digamma"])
def test_conformance_check_holds_these_outputs_to_the_allowed_set(name):
    rng = np.random.default_rng(7)
    x, y = (rng.standard_normal((4, 6)) * 2).astype(F32), rng.standard_normal((4, 6)).astype(F32)
    res = conformance.check(jax.jit(PROGRAMS[name]), x, y, explain=False)
    assert res.ok, res.report()
    assert not any("no bound rule" in line for line in res.bounds), res.bounds
    assert any(o.policy.startswith("allowed set") for o in res.outputs), res.report()


def _logaddexp32(x, y):
    """JAX's logaddexp (jax._src.lax.other) in float32, each operation rounded."""
    x, y = F32(x), F32(y)
    amax = max(x, y)
    delta = F32(x - y)
    if np.isnan(delta):
        return F32(x + y)
    return F32(amax + np.log1p(np.exp(-np.abs(delta), dtype=F32), dtype=F32))


@given(data=rows(2, 10), seed=st.integers(0, 2 ** 32 - 1))
def test_every_tree_of_float32_logaddexp_combines_is_within_the_cumlogsumexp_bound(data, seed):
    c, _ = data
    (out,) = _walk(lax.cumlogsumexp, [c], [None])
    rng = np.random.default_rng(seed)
    for m in range(1, len(c) + 1):
        for _ in range(5):
            got = _tree([-np.inf, *c[:m]], _logaddexp32, rng)      # the reduce_window's -inf init too
            assert abs(got - out.center[m - 1]) <= out.bound[m - 1] * MARGIN


@given(data=rows(4, 10), seed=st.integers(0, 2 ** 32 - 1))
def test_pooling_gradients_of_allowed_operands_agree_where_decided(data, seed):
    c, b = data
    n = len(c) - len(c) % 2
    c, b = c[:n], b[:n]
    src = np.arange(1, n // 2 + 1, dtype=np.float64)
    pool = lambda v: lax.reduce_window(v, -jnp.inf, lax.max, (2,), (2,), "VALID")  # noqa: E731
    (out,) = _walk(lambda a, g: jax.vjp(pool, a)[1](g)[0], [c, src], [b, None])
    rng = np.random.default_rng(seed)
    for _ in range(10):
        x = _allowed(c, b, rng)
        got = np.zeros(n)
        for w in range(n // 2):
            pair = x[2 * w:2 * w + 2]
            pick = 2 * w + (int(pair[1] > pair[0]) if pair[0] != pair[1] else int(rng.integers(2)))
            got[pick] += src[w]
        assert _inside(got, out)
