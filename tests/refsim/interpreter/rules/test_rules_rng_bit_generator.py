"""rng_bit_generator and the rbg / unsafe_rbg PRNG impls: refsim's bits vs XLA:CPU's (jax.jit)."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import refsim
from refsim.interpreter.rules.rng_bit_generator import philox4x32, rng_bit_generator

ALGS = ("RNG_DEFAULT", "RNG_PHILOX", "RNG_THREE_FRY")
SHAPES = [(), (1,), (3,), (5, 3), (4, 7), (3, 5, 2)]
DTYPES = [np.uint8, np.uint16, np.uint32]  # uint64 needs x64: see test_uint64_x64


def _jax_rbg(key, shape, dtype, alg):
    fn = jax.jit(lambda k: jax.lax.rng_bit_generator(
        k, shape, dtype=dtype, algorithm=getattr(jax.lax.RandomAlgorithm, alg)))
    new, bits = fn(key)
    return np.asarray(new), np.asarray(bits)


def test_philox_known_answer():
    # Random123's published known-answer vector for Philox-4x32-10 (kat_vectors):
    # counter = key = 0 -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8.
    z = np.zeros((), np.uint32)
    out = philox4x32(z, z, z, z, z, z)
    assert [int(w) for w in out] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


@pytest.mark.parametrize("alg", ALGS)
def test_bits_and_state_match_xla_cpu(alg):
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        for dt in DTYPES:
            key = rng.integers(0, 2**32, size=4, dtype=np.uint64).astype(np.uint32)
            if alg != "RNG_THREE_FRY":  # the Philox counter's low word carries into the high
                key[2:] = [0xFFFFFFF0, 0xFFFFFFFF]
            want_key, want = _jax_rbg(key, shape, dt, alg)
            got_key, got = rng_bit_generator(key, shape, dt, alg)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want, err_msg=f"{alg} {shape} {dt}")
            np.testing.assert_array_equal(got_key, want_key)


def test_uint64_x64():
    with jax.enable_x64(True) if hasattr(jax, "enable_x64") else jax.experimental.enable_x64():
        for alg in ALGS:
            for shape in [(3,), (2, 5)]:
                key = np.array([7, 8, 9, 10], np.uint32)
                want_key, want = _jax_rbg(key, shape, np.uint64, alg)
                got_key, got = rng_bit_generator(key, shape, np.uint64, alg)
                np.testing.assert_array_equal(got, want)
                np.testing.assert_array_equal(got_key, want_key)


def test_lax_rng_bit_generator_rule_in_jit():
    f = lambda k: jax.lax.rng_bit_generator(k, (3, 5), dtype=jnp.uint32)
    key = jnp.arange(4, dtype=jnp.uint32)
    for w, g in zip(jax.jit(f)(key), refsim.jit(f)(key)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def _same(f, *args):
    want, got = jax.jit(f)(*args), refsim.jit(f)(*args)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_rbg_impls_match_jax(impl):
    key = lambda s=3: jax.random.key(s, impl=impl)
    _same(lambda: jax.random.bits(key(), (5, 3)))
    _same(lambda: jax.random.bits(key(), (4, 7), jnp.uint8))
    _same(lambda s: jax.random.uniform(jax.random.key(s, impl=impl), (4, 4)), 7)
    _same(lambda: jax.random.key_data(jax.random.split(key(1), (2, 3))))
    _same(lambda: jax.random.bits(jax.random.split(key(1))[1], (6,)))
    _same(lambda: jax.random.key_data(jax.random.fold_in(key(1), 17)))
    _same(lambda: jax.random.key_data(
        jax.vmap(jax.random.fold_in, (None, 0))(key(1), jnp.arange(3))))
    _same(lambda: jax.vmap(lambda k: jax.random.bits(k, (2,)))(jax.random.split(key(2), 3)))


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_rbg_inside_shard_map_per_device_keys(impl):
    mesh = jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))

    def per_device_keys(k):
        body = lambda k: jax.random.bits(k[0], (3,))[None]
        return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(k)

    def fold_axis_index():
        body = lambda: jax.random.uniform(
            jax.random.fold_in(jax.random.key(0, impl=impl), jax.lax.axis_index("x")), (1, 3))
        return jax.shard_map(body, mesh=mesh, in_specs=(), out_specs=P("x"))()

    _same(per_device_keys, jax.random.split(jax.random.key(5, impl=impl), 2))
    _same(fold_axis_index)
    rows = np.asarray(refsim.jit(fold_axis_index)())
    assert not np.array_equal(rows[0], rows[1])  # each device drew from its own key
