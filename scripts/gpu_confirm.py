"""Plain-JAX confirmations of the numerics where XLA:GPU may differ from refsim's documented semantics.

`python scripts/gpu_confirm.py` runs each probe below on JAX's default platform and prints what
the platform gives beside the correct answer computed with NumPy (float64 where it matters):
one line per probe, `same` or `DIFFERS`. Each probe is a few lines of plain JAX, so a line of
xfails/cuda.txt can cite it. Runs on CPU too (the baseline).
"""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType

ROWS = []


def probe(name, got, want, note=""):
    got, want = np.asarray(got), np.asarray(want)
    same = got.shape == want.shape and bool(np.all((got == want) | (np.isnan(got) & np.isnan(want)))
                                            & np.all(np.signbit(got) == np.signbit(want)))
    ROWS.append((name, "same" if same else "DIFFERS", got, want, note))


def main() -> int:
    dev = jax.devices()[0]
    print(f"platform {dev.platform} ({dev.device_kind}), jax {jax.__version__}, {len(jax.devices())} device(s)")
    rng = np.random.default_rng(0)

    # float32 matmul at the default precision (TF32 on NVIDIA Ampere+ unless jax_default_matmul_precision)
    a, b = rng.standard_normal((256, 256)).astype(np.float32), rng.standard_normal((256, 256)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    for prec in ("default", "highest"):
        got = np.asarray(jax.jit(lambda x, y: jnp.matmul(x, y, precision=None if prec == "default" else "highest"))(a, b))
        err = np.abs(got - exact).max() / np.abs(exact).max()
        ROWS.append((f"f32 matmul 256x256 precision={prec}: max|err|/max|exact|", f"{err:.2e}", "", "",
                     "float32 rounding alone is ~1e-6; TF32 (10-bit mantissa) ~1e-3"))

    # subnormals: flush-to-zero of inputs and results
    sub = np.float32(1e-40)
    probe("f32 subnormal * 1 (x * y, y traced)", jax.jit(lambda x, y: x * y)(sub, np.float32(1)), sub)
    probe("f32 1e-20 * 1e-20 (subnormal result 1e-40)", jax.jit(lambda x, y: x * y)(np.float32(1e-20), np.float32(1e-20)),
          np.float32(1e-20) * np.float32(1e-20))
    probe("f32 subnormal + subnormal", jax.jit(lambda x, y: x + y)(sub, sub), sub + sub)

    # NaN in max / min (StableHLO maximum/minimum: NaN propagates), elementwise and reduced
    nan = np.float32(np.nan)
    probe("lax.max(nan, 1)", jax.jit(jax.lax.max)(nan, np.float32(1)), nan)
    probe("lax.max(1, nan)", jax.jit(jax.lax.max)(np.float32(1), nan), nan)
    probe("reduce_max([1, nan, 2])", jax.jit(jnp.max)(np.array([1, np.nan, 2], np.float32)), nan)
    probe("lax.max(-0.0, +0.0)", jax.jit(jax.lax.max)(np.float32(-0.0), np.float32(0.0)), np.float32(0.0),
          "IEEE 754-2019 maximum: +0 > -0")
    probe("lax.min(+0.0, -0.0)", jax.jit(jax.lax.min)(np.float32(0.0), np.float32(-0.0)), np.float32(-0.0))

    # fused multiply-add: x*y - x*y is 0 unless a product is fused into the subtraction
    x = np.float32(1 + 2 ** -12)
    probe("x*x - x*x (no FMA contraction)", jax.jit(lambda x, y: x * y - x * y)(x, x), np.float32(0))
    probe("x*x + c rounded twice", jax.jit(lambda x, c: x * x + c)(x, np.float32(-1)),
          np.float32(np.float32(x * x) - np.float32(1)), "an FMA gives the once-rounded value")

    # collectives over a one-device mesh: all-reduce of -0.0 (the StableHLO schedule has no +0 identity)
    mesh = jax.make_mesh((1,), ("x",), devices=jax.devices()[:1], axis_types=(AxisType.Auto,))
    mz = np.full((1, 3), -0.0, np.float32)
    for name, f in (("psum", lambda v: jax.lax.psum(v, "x")),
                    ("psum_scatter", lambda v: jax.lax.psum_scatter(v, "x", tiled=True)),
                    ("pmax", lambda v: jax.lax.pmax(v, "x"))):
        g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=jax.P("x"), out_specs=jax.P("x")))
        probe(f"{name} of -0.0 over one device", g(mz), mz)

    # x + 0 folded to x (XLA's algebraic simplifier): IEEE gives -0.0 + 0.0 = +0.0
    probe("-0.0 + 0.0 (constant 0)", jax.jit(lambda v: v + np.float32(0))(np.float32(-0.0)), np.float32(0.0))
    g = jax.jit(jax.shard_map(lambda v: v + jax.lax.axis_index("x").astype(v.dtype), mesh=mesh,
                              in_specs=jax.P("x"), out_specs=jax.P("x")))
    probe("-0.0 + axis_index over one device", g(mz), np.zeros_like(mz))

    # reduce (jnp.sum) over a size-1 axis of -0.0: StableHLO's reduce intersperses an implementation-defined
    # number of init values (+0), so -0.0 (none) and +0.0 (one or more) both conform; refsim adds one
    probe("sum over a size-1 axis of -0.0 (reduce, init +0)", jax.jit(lambda v: v.sum(axis=0))(np.full((1, 2), -0.0, np.float32)),
          np.zeros(2, np.float32), "either sign conforms; refsim gives +0.0")
    probe("jit_shardings' (a * 2 + a.sum(0, keepdims=True)).T of [[-0.0]]",
          jax.jit(lambda v: (v * 2 + v.sum(axis=0, keepdims=True)).T)(np.full((1, 1), -0.0, np.float32)),
          np.zeros((1, 1), np.float32), "either sign conforms; refsim gives +0.0")

    # bfloat16: a chain of ops rounded once per op (refsim) or once per fusion
    h = np.asarray([1.0, 3.0, 7.0], dtype=jnp.bfloat16)
    got = jax.jit(lambda v: (v / 3 * 3) - v)(h)
    want = ((h / np.asarray(3, h.dtype)).astype(h.dtype) * np.asarray(3, h.dtype)).astype(h.dtype) - h
    probe("bf16 (v / 3 * 3) - v rounded per op", got.astype(np.float32), want.astype(np.float32))

    # integer corner cases
    probe("int32 lax.div(7, 0)", jax.jit(jax.lax.div)(np.int32(7), np.int32(0)), np.int32(-1),
          "XLA's documented division by zero: -1 (all bits set) for signed x / 0")
    probe("int32 INT_MIN // -1", jax.jit(lambda a, b: jax.lax.div(a, b))(np.int32(-2 ** 31), np.int32(-1)),
          np.int32(-2 ** 31))

    w = max(len(r[0]) for r in ROWS)
    for name, verdict, got, want, note in ROWS:
        extra = f"  got {got!r} want {want!r}" if verdict == "DIFFERS" else ""
        print(f"{name:<{w}}  {verdict}{extra}{('  (' + note + ')') if note else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
