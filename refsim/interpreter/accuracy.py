"""refsim's accuracy contract for float primitives: how far each rule may be from the exact result.

Data movement, integer arithmetic, comparisons, min/max, and +, -, *, / and sqrt on floats
are exact: refsim rounds each IEEE operation once, as XLA:CPU does, so they agree bit for
bit (one caveat: XLA:CPU may contract `a * b + c` into a fused multiply-add, which rounds
once instead of twice; refsim never fuses, so such chains can differ by 1 ulp).

Transcendental and special functions are refsim's own (`refsim.libm`): evaluated in float64
with IEEE operations only (double-double where the leading terms need it), so the results
are the same bits on every host -- not NumPy's ufuncs, which NumPy dispatches to different
SIMD kernels per CPU (AVX2, AVX-512 / SVML, NEON) with different last bits. float32 and
narrower operands are widened to float64 and rounded once; erf, erfc, erf_inv, lgamma and
digamma are SciPy's scalar kernels, evaluated in float64. XLA:CPU is not correctly rounded
(Eigen / XLA's own polynomial approximations), so refsim and XLA:CPU differ by a few ulps.
`ACCURACY[name]` states, per primitive, the largest distance measured (`python -m
bench.accuracy`, 200000 samples per op and dtype over the op's domain, seed 0, jax 0.10.2
and 0.12.0, x86-64 with AVX-512):

- `refsim_vs_correct`: refsim float32 from the correctly rounded result (the long double or
  float64 result rounded once);
- `xla_vs_correct`: XLA:CPU float32 from the correctly rounded result;
- `refsim_vs_xla_f32` / `refsim_vs_xla_f64`: refsim from XLA:CPU, the bound a comparison of a
  program that uses the op must allow (`ulp_bound(name, dtype)`), composed through the
  program where an op's result feeds another;
- `refsim_vs_correct_f64`: refsim float64 from the exact result (NumPy's 80-bit long double
  result), in fractions of an ulp (0.5 is correctly rounded); None where no wider reference
  exists (SciPy's functions).

The conformance comparator uses `ulp_bound` for programs that use these primitives
(`conformance.compare(..., ulp=k)`); everything else is compared bit for bit.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import scipy.special as _sp


@dataclasses.dataclass(frozen=True)
class OpAccuracy:
    """Measured ulp distances of one primitive (see the module docstring) and its input domains."""

    domains: tuple            # one (lo, hi) per operand: where the op is measured
    refsim_vs_correct: int    # float32
    xla_vs_correct: int       # float32
    refsim_vs_xla_f32: int
    refsim_vs_xla_f64: int
    note: str = ""
    mixed: int | None = None  # where the ulp figures are meaningless (zeros of the function): the mixed bound
    refsim_vs_correct_f64: float | None = None  # float64, fractions of an ulp (None: not measured)


_BELOW_ONE = float(np.nextafter(np.float32(1), np.float32(0)))  # the largest float32 below 1


def _logistic(x):
    return 1 / (1 + np.exp(-x))


def _rsqrt(x):
    return 1 / np.sqrt(x)


# NumPy / SciPy functions whose once-rounded result is the correctly rounded one (to within the
# rare double-rounding case): the references `bench.accuracy` measures against, called on long
# double operands (x86-64: 80-bit, not CPU-dispatched) where the op has a long double loop,
# else on float64 ones. Independent of refsim.libm, which the rules use.
REFERENCE_F64 = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log1p": np.log1p,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh,
    "atanh": np.arctanh, "sqrt": np.sqrt, "rsqrt": _rsqrt, "cbrt": np.cbrt, "logistic": _logistic,
    "erf": _sp.erf, "erfc": _sp.erfc, "erf_inv": _sp.erfinv, "lgamma": _sp.gammaln, "digamma": _sp.psi,
    "atan2": np.arctan2, "pow": np.power,
}

_R = 88.0  # exp overflows float32 just above 88.7

# From `python -m bench.accuracy` (200000 samples per op and dtype, seed 0), the larger of the
# figures measured on jax 0.10.2 and jax 0.12.0. Results XLA:CPU flushes to zero (subnormal
# results: XLA:CPU runs with flush-to-zero, refsim keeps them) are left out of the ulp figures;
# `mixed` figures are |a - b| / (eps * max(1, |b|)), the meaningful measure near a zero of the
# function (lgamma at 1 and 2, digamma at 1.46...), where any absolute error is many ulps.
# Columns: refsim_vs_correct (f32), xla_vs_correct (f32), refsim_vs_xla_f32, refsim_vs_xla_f64;
# refsim_vs_correct_f64 is the largest over that run and `--f64-samples` 2M with seeds 0, 1, 2,
# rounded up to the next hundredth.
ACCURACY: dict[str, OpAccuracy] = {
    "exp": OpAccuracy(((-_R, _R),), 0, 1, 1, 1, "subnormal results: XLA:CPU flushes to 0",
                      refsim_vs_correct_f64=0.51),
    "exp2": OpAccuracy(((-126.0, 127.0),), 0, 63, 63, 76, "XLA:CPU computes exp2 through exp",
                       refsim_vs_correct_f64=0.51),
    "expm1": OpAccuracy(((-_R, _R),), 0, 5, 5, 3, "jax 0.10.2's XLA:CPU; 0.12.0 is within 1",
                        refsim_vs_correct_f64=0.57),
    "log": OpAccuracy(((1e-30, 1e30),), 0, 1, 1, 1, refsim_vs_correct_f64=0.51),
    "log1p": OpAccuracy(((-0.999, 1e30),), 0, 2, 2, 100, "float64: jax 0.10.2's XLA:CPU; 0.12.0 is within 2",
                        refsim_vs_correct_f64=0.51),
    "sin": OpAccuracy(((-1e4, 1e4),), 0, 1, 1, 1, refsim_vs_correct_f64=0.74),
    "cos": OpAccuracy(((-1e4, 1e4),), 0, 1, 1, 1, refsim_vs_correct_f64=0.72),
    "tan": OpAccuracy(((-1e4, 1e4),), 0, 1, 1, 1, refsim_vs_correct_f64=0.84),
    "asin": OpAccuracy(((-1.0, 1.0),), 0, 2, 2, 2, refsim_vs_correct_f64=0.51),
    "acos": OpAccuracy(((-1.0, 1.0),), 0, 2, 2, 1, refsim_vs_correct_f64=0.51),
    "atan": OpAccuracy(((-1e30, 1e30),), 0, 2, 2, 3, refsim_vs_correct_f64=0.51),
    "sinh": OpAccuracy(((-_R, _R),), 0, 24, 24, 17, refsim_vs_correct_f64=0.59),
    "cosh": OpAccuracy(((-_R, _R),), 0, 24, 24, 17, refsim_vs_correct_f64=0.51),
    "tanh": OpAccuracy(((-20.0, 20.0),), 0, 4, 4, 7, refsim_vs_correct_f64=0.58),
    "asinh": OpAccuracy(((-1e30, 1e30),), 0, 2, 2, 2, refsim_vs_correct_f64=0.51),
    "acosh": OpAccuracy(((1.0, 1e30),), 0, 3, 3, 3, refsim_vs_correct_f64=0.51),
    "atanh": OpAccuracy(((-0.999, 0.999),), 0, 2, 2, 96, "float64: jax 0.10.2's XLA:CPU; 0.12.0 is within 2",
                        refsim_vs_correct_f64=0.51),
    "sqrt": OpAccuracy(((0.0, 1e30),), 0, 0, 0, 0, "correctly rounded on both", refsim_vs_correct_f64=0.50),
    "rsqrt": OpAccuracy(((1e-30, 1e30),), 0, 2, 2, 1, refsim_vs_correct_f64=0.51),
    "cbrt": OpAccuracy(((-1e30, 1e30),), 0, 1, 1, 3, refsim_vs_correct_f64=0.51),
    "logistic": OpAccuracy(((-_R, _R),), 0, 2, 2, 2, "subnormal results: XLA:CPU flushes to 0",
                           refsim_vs_correct_f64=0.51),
    "erf": OpAccuracy(((-10.0, 10.0),), 0, 4, 4, 2),
    "erfc": OpAccuracy(((-10.0, 10.0),), 0, 59, 59, 6,
                       "the 59 ulp are on results near underflow (mixed: 1); subnormals flushed"),
    "erf_inv": OpAccuracy(((-_BELOW_ONE, _BELOW_ONE),), 0, 65, 65, 498928,
                          "the large figures are in the tails |x| > 0.999 (jax.random.normal draws 0.1% of its\n"
                          "samples there), which the log-uniform draw rarely reaches: float32 measured on every\n"
                          "float32 there, float64 on 2.8M points 1 - 10**-u, u in [3, 15.9]; within |x| < 0.999\n"
                          "XLA:CPU is 11 ulp (float32) from refsim"),
    "lgamma": OpAccuracy(((1e-3, 1e3),), 0, 1320521, 1320521, 1179648,
                         "near the zeros at 1 and 2 only a mixed bound holds: 20 (float32), 17 (float64); "
                         "jax 0.12.0's float32 lgamma is within 2 ulp", mixed=20),
    "digamma": OpAccuracy(((1e-3, 1e3),), 0, 139393, 139393, 343493,
                          "near the zero at 1.4616... only a mixed bound holds: 9 (float32), 9 (float64)",
                          mixed=10),
    "atan2": OpAccuracy(((-1e3, 1e3), (-1e3, 1e3)), 0, 1, 1, 1, refsim_vs_correct_f64=0.51),
    "pow": OpAccuracy(((1e-3, 1e3), (-10.0, 10.0)), 0, 1, 1, 1, refsim_vs_correct_f64=0.51),
}
OPS = ACCURACY


def ulp_bound(primitive: str, dtype=np.float32) -> int:
    """The most ulps refsim's result of `primitive` may differ from XLA:CPU's (0: bit-exact).

    For lgamma and digamma this pure-ulp figure is huge (near their zeros); compare programs
    using them with `mixed_bound` as a relative-to-max(1, |x|) tolerance instead.
    A primitive not in the table is exact (0)."""
    acc = ACCURACY.get(primitive)
    if acc is None:
        return 0
    # a figure measured as 0 still allows 1: XLA:CPU's kernels may round one case differently
    bound = acc.refsim_vs_xla_f64 if np.dtype(dtype) == np.float64 else acc.refsim_vs_xla_f32
    return max(bound, 1) if primitive != "sqrt" else 0


def mixed_bound(primitive: str) -> int | None:
    """For functions with zeros inside their domain: max |refsim - xla| / (eps * max(1, |xla|))."""
    acc = ACCURACY.get(primitive)
    return None if acc is None else acc.mixed


_LAX_NAMES = {"asin": "asin", "acos": "acos", "atan": "atan", "erf_inv": "erf_inv", "pow": "pow"}


def lax_function(name: str):
    """The public `jax.lax` function that binds primitive `name` (jax.lax.exp for "exp", ...)."""
    import jax

    return getattr(jax.lax, _LAX_NAMES.get(name, name))
