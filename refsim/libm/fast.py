"""The fast path of refsim's libm: float32 (and narrower) results in a few NumPy passes, the
same bits as the exact path, on every host.

For a float32, float16, bfloat16 or float8 operand, `evaluate` computes y, an approximation
of the exact value v = f(x), in float64 with NumPy's float64 functions (`np.exp`, `np.log`,
`np.tanh`, `np.tan`, ... and IEEE `+ - * / sqrt`), then rounds both ends of the interval
[y (1 - DELTA), y (1 + DELTA)] to the result type. Rounding is monotone: where the two ends
round to the same value, every number between them does, and v and the exact path's float64
value both lie between them (below), so that value is the correctly rounded f(x) and the
exact path's result, bit for bit. Where the ends differ (a rounding boundary lies between
them: about 2**-17 of float32 elements) or y is NaN, the element goes to the exact path
(`refsim.libm.evaluate_exact`).

Why the result does not depend on the host although NumPy's float64 functions do (NumPy
dispatches them to SIMD kernels per CPU -- SVML on AVX-512, its own AVX-512F exp and log --
and to the C library's libm elsewhere, each with its own last bits): the result is never
"y rounded" but the value that every number within DELTA of y rounds to, and v is within
DELTA of y on any host whose float64 function is within HOST_BOUND of v. That assumes far
less than any libm gives: HOST_BOUND = 2**-44 relative is 256-512 ulps of float64, where
glibc, musl, Apple's libm, MSVC's CRT, SVML (NumPy links its 4-ulp variants) and NumPy's own
kernels are within 1-4 ulps (sin: tan's arguments stay below SIN_LIMIT / 2, where every one
of them reduces exactly). Relative accuracy is needed only where v is a normal float64:
below, every candidate rounds to 0 in these types. Special values (exp(-inf) = +0, log(0) =
-inf, log(1) = +0, tan(+-0) = +-0, tanh(+-0) = +-0, infinite results) are C99 Annex F's, which
these libraries return exactly. DELTA = 2**-42 covers HOST_BOUND, the exact path's own error
(about 1 ulp of float64) and the rounding of y (1 +- DELTA) to float64.
tests/refsim/libm/test_fast_path.py checks the fast path against the exact path (random,
special and near-boundary inputs, and a simulated host whose functions are off by up to
HOST_BOUND); tests/refsim/libm/test_accuracy_host_independence.py runs under every NumPy
dispatch target the host has.

Functions (`KERNELS`): exp, exp2, expm1, log, log2, log1p and tanh call NumPy's float64
function; rsqrt is 1 / np.sqrt(x) (two IEEE roundings); logistic is 1 / (1 + np.exp(-x)) (the
exp's error plus two roundings; no cancellation); sin is 2t / (1 + t^2) with t = np.tan(x / 2)
for |x| <= SIN_LIMIT (x / 2 exact; the relative condition of 2t / (1 + t^2) in t is at most
1, so the error is the tan's plus three roundings, and sin's zeros are tan's zeros and poles,
where a libm's tan is accurate relative to its value). Everything else takes the exact path:
cos and tan (no cancellation-free form over NumPy's fast float64 functions), erf and SciPy's
other functions (already SciPy's float64 kernels), and float64 results, which refsim does not
round correctly (its own functions are within about 1 ulp), so no faster evaluation can
reproduce their last bit.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

DELTA = 2.0 ** -42       # relative half-width of the interval whose ends are rounded
HOST_BOUND = 2.0 ** -44  # what the argument assumes of the host's float64 functions
SIN_LIMIT = 2.0 ** 20    # sin's fast path: |x| up to here (a libm's reduction is exact there)
CHUNK = 1 << 15          # elements per block: the float64 scratch stays in cache

_F64 = np.dtype(np.float64)
_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)


def _unary(fn):
    def kernel(x, y, t):
        np.copyto(y, x, casting="unsafe")  # exact: every narrower float is a float64
        fn(y, out=y)

    kernel.__name__ = fn.__name__
    return kernel


def _rsqrt(x, y, t):
    np.copyto(y, x, casting="unsafe")
    np.sqrt(y, out=y)
    np.divide(1.0, y, out=y)


def _logistic(x, y, t):
    np.negative(x, out=y, casting="unsafe")
    np.exp(y, out=y)
    y += 1.0
    np.divide(1.0, y, out=y)


def _sin(x, y, t):
    """sin(x) / 2 = t / (1 + t^2), t = tan(x / 2): the decision doubles it (exactly)."""
    np.multiply(x, 0.5, out=y, dtype=_F64)  # exact (a float32 subnormal halves to a normal double)
    np.tan(y, out=y)
    np.multiply(y, y, out=t)
    t += 1.0
    y /= t
    if not (x.min(initial=0.0) >= -SIN_LIMIT and x.max(initial=0.0) <= SIN_LIMIT):  # NaN: masks too
        return (x > SIN_LIMIT) | (x < -SIN_LIMIT)
    return None


# name -> kernel(x, y, t): x a block of the operand, y and t float64 scratch of its size; the
# kernel leaves its approximation of f(x) / SCALE[name] in y and returns None or a mask of the
# elements it does not cover
KERNELS = {
    "exp": _unary(np.exp), "exp2": _unary(np.exp2), "expm1": _unary(np.expm1),
    "log": _unary(np.log), "log2": _unary(np.log2), "log1p": _unary(np.log1p),
    "tanh": _unary(np.tanh), "rsqrt": _rsqrt, "logistic": _logistic, "sin": _sin,
}
SCALE = {"sin": 2.0}  # powers of two: y * SCALE * (1 +- DELTA) is one rounding


def applies(name: str, operands) -> bool:
    """Whether `evaluate` covers `name` on these operands: one real operand of a float type
    narrower than float64."""
    if name not in KERNELS or len(operands) != 1:
        return False
    dt = np.dtype(operands[0].dtype)
    if dt.kind not in "fV" or dt.itemsize >= 8:
        return False
    try:
        ml_dtypes.finfo(dt)  # float32, float16 and ml_dtypes' floats; not int4 or records
    except (ValueError, TypeError):
        return False
    return True


def decide(y, out, scratch, bad, round_once, scale=1.0):
    """out = scale * y rounded to out's type where both ends of scale * y * (1 +- DELTA) round
    alike; bad marks the others (and NaN, which never compares equal)."""
    up, down = scale * (1.0 + DELTA), scale * (1.0 - DELTA)  # exact: scale is a power of two
    if out.dtype in (_F32, _F16):  # NumPy rounds float64 to these directly, once
        np.multiply(y, up, out=out, casting="unsafe")
        np.multiply(y, down, out=scratch, casting="unsafe")
        np.not_equal(out, scratch, out=bad)
    else:  # bfloat16, float8, float4: through float32 with round-to-odd (one rounding)
        out[...] = round_once(y * up, out.dtype)
        scratch[...] = round_once(y * down, out.dtype)
        np.not_equal(out, scratch, out=bad)
        bad |= np.isnan(y)  # a type without NaN turns it into a number, by its sign


def block(name: str, x, out, y, t, scratch, bad, round_once) -> None:
    """The fast path on one block: out = f(x) rounded to out's type where decided; bad marks
    the elements left to the exact path. y, t (float64), scratch (out's type) are x's size."""
    outside = KERNELS[name](x, y, t)
    decide(y, out, scratch, bad, round_once, SCALE.get(name, 1.0))
    if outside is not None:
        bad |= outside


def undecided(name: str, x: np.ndarray, round_once) -> np.ndarray:
    """The mask of x's elements (1-d) that the fast path leaves to the exact path."""
    n = x.size
    bad = np.empty(n, bool)
    with np.errstate(all="ignore"):
        block(name, x, np.empty(n, x.dtype), np.empty(n), np.empty(n), np.empty(n, x.dtype), bad, round_once)
    return bad


def evaluate(name: str, x: np.ndarray, exact, round_once) -> np.ndarray:
    """`name` on x (see `applies`), correctly rounded to x's type: the fast path on blocks of
    CHUNK elements, `exact(name, values)` (refsim's exact path on a 1-d array) for the
    elements it does not decide."""
    flat = np.ascontiguousarray(x).reshape(-1)
    n = flat.size
    out = np.empty(n, x.dtype)
    m = min(CHUNK, n)
    y, t, scratch, bad = np.empty(m), np.empty(m), np.empty(m, x.dtype), np.empty(m, bool)
    pending = []  # indices of the undecided elements, block by block
    with np.errstate(all="ignore"):
        for lo in range(0, n, CHUNK):
            hi = min(lo + CHUNK, n)
            k = hi - lo
            block(name, flat[lo:hi], out[lo:hi], y[:k], t[:k], scratch[:k], bad[:k], round_once)
            if np.count_nonzero(bad[:k]):  # popcount: cheaper than any() on bools
                pending.append(np.flatnonzero(bad[:k]) + lo)
    if pending:
        idx = np.concatenate(pending)
        out[idx] = exact(name, flat[idx])
    return out.reshape(x.shape)


__all__ = ["CHUNK", "DELTA", "HOST_BOUND", "KERNELS", "SCALE", "SIN_LIMIT", "applies", "block", "decide",
           "evaluate", "undecided"]
