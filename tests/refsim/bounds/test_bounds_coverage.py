"""refsim.bounds.unruled_primitives: which equations of a jaxpr the bound walk has no rule for."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import refsim.bounds as B
from refsim.bounds import values as V

X = np.linspace(-1, 1, 8).astype(np.float32)


def _unruled(fn, *args):
    return B.unruled_primitives(jax.make_jaxpr(fn)(*args))


def test_a_program_of_ruled_primitives_has_none():
    assert _unruled(lambda x: jnp.sort(jnp.cumprod(jnp.tanh(x) * 2)) @ x, X) == {}


def test_complex_values_and_their_primitives_are_named_and_counted():
    got = _unruled(lambda x: jnp.fft.fft(x).real + 1, X)
    assert got["complex values"] >= 1 and got["fft"] == 1 and got["real"] == 1
    assert "add" not in got                       # the float add after `real` has a rule


def test_integer_primitives_without_a_bound_rule_are_covered_by_the_integer_fallback():
    ints = np.arange(8, dtype=np.int32)
    assert B.BOUND_RULES.get("population_count") is None
    assert _unruled(lambda i: lax.population_count(i) + 1, ints) == {}


def test_sub_jaxprs_are_read():
    def f(x):
        return lax.cond(x[0] > 0, lambda v: jnp.fft.fft(v).real, lambda v: v, x)

    got = _unruled(jax.jit(f), X)
    assert got.get("fft") == 1 and got.get("real") == 1


def test_the_static_list_matches_the_walk():
    # what the walk makes Unknown is what the static reading names, and nothing it covers is
    fn = lambda x: (jnp.fft.fft(x).real, jnp.cumprod(x))  # noqa: E731
    closed = jax.make_jaxpr(fn)(X)
    res = B.evaluate(closed, [X])
    assert isinstance(res.outputs[0], V.Unknown) and {"fft", "real"} <= res.outputs[0].reasons
    assert isinstance(res.outputs[1], V.BVal)
    assert set(B.unruled_primitives(closed)) == set(res.outputs[0].reasons)


def test_a_complex_result_of_a_ruled_primitive_is_unknown_not_exact():
    # a float converted to complex and multiplied by itself: no literal makes it Unknown on the way
    fn = lambda x: x.astype(jnp.complex64) * x.astype(jnp.complex64)  # noqa: E731
    res = B.evaluate(jax.make_jaxpr(fn)(X), [X])
    assert isinstance(res.outputs[0], V.Unknown) and "complex values" in res.outputs[0].reasons


def test_inexact_dependence_follows_each_output_back_to_float_or_complex_values():
    from refsim.bounds.coverage import inexact_dependence

    ints = np.arange(8, dtype=np.int32)

    def f(x, i):
        k = jnp.argmax(x * 2)          # decided by floats
        j = i * 3 + 1                  # integers only, beside floats
        b = x > 0                      # a comparison of floats
        return k, j, b, x + 1

    assert inexact_dependence(jax.make_jaxpr(f)(X, ints)) == [True, False, True, True]

    def loop(x, n):                    # an integer counter whose trip count turns on a float
        def cond(s):
            return (s[0] < n) & (s[1] > 1e-3)

        def body(s):
            return s[0] + 1, s[1] * 0.5

        return lax.while_loop(cond, body, (0, x))[0], n + 1

    assert inexact_dependence(jax.make_jaxpr(loop)(np.float32(1.0), np.int32(50))) == [True, False]
    assert inexact_dependence(jax.make_jaxpr(lambda i: lax.population_count(i) + 1)(ints)) == [False]
