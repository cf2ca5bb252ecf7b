"""Properties of the allowed set: every summation order and tree a float32 implementation may
use lies within the bound, and a value one float32 beyond the bound is rejected."""
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, strategies as st

import refsim
import refsim.bounds as B
from conformance.verdict import allowed, compare

F32 = np.float32


def _values(draw, n):
    mags = draw(st.lists(st.floats(-3, 3), min_size=n, max_size=n))
    signs = draw(st.lists(st.sampled_from([-1.0, 1.0]), min_size=n, max_size=n))
    return (np.array(signs) * 10.0 ** np.array(mags)).astype(F32)       # |x| in [1e-3, 1e3]


def _tree_sum(terms, rng):
    """A random order and tree of float32 additions (each one correctly rounded)."""
    items = [F32(t) for t in rng.permutation(terms)]
    while len(items) > 1:
        i = int(rng.integers(len(items) - 1))
        items[i:i + 2] = [F32(items[i] + items[i + 1])]
    return float(items[0])


def _walk(fn, *args, relaxations=()):
    closed = jax.make_jaxpr(fn)(*args)
    return B.evaluate(closed, list(args), relaxations=relaxations).outputs


@given(data=st.data())
def test_every_order_and_tree_of_a_float32_sum_is_within_the_bound(data):
    n = data.draw(st.integers(2, 40), label="n")
    x = _values(data.draw, n)
    (out,) = _walk(jnp.sum, x)
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1), label="seed"))
    for _ in range(20):
        got = _tree_sum(x, rng)
        assert abs(got - float(out.center)) <= float(out.bound_or_zero()), (x, got)
    assert abs(float(np.sum(x, dtype=F32)) - float(out.center)) <= float(out.bound_or_zero())


@given(data=st.data())
def test_every_order_of_a_float32_dot_product_is_within_the_bound(data):
    k = data.draw(st.integers(1, 24), label="k")
    a, b = _values(data.draw, k), _values(data.draw, k)
    (out,) = _walk(lambda u, v: jnp.dot(u, v), a, b)
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1), label="seed"))
    products = (a * b).astype(F32)                                 # each product rounded to float32
    for _ in range(10):
        got = _tree_sum(products, rng)
        assert abs(got - float(out.center)) <= float(out.bound_or_zero())
    acc = F32(0)                                                   # fused multiply-add, one rounding each
    for i in rng.permutation(k):
        acc = F32(np.float64(a[i]) * np.float64(b[i]) + np.float64(acc))
    assert abs(float(acc) - float(out.center)) <= float(out.bound_or_zero())


@given(data=st.data())
def test_a_chain_of_float32_operations_in_any_association_is_within_the_bound(data):
    x, y, z, w = (_values(data.draw, 3) for _ in range(4))

    def prog(x, y, z, w):
        return (x * y + z * w) / (jnp.abs(w) + 1.0) - jnp.sqrt(jnp.abs(x)) * jnp.exp(y / 1000.0)

    (out,) = _walk(prog, x, y, z, w)
    (relaxed,) = _walk(prog, x, y, z, w, relaxations={"xla-cpu-fma"})
    with np.errstate(all="ignore"):
        one = F32(1)
        first = ((x * y) + (z * w)) / (np.abs(w) + one) - np.sqrt(np.abs(x)) * np.exp(y / F32(1000))
        zw = (z * w).astype(F32)
        fused = (x.astype(np.float64) * y + zw).astype(F32) / (np.abs(w) + one) \
            - np.sqrt(np.abs(x)) * np.exp(y / F32(1000))
    # each operation rounded: within the spec's bound; x * y + zw contracted into an FMA: within the
    # bound under the platform relaxation xla-cpu-fma
    assert (np.abs(first.astype(F32).astype(np.float64) - out.center) <= out.full_bound()).all()
    assert (np.abs(fused.astype(F32).astype(np.float64) - relaxed.center) <= relaxed.full_bound()).all()


@given(data=st.data())
def test_one_float32_beyond_the_bound_is_caught_and_the_last_one_inside_is_not(data):
    x = _values(data.draw, data.draw(st.integers(2, 30), label="n"))
    (out,) = _walk(jnp.sum, x)
    c, b = float(out.center), float(out.bound_or_zero())
    mesh = refsim.Mesh((1,), ("x",))
    sh = refsim.NamedSharding(mesh, refsim.P())
    pol = allowed.AllowedSet(n=1, exact={0: np.array(c)}, abs_sum={0: np.array(b)}, fallback_ref={0: np.array(c)},
                             fallback_allowed=1e300)
    ref = refsim.device_put(np.array(F32(c)), sh)
    top = F32(c + b)
    inside = np.nextafter(top, F32(-np.inf)) if float(top) > c + b else top     # the last float32 <= c + b
    beyond = np.nextafter(inside, F32(np.inf))
    if float(inside) >= c - b:
        assert compare.compare(ref, refsim.device_put(np.array(inside), sh), tolerances=pol).ok
    res = compare.compare(ref, refsim.device_put(np.array(beyond), sh), tolerances=pol)
    assert not res.ok and "allowed set" in res.report()
