"""Small programs that, together, make JAX emit every StableHLO op family it lowers to.

The corpus and the examples exercise collectives and the ops of realistic models; this
catalogue adds one program per remaining lax family (sorting, scatter, windows and their
gradients, convolution, FFT, linear algebra, random bits, bit manipulation, special
functions), so `conformance.debug.explain.coverage` sees what JAX lowers and what XLA:CPU's passes
turn it into. Each entry is (name, function, arguments); the functions run under `jax.jit`
on one device, or sharded over the 8 devices where the partitioner's output is the point.
"""
from __future__ import annotations

import numpy as np

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.


def _f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _i32(*shape, lo=-5, hi=6, seed=0):
    return np.random.default_rng(seed).integers(lo, hi, shape).astype(np.int32)


def programs() -> list:
    """[(name, fn, args)] of the catalogue (built on call: it imports JAX)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    x, y = _f32(4, 6), _f32(4, 6, seed=1)
    v = _f32(16)
    img = _f32(2, 8, 8, 3)
    ker = _f32(3, 3, 3, 4, seed=2)
    spd = (lambda a: a @ a.T + 4 * np.eye(4, dtype=np.float32))(_f32(4, 4, seed=3))
    idx = np.array([[0], [2], [2], [5]], np.int32)

    def maxpool(a):
        return lax.reduce_window(a, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    def conv(a, k):
        return lax.conv_general_dilated(a, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def scatter_add(a, i, u):
        return a.at[i[:, 0]].add(u)

    out = [
        ("elementwise_float", lambda a, b: [jnp.sin(a), jnp.cos(a), jnp.tan(a), jnp.exp(a), jnp.expm1(a),
                                            jnp.log1p(jnp.abs(a)), jnp.log(jnp.abs(a) + 1), jnp.sqrt(jnp.abs(a)),
                                            lax.rsqrt(jnp.abs(a) + 1), jnp.cbrt(a), jnp.tanh(a),
                                            jax.nn.sigmoid(a), jnp.arctan2(a, b), a ** b, jnp.round(a),
                                            jnp.floor(a), jnp.ceil(a), jnp.sign(a), jnp.isfinite(a),
                                            jnp.fmod(a, b), jnp.maximum(a, b), jnp.minimum(a, b),
                                            jnp.clip(a, -0.5, 0.5), jnp.nextafter(a, b),
                                            lax.reduce_precision(a, 5, 10), jnp.isinf(a), jnp.isnan(a)], (x, y)),
        ("special_functions", lambda a: [jax.scipy.special.erf(a), jax.scipy.special.erfc(a),
                                         jax.scipy.special.erfinv(jnp.tanh(a)), jax.scipy.special.gammaln(
                                             jnp.abs(a) + 1), jax.scipy.special.digamma(jnp.abs(a) + 1),
                                         jnp.arcsin(jnp.tanh(a)), jnp.arccos(jnp.tanh(a)), jnp.arctan(a),
                                         jnp.sinh(a), jnp.cosh(a), jnp.arcsinh(a), jnp.arccosh(jnp.abs(a) + 1),
                                         jnp.arctanh(jnp.tanh(a) * 0.5), jax.scipy.special.i1e(a),
                                         jax.scipy.special.gammainc(jnp.abs(a) + 1, jnp.abs(a)),
                                         jax.scipy.special.zeta(jnp.abs(a) + 2, 1.0 + 0 * a)], (x,)),
        ("elementwise_int", lambda a, b: [a + b, a * b, a // (jnp.abs(b) + 1), a % (jnp.abs(b) + 1), a & b, a | b,
                                          a ^ b, ~a, a << 2, a >> 1, lax.shift_right_logical(a, 1),
                                          lax.population_count(a), lax.clz(a), jnp.abs(a), -a,
                                          a.astype(jnp.float32), lax.bitcast_convert_type(a, jnp.float32),
                                          jnp.maximum(a, b), a < b, a == b], (_i32(4, 6), _i32(4, 6, seed=1))),
        ("complex", lambda a, b: [jnp.abs(lax.complex(a, b)), jnp.real(lax.complex(a, b) * lax.complex(b, 2 * a + 1)),
                                  jnp.imag(jnp.exp(lax.complex(a, b)))], (x, y)),
        ("structural", lambda a: [a.T, a.reshape(6, 4), a[1:3, ::2], jnp.concatenate([a, a], 0), jnp.pad(a, 1),
                                  jnp.flip(a, 1), jnp.broadcast_to(a[:, :1], (4, 6)), lax.dynamic_slice(a, (1, 2), (2, 2)),
                                  lax.dynamic_update_slice(a, a[:2, :2] * 2, (2, 3)), jnp.arange(6) * 2,
                                  jnp.take(a, jnp.array([3, 0, 1]), axis=1), jnp.where(a > 0, a, 0.0)], (x,)),
        ("reductions", lambda a, b: [a.sum(0), a.prod(1), a.max(0), a.min(1), jnp.argmax(a, 1), jnp.argmin(a, 0),
                                     (a > 0).all(1), (a > 0).any(0), b.sum(), jnp.bitwise_xor.reduce(b, axis=0),
                                     jnp.bitwise_and.reduce(b, axis=1), jnp.bitwise_or.reduce(b, axis=0)],
         (x, _i32(4, 6))),
        ("cumulative", lambda a: [jnp.cumsum(a, 0), jnp.cumprod(a, 1), lax.cummax(a, 0), lax.cummin(a, 1),
                                  lax.cumlogsumexp(a, 1)], (x,)),
        ("sort", lambda a, b: [jnp.sort(a, 1), jnp.argsort(a, 0), lax.sort((a, b), num_keys=1)[1],
                               lax.top_k(a, 3)[0], lax.top_k(a, 2)[1], jnp.sort(a.ravel())[::-1]], (x, y)),
        ("scatter", lambda a, i, u: [scatter_add(a, i, u), a.at[i[:, 0]].set(u), a.at[i[:, 0]].mul(u),
                                     a.at[i[:, 0]].min(u), a.at[i[:, 0]].max(u)],
         (_f32(6, 3), idx, _f32(4, 3, seed=4))),
        ("windows", lambda a: [maxpool(a), lax.reduce_window(a, 0.0, lax.add, (1, 3, 3, 1), (1, 1, 1, 1), "SAME"),
                               jax.grad(lambda t: maxpool(t).sum())(a),
                               jax.grad(lambda t: lax.reduce_window(t, jnp.inf, lax.min, (1, 2, 2, 1),
                                                                    (1, 2, 2, 1), "VALID").sum())(a)], (img,)),
        ("convolution", lambda a, k: [conv(a, k), jax.grad(lambda t: conv(t, k).sum())(a)], (img, ker)),
        ("dot", lambda a, b: [a @ b.T, jnp.einsum("ij,ij->i", a, b), jnp.dot(a[0], b[0]),
                              lax.dot_general(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), (((1,), (1,)), ((), ())),
                                              preferred_element_type=jnp.float32)], (x, y)),
        ("fft", lambda a: [jnp.fft.fft(a).real, jnp.fft.rfft(a).imag, jnp.fft.irfft(jnp.fft.rfft(a), n=16)], (v,)),
        ("linalg", lambda m, b: [jnp.linalg.cholesky(m), jax.scipy.linalg.solve_triangular(jnp.linalg.cholesky(m), b,
                                                                                        lower=True),
                                 jnp.linalg.solve(m, b), jnp.linalg.qr(m)[1], jnp.linalg.eigh(m)[0],
                                 jnp.linalg.svd(m, compute_uv=False), jnp.linalg.det(m), jnp.linalg.inv(m)],
         (spd, _f32(4, 2, seed=5))),
        ("random", lambda k: [jax.random.normal(jax.random.key(k), (5,)), jax.random.uniform(jax.random.key(k), (3,)),
                              jax.random.randint(jax.random.key(k), (4,), 0, 9),
                              jax.random.bits(jax.random.key(k, impl="rbg"), (4,)),
                              lax.rng_bit_generator(jnp.array([1, 2, 3, 4], jnp.uint32) + k.astype(jnp.uint32),
                                                    (3,), dtype=jnp.uint32)[1]], (np.int32(3),)),
        ("control_flow", lambda a: [lax.fori_loop(0, 3, lambda i, c: c * 1.5 + i, a),
                                    lax.cond(a.sum() > 0, lambda t: t + 1, lambda t: t - 1, a),
                                    lax.switch(2, [jnp.sin, jnp.cos, jnp.tanh], a),
                                    lax.scan(lambda c, t: (c + t, c * t), a[0], a)[1],
                                    lax.map(jnp.flip, a), lax.associative_scan(jnp.add, a, axis=1),
                                    lax.optimization_barrier(a) * 2], (x,)),
        ("bfloat16_and_half", lambda a: [(a.astype(jnp.bfloat16) * 3).astype(jnp.float32).sum(),
                                         jnp.exp(a.astype(jnp.float16)), a.astype(jnp.float8_e4m3fn),
                                         jax.nn.softmax(a.astype(jnp.bfloat16), -1)], (x,)),
        ("float64_style_int64", lambda a: [a.astype(jnp.uint8) * 3, (a > 1).astype(jnp.int8),
                                           a.astype(jnp.uint32) >> 3, jnp.int16(7) * a.astype(jnp.int16)], (_i32(8),)),
    ]
    return out
