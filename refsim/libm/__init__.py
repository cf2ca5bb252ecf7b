"""refsim's own libm: transcendental functions that give the same bits on every host.

A reference must not depend on the machine it runs on. NumPy's transcendental ufuncs do:
NumPy dispatches them at run time to SIMD kernels for the host's CPU (AVX2, AVX-512 with
Intel's SVML, NEON, ...), each with its own few-ulp error, so `np.arcsin` on a float32 array
differs between an AVX-512 host and an older one, and again on Arm. The functions here are
written with NumPy's IEEE-754 `+ - * /`, `sqrt` and exact scaling only (correctly rounded on
every host, whatever kernel computes them) on float64 arrays, with double-double arithmetic
where the leading terms need it (`refsim.libm._dd`): Tang's table methods for exp and log,
Cody-Waite / Payne-Hanek reduction and Taylor polynomials for the trigonometric functions,
and the other functions built on those. The tables and constants are computed at import
from Python's `decimal` module. Each float64 result is within about 0.5-1 ulp of the exact
value (figures: refsim/interpreter/accuracy.py).

`evaluate(name, *operands)` is the entry both front ends use (the jaxpr rules in
refsim/interpreter/rules/elementwise.py, and through them the StableHLO ops): operands of a
float type narrower than float64 (float32, float16, bfloat16, float8) are widened exactly to
float64, evaluated there, and rounded **once** to their type, so float32 results are the
correctly rounded ones except where the float64 value falls within ~1 ulp64 of a float32
rounding boundary (about one input in 2**28). bfloat16 / float8 go through float32 with
round-to-odd, which makes the two roundings one. That is `evaluate_exact`; `evaluate` gives
its bits faster for one narrow operand of exp, exp2, expm1, log, log2, log1p, tanh, logistic,
rsqrt and sin (`refsim.libm.fast`: NumPy's float64 function, kept only where the rounding to
the operand's type is the same for every value within 2**-42 of it, so whatever last bits the
host's float64 libm gives; the exact path for the rest, about one element in 2**17).

erf, erfc, erf_inv, lgamma and digamma are SciPy's (`scipy.special`) scalar kernels
evaluated in float64: SciPy does not dispatch on the CPU, so they are the same on every host
running the same SciPy build. Complex operands use NumPy's complex functions (scalar code,
not SIMD-dispatched) in the operand's type, as before.
"""
from __future__ import annotations

import numpy as np
import scipy.special as _sp

from refsim.libm import _dd
from refsim.libm import explog as _e
from refsim.libm import fast as _fast
from refsim.libm import hyper as _h
from refsim.libm import trig as _t


def _rsqrt(x):
    """1 / sqrt(x), the square root and the quotient carried as pairs (~0.5 ulp; the two
    roundings of 1 / np.sqrt(x) are up to 1.5); IEEE results for 0, inf, NaN, x < 0."""
    ok = (x > 0) & (x < np.inf)
    xs = np.where(ok, x, 1.0)
    h, l = _dd.dd_div(np.ones_like(xs), np.zeros_like(xs), *_dd.dd_sqrt(xs, np.zeros_like(xs)))
    return np.where(ok, h + l, 1.0 / np.sqrt(x))


# name (jaxpr primitive) -> float64 function; every one uses only host-independent operations
FUNCTIONS = {
    "exp": _e.exp, "exp2": _e.exp2, "expm1": _e.expm1, "log": _e.log, "log2": _e.log2,
    "log1p": _e.log1p, "pow": _e.pow,
    "sin": _t.sin, "cos": _t.cos, "tan": _t.tan, "asin": _t.asin, "acos": _t.acos,
    "atan": _t.atan, "atan2": _t.atan2,
    "sinh": _h.sinh, "cosh": _h.cosh, "tanh": _h.tanh, "asinh": _h.asinh, "acosh": _h.acosh,
    "atanh": _h.atanh, "logistic": _h.logistic, "cbrt": _h.cbrt, "rsqrt": _rsqrt,
}
# SciPy's scalar (not CPU-dispatched) kernels, called in float64
SCIPY = {
    "erf": _sp.erf, "erfc": _sp.erfc, "erf_inv": _sp.erfinv, "lgamma": _sp.gammaln, "digamma": _sp.psi,
}
NAMES = tuple(FUNCTIONS) + tuple(SCIPY)


def _logistic_complex(z):
    return 1 / (1 + np.exp(-z))


# complex operands: NumPy's complex loops in the operand's type (unchanged behaviour)
_COMPLEX = {
    "exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1, "log2": np.log2,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "rsqrt": lambda z: 1 / np.sqrt(z), "logistic": _logistic_complex,
    "pow": np.power,
}

_CHUNK = 1 << 14
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def _round_to_odd_f32(y: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounded toward zero with the last bit set when inexact: a second
    rounding to any type with fewer bits then equals one rounding of y."""
    t = y.astype(_F32)
    back = t.astype(_F64)
    over = np.abs(back) > np.abs(y)
    t = np.where(over, np.nextafter(t, np.float32(0)), t)
    inexact = (t.astype(_F64) != y) & ~np.isnan(y)
    bits = t.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(_F32)


def round_once(y: np.ndarray, dtype) -> np.ndarray:
    """The float64 values y rounded once (to nearest, ties to even) to the float `dtype`."""
    dtype = np.dtype(dtype)
    if dtype == _F64:
        return y
    with np.errstate(over="ignore"):  # overflow to inf is the IEEE result
        if dtype in (_F32, np.dtype(np.float16)):
            return y.astype(dtype)  # NumPy converts float64 to these directly
        return _round_to_odd_f32(y).astype(dtype)  # ml_dtypes would go through float32 (twice)


def evaluate_exact(name: str, *operands: np.ndarray) -> np.ndarray:
    """`name` (a jaxpr primitive name in NAMES) on same-shaped or broadcastable operands of
    the first operand's float type: computed in float64 with refsim's own functions (SciPy's
    for SCIPY), rounded once to that type. Complex operands: NumPy's complex function in
    their type. The exact path: `evaluate` gives the same bits, faster where it can."""
    xs = [np.asarray(x) for x in operands]
    dtype = xs[0].dtype
    with np.errstate(all="ignore"):
        if np.issubdtype(dtype, np.complexfloating):
            return np.asarray(_COMPLEX[name](*(x.astype(dtype) for x in xs)))
        shape = np.broadcast_shapes(*(x.shape for x in xs))
        wide = [np.broadcast_to(x, shape).astype(_F64).reshape(-1) for x in xs]  # 1-d, flat
        fn = FUNCTIONS.get(name) or SCIPY[name]
        out = np.empty(wide[0].shape, _F64)
        for lo in range(0, out.size, _CHUNK):  # blocks that stay in cache through the chain
            out[lo:lo + _CHUNK] = fn(*(w[lo:lo + _CHUNK] for w in wide))
        return round_once(out.reshape(shape), dtype)


def evaluate(name: str, *operands: np.ndarray) -> np.ndarray:
    """`evaluate_exact(name, *operands)`, bit for bit: for one float32 / float16 / bfloat16 /
    float8 operand of a function in `fast.KERNELS`, through the fast path (NumPy's float64
    function, kept only where its rounding to the operand's type is decided whatever the
    host's last bits; refsim/libm/fast.py), else the exact path."""
    xs = [np.asarray(x) for x in operands]
    if _fast.applies(name, xs):
        return _fast.evaluate(name, xs[0], evaluate_exact, round_once)
    return evaluate_exact(name, *xs)


__all__ = ["FUNCTIONS", "NAMES", "SCIPY", "evaluate", "evaluate_exact", "round_once"]
