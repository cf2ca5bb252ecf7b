"""The values of the bound walk: a center and an absolute error bound per element.

`BVal` holds one jaxpr variable: `center`, the value computed in float64 (the exact value for
integers and bools), stacked like refsim's values (``ctx.nm`` leading mesh dims), and `bound`,
float64 and broadcastable to it: every result the specification allows for this variable lies
within `bound` of `center`, elementwise. ``bound is None`` means exact everywhere (0). A NaN
bound marks an element as undecidable: a comparison, branch or rounding to an integer that
decided it was closer than its operands' bounds, so no bound holds. An infinite bound marks an
unbounded allowed set: an operand interval reaching a singularity (a divisor that may be zero,
the log of a value that may be negative, a result that may overflow). `Unknown` stands for a
variable that depends on a primitive without a bound rule; it names those primitives.

The numeric helpers (unit roundoff, growth factors, overflow thresholds) follow
docs/comparison.md ("The allowed set").
"""
from __future__ import annotations

import contextvars
import dataclasses
import functools

import ml_dtypes
import numpy as np

from refsim import compat

#: The floating-point errors a bound computation meets as values (an infinite bound, a NaN
#: marking an undecidable element, a division by zero), not as warnings.
ERR = dict(invalid="ignore", over="ignore", divide="ignore")

_QUIET = contextvars.ContextVar("refsim.bounds.quiet", default=False)


class _Entered:
    """np.errstate(**ERR) where it holds already: nothing to enter (a NumPy errstate costs ~1 us,
    the walk asks for one several times per equation)."""

    __slots__ = ()

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_ENTERED = _Entered()


def quiet():
    """``np.errstate(**ERR)``, or nothing to enter inside `quietly` (which holds it already)."""
    return _ENTERED if _QUIET.get() else np.errstate(**ERR)


class quietly:
    """``with quietly():`` runs a walk under ``np.errstate(**ERR)`` once: `quiet` inside it enters nothing."""

    __slots__ = ("_state", "_token")

    def __enter__(self):
        self._state = np.errstate(**ERR)
        self._state.__enter__()
        self._token = _QUIET.set(True)
        return self

    def __exit__(self, *exc):
        _QUIET.reset(self._token)
        return self._state.__exit__(*exc)


#: Unit roundoff of the float64 center, per operation that rounds it (one ulp of float64 covers
#: NumPy's float64 libm as well as its correctly rounded arithmetic).
REF_U = 2.0 ** -52


@dataclasses.dataclass(eq=False)
class BVal:
    """One variable: `center` (float64 for floats), `bound` (None: exact; NaN: undecidable),
    `dtype` (the program's dtype), `nonneg` (every allowed value is >= 0 or NaN),
    `dom` (explain mode: per element, the id of the op whose latitude dominates the bound),
    `origin` (how the value was made, where a platform relaxation depends on it), `extreme`
    (operand, axes) when the value is that operand's max or min over those axes (reshaped or
    broadcast): every implementation returns one of the operand's own elements, so comparing the
    two is decided wherever the extremum's position is. `strict` (a dual walk only): the same
    variable as the walk without relaxations has it, where that differs (None: this one)."""

    center: np.ndarray
    bound: np.ndarray | None
    dtype: np.dtype
    nonneg: bool = False
    dom: np.ndarray | None = None
    origin: str | None = None    # "constant", "broadcast", "sqrt" or "div": what XLA's rewrites key on
    extreme: tuple | None = None  # (operand BVal, reduced axes): this is reduce_max/min of operand
    alias: "BVal | None" = None   # the value this one is an exact copy of (stop_gradient, reshard, ...)
    strict: "BVal | None" = None  # a dual walk: this value without relaxations, where it differs
    #: a scatter-add into exact zeros (origin "scatter-add"): per element, the number of updates that
    #: reach it and the sum of their magnitudes and bounds (what `xla-scatter-add-folding` reads)
    scatter_terms: tuple | None = None
    #: an unreduced value (JAX's ``P(unreduced=...)``: a sum each device holds a part of): per
    #: element, (the count of terms, their magnitudes with their bounds, the centers' magnitudes,
    #: the terms' bounds) of the sum it stands for, which `add` / `sub` of unreduced values extend
    partial_terms: tuple | None = None

    def root(self) -> "BVal":
        """The value this one copies (itself when it is no copy)."""
        return self.alias if self.alias is not None else self

    @property
    def floating(self) -> bool:
        return is_float(self.dtype)

    def bound_or_zero(self) -> np.ndarray:
        """The bound as an array (zeros, broadcast, where it is None)."""
        if self.bound is None:
            return np.zeros((), np.float64)
        return self.bound

    def full_bound(self) -> np.ndarray:
        """The bound broadcast to the center's shape (a view; the bound itself where it has that
        shape already. Never written to: a broadcast view is read-only)."""
        b, shape = self.bound, np.shape(self.center)
        if isinstance(b, np.ndarray) and b.shape == shape:
            return b
        return np.broadcast_to(self.bound_or_zero(), shape)


def replaced(v: BVal, **changes) -> BVal:
    """`dataclasses.replace(v, **changes)` without its per-call cost (the walk's `finish` makes
    one per result): a copy of every field, then `changes`."""
    out = object.__new__(BVal)
    out.__dict__.update(v.__dict__)
    out.__dict__.update(changes)
    return out


def strict_view(x):
    """The value the walk without relaxations has for `x` (a BVal's `strict`, else `x` itself)."""
    s = getattr(x, "strict", None)
    return x if s is None else s


@dataclasses.dataclass(frozen=True)
class Unknown:
    """A variable whose bound is unknown: it depends on the primitives `reasons` (no bound rule)."""

    reasons: frozenset

    def __or__(self, other: "Unknown") -> "Unknown":
        return Unknown(self.reasons | other.reasons)


def dtype_of(var) -> np.dtype | None:
    """The physical dtype of a jaxpr variable or literal (None for tokens and other non-arrays)."""
    aval = getattr(var, "aval", None)
    if getattr(aval, "shape", None) is None:
        return None
    dt = getattr(aval, "dtype", None)
    if dt is None:
        return None
    try:
        return _physical(dt)
    except TypeError:   # an unhashable dtype-like: the long way
        try:
            return np.dtype(compat.physical_dtype(dt))
        except TypeError:
            return None


@functools.lru_cache(maxsize=256)
def _physical(dt):
    """np.dtype(compat.physical_dtype(dt)), once per dtype (the walk asks per equation); a dtype
    that has none raises TypeError, not cached."""
    return np.dtype(compat.physical_dtype(dt))


def is_float(dtype) -> bool:
    """Real floating dtypes, the ml_dtypes narrow floats included (not complex)."""
    try:
        return _is_float(dtype)
    except TypeError:    # an unhashable dtype-like
        return _is_float.__wrapped__(dtype)


@functools.lru_cache(maxsize=256)
def _is_float(dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or (dtype.kind == "V" and "float" in dtype.name)


@functools.lru_cache(maxsize=None)
def _finfo(dtype: np.dtype):
    return np.finfo(dtype) if dtype.kind == "f" and dtype.type.__module__ == "numpy" else ml_dtypes.finfo(dtype)


def finfo(dtype):
    """np.finfo (ml_dtypes.finfo for the narrow floats), once per dtype: the walk asks per operation."""
    return _finfo(np.dtype(dtype))


@functools.lru_cache(maxsize=None)
def unit_roundoff(dtype) -> float:
    """u = 2**-p for the p significand bits of `dtype` (float32: 2**-24)."""
    return float(finfo(dtype).eps) / 2


@functools.lru_cache(maxsize=None)
def half_subnormal(dtype) -> float:
    """The largest rounding error in the subnormal range: half the smallest subnormal."""
    return float(finfo(dtype).smallest_subnormal) / 2


@functools.lru_cache(maxsize=None)
def overflow_threshold(dtype) -> float:
    """The magnitude from which round to nearest gives infinity (max + half an ulp of max)."""
    fi = finfo(dtype)
    mx = float(fi.max)
    return mx + mx * float(fi.eps) / 4


def has_inf(dtype) -> bool:
    dtype = np.dtype(dtype)
    try:
        return bool(np.isinf(np.array(np.inf).astype(dtype)))
    except (OverflowError, ValueError):
        return False


@functools.lru_cache(maxsize=None)
def flush_threshold(dtype) -> float:
    """Below this magnitude XLA:CPU flushes a float to zero: float32's smallest normal for every
    float narrower than 64 bits (they compute in float32), float64's for float64."""
    return float(finfo(np.float64 if np.dtype(dtype).itemsize == 8 else np.float32).tiny)


def half_ulp(a, dtype):
    """Half an ulp of `dtype` at magnitude `a` (elementwise): the largest rounding error of a
    correctly rounded result whose exact value has magnitude at most `a` -- ``u * 2**floor(log2 a)``
    (tighter than ``u * a`` by up to 2), and never below half the smallest subnormal."""
    # frexp and ldexp raise no floating-point error here (NaN and inf give e = 0; u / 2 * 2**1024
    # is finite for every dtype): no errstate to enter
    _, e = np.frexp(np.asarray(a, np.float64))
    return np.maximum(np.ldexp(_half_u(dtype), e), half_subnormal(dtype))


@functools.lru_cache(maxsize=None)
def _half_u(dtype) -> float:
    """u / 2 (a power of two: u / 2 * 2**e is u * 2**(e - 1), the same float)."""
    return unit_roundoff(dtype) / 2


def growth(k, u: float):
    """(1 + u)**k - 1: the relative error of k roundings (Higham's gamma(k), without its
    k*u < 1 restriction); elementwise for an array `k`."""
    if isinstance(k, (int, float, np.integer, np.floating)):
        return _growth(float(k), u)
    k = np.asarray(k, np.float64)
    return np.expm1(k * np.log1p(u))


@functools.lru_cache(maxsize=1024)
def _growth(k: float, u: float):
    """`growth` of one count, once per (k, u): the same NumPy computation, the same np.float64."""
    return np.expm1(np.asarray(k, np.float64) * np.log1p(u))


def widens_exactly(src, dst) -> bool:
    """True when every value of float dtype `src` is a value of float dtype `dst`."""
    a, b = finfo(src), finfo(dst)
    return (b.nmant >= a.nmant and float(b.max) >= float(a.max)
            and float(b.smallest_subnormal) <= float(a.smallest_subnormal))


def as_center(x: np.ndarray, dtype) -> np.ndarray:
    """A program value of `dtype` as the walk holds it: float64 for floats, itself otherwise. A
    value given in another dtype is first converted to `dtype`, as JAX converts a program's
    arguments (a float64 NumPy array passed to a float32 program is rounded to float32 first)."""
    x = np.asarray(x)
    dt = np.dtype(dtype)
    if x.dtype != dt and x.dtype.kind in "biuf" and (dt.kind in "biuf" or is_float(dt)):
        x = x.astype(dt)
    if is_float(dtype):
        return x.astype(np.float64) if x.dtype != np.float64 else x
    return x


def add_bounds(*bounds):
    """The sum of bounds (None counts as 0; None when all are None)."""
    out = None
    for b in bounds:
        if b is None:
            continue
        out = b if out is None else out + b
    return out


def max_bounds(*bounds):
    """The elementwise max of bounds (None counts as 0; NaN propagates)."""
    out = None
    for b in bounds:
        if b is None:
            continue
        out = b if out is None else np.fmax(out, b) + np.where(np.isnan(out) | np.isnan(b), np.nan, 0.0)
    return out


def any_of(x) -> bool:
    """``bool(np.any(x))``, without np.any's dispatch cost for an ndarray (the walk asks it per result)."""
    return bool(x.any()) if isinstance(x, np.ndarray) else bool(np.any(x))


def nan_sum(x) -> bool:
    """``bool(np.isnan(np.sum(x)))`` (a NaN, or infinities of both signs), cheaper for an ndarray."""
    return bool(np.isnan(x.sum() if isinstance(x, np.ndarray) else np.sum(x)))


def undecidable(bound) -> np.ndarray | bool:
    """The undecidable mask of a bound (False where it is None)."""
    if bound is None:
        return False
    return np.isnan(bound)
