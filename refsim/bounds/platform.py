"""What the platform under test may do beyond IEEE's correctly rounded result: the accuracy
of its transcendental functions, and its declared relaxations.

**Transcendentals.** StableHLO leaves the accuracy of exp, log, tanh, ... to the
implementation, and XLA documents none for XLA:CPU. The figures here are the largest
distance from the correctly rounded result measured on XLA:CPU by ``python -m bench.accuracy``
(200000 samples per op and dtype over the op's domain, seed 0, jax 0.10.2 and 0.12.0, x86-64:
`refsim.interpreter.accuracy.ACCURACY`, column ``xla_vs_correct`` for float32; float64 from
``refsim_vs_xla_f64`` plus refsim's own one), doubled plus one as a margin for inputs the
sample missed: ``ulps = 2 * measured + 1``, and the result may be that many ulps of the
compute type from the exact value, plus half an ulp of a narrower output type (bfloat16 and
float16 are computed in float32 and rounded). Outside the measured domain of the
trigonometric functions (|x| > 1e4: range reduction) the result is undecidable.

**Relaxations.** What an implementation does beyond the spec is a named relaxation that
widens the bound of the operations it covers; `RELAXATIONS` states each with its source.
A report names every relaxation that widened some element's bound and which elements agree
only because of it (`conformance.verdict.allowed`).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from refsim.interpreter.accuracy import ACCURACY


@dataclasses.dataclass(frozen=True)
class Relaxation:
    name: str
    covers: str
    source: str
    documented: bool


RELAXATIONS = {
    "xla-cpu-ftz": Relaxation(
        "xla-cpu-ftz",
        "every float operation: a result or operand below float32's smallest normal (float64's for "
        "float64) may be read or written as zero (denormals-are-zero / flush-to-zero)",
        "observed on XLA:CPU, jax 0.10.2 and 0.12 (conformance.verdict.platform_models, model "
        "xla-cpu-arith: jax.jit(lambda a: a * 2**30)(np.float32(1e-40)) gives 0)", documented=False),
    "xla-cpu-fma": Relaxation(
        "xla-cpu-fma",
        "a float32 / float64 multiplication: its product may reach a following addition unrounded (contracted "
        "into a fused multiply-add, one rounding instead of two); only a product of exact operands is widened, "
        "by its own rounding error, since any other product's bound already holds the unrounded product",
        "observed on XLA:CPU, jax 0.10.2 (x86-64): jax.jit(lambda x, y, z: x * y + z) on 100000 random float32 "
        "triples equals fl(x*y + z) for all of them and fl(fl(x*y) + z) for 77%; LLVM's floating-point "
        "contraction, not in XLA's documentation (bfloat16 operations round per op: no contraction across them)",
        documented=False),
    "xla-reciprocal-division": Relaxation(
        "xla-reciprocal-division",
        "a division whose divisor is a constant or a broadcast value: computed as a multiplication by "
        "the divisor's rounded reciprocal (one more rounding: u of the result)",
        "XLA's algebraic simplifier, xla/hlo/transforms/simplifiers/algebraic_simplifier.cc "
        "('A / Const => A * (1 / Const)', 'A / Broadcast(B) => A * Broadcast((1 / B))'); not in XLA's "
        "documentation (StableHLO's divide is IEEE division). Plain JAX, XLA:CPU: pmean of int32 9 over "
        "5 devices gives 1.8000001 (9 * fl(0.2)), where 9 / 5 rounds to 1.8", documented=False),
    "xla-division-reassociation": Relaxation(
        "xla-division-reassociation",
        "a division one of whose operands is itself a division: computed as one division by (or of) a "
        "product, (A / B) / C as A / (B * C) and A / (B / C) as (A * C) / B (the inner quotient is never "
        "rounded, the product is: u of the result twice, and half an ulp for the final quotient)",
        "XLA's algebraic simplifier, xla/hlo/transforms/simplifiers/algebraic_simplifier.cc ('(A / B) / C => "
        "A / (B * C)', 'A / (B / C) => (A * C) / B'); not in XLA's documentation. Plain JAX, XLA:CPU, jax "
        "0.10.2 and 0.12: jax.jit(lambda a, d: a / d / d)(10., 11.) is 0.082644626 (10 / fl(11 * 11)), where "
        "fl(fl(10 / 11) / 11) is 0.082644634; met by the 0.12 custom_vjp hunt (the pullback of a / (|round(a)| + 1))",
        documented=False),
    "xla-scatter-add-folding": Relaxation(
        "xla-scatter-add-folding",
        "a sum one of whose addends is a scatter-add into zeros: computed as the scatter-add into the "
        "other addend, each update added to the running sum in turn (the sum's 1 + k terms of an element "
        "reached by k updates in any order: Higham's bound for them, not one rounding)",
        "XLA's algebraic simplifier ('A + Scatter(Zeros, I, U) => Scatter(A, I, U)'), seen in the "
        "compiled module of a gather's pullback beside other cotangents; not in XLA's documentation. "
        "Plain JAX, XLA:CPU, jax 0.10.2: the pullback of (a0, erf(a0[[0, -1, -3]]), pad(a0, (1, 2), "
        "'wrap')) at a0 = [-3.5, 3.5, 4.0] gives -10.500011444 for element 0 where the jaxpr's order "
        "gives -10.500010490 (issue 39's seed sweep, seed 24)", documented=False),
    "xla-rsqrt-division": Relaxation(
        "xla-rsqrt-division",
        "a division by a square root: computed as a multiplication by rsqrt (rsqrt's platform accuracy "
        "instead of sqrt's correct rounding)",
        "XLA's algebraic simplifier ('A / Sqrt(B) => A * Rsqrt(B)'; openxla/xla#40844 skips it for f64 "
        "only); not in XLA's documentation", documented=False),
}

#: The relaxations in force by default per platform (all of XLA:CPU's: the report names each
#: one an element needed; pass relaxations=() for the spec alone).
DEFAULT = {"xla-cpu": frozenset(RELAXATIONS), "cpu": frozenset(RELAXATIONS)}


def default_relaxations(platform: str) -> frozenset:
    return DEFAULT.get(platform, frozenset())


#: Trigonometric functions: measured on |x| <= 1e4 only (range reduction beyond).
TRIG_DOMAIN = 1e4


def _measured(op: str, dtype) -> int | None:
    acc = ACCURACY.get(op)
    if acc is None:
        return None
    if np.dtype(dtype) == np.float64:
        return int(acc.refsim_vs_xla_f64) + 1
    return int(acc.xla_vs_correct)


def transcendental_ulps(op: str, dtype) -> int | None:
    """The ulps (of float64 for float64, else of float32) the platform's `op` may be from the
    exact value (module docstring); None where nothing was measured (no bound rule)."""
    m = _measured(op, dtype)
    if m is None:
        return None
    return 2 * m + 1


def table_rows() -> list[tuple[str, int, int, int, int]]:
    """(op, measured float32, allowed float32, measured float64, allowed float64) for docs."""
    rows = []
    for op in sorted(ACCURACY):
        m32, m64 = _measured(op, np.float32), _measured(op, np.float64)
        rows.append((op, m32, 2 * m32 + 1, m64, 2 * m64 + 1))
    return rows
