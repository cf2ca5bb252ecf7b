"""`arrays()` and `dtypes()`: input data, exact-friendly by default."""
from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.strategies import _validate as v
from conformance.verdict.compare import _finfo

# dtypes every collective test draws by default (64-bit types need jax_enable_x64).
DEFAULT_DTYPES = ("float32", "int32", "float16", "bfloat16", "bool", "int8", "uint32", "complex64")
MODES = ("exact", "random", "special")
# Special values `arrays(mode="special")` mixes into exact-friendly data (see `special_values`).
SPECIALS = ("nan", "inf", "-0", "subnormal", "max")
# Every float dtype JAX has, for strategies that want them all (float8 types come from ml_dtypes).
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3b11fnuz",
                "float8_e4m3fnuz", "float8_e5m2fnuz")

# Exact-friendly values are k * 2**e with |k| <= K and E_MIN <= e <= 0: with p significand
# bits, any sum of up to 2**p / (K * 2**-E_MIN) such values is exact in any order
# (float32: 2**24 / 64 terms; float16: 2**11 / 32 = 64 terms; bfloat16: 2**8 / 2 = 128).
_EXACT = {
    "float64": (16, -2), "float32": (16, -2), "complex64": (16, -2), "complex128": (16, -2),
    "float16": (8, -2), "bfloat16": (2, 0),
}
_INT_K = {1: 4, 2: 16, 4: 16, 8: 16}


def _np_dtype(dtype) -> np.dtype:
    name = dtype if isinstance(dtype, str) else getattr(dtype, "__name__", "")
    if name == "bfloat16" or name.startswith("float8_"):
        if not hasattr(ml_dtypes, name):
            raise InvalidArgument(f"dtype={dtype!r}: this ml_dtypes has no {name}.")
        return np.dtype(getattr(ml_dtypes, name))
    try:
        return np.dtype(dtype)
    except TypeError:
        raise InvalidArgument(f"dtype={dtype!r} is not a NumPy dtype (or 'bfloat16', 'float8_*').") from None


def _is_float(dt: np.dtype) -> bool:
    return dt.kind in "fc" or (dt.kind == "V" and "float" in dt.name)


def special_values(dtype, kinds=SPECIALS) -> np.ndarray:
    """The special values of a floating `dtype` for `kinds`, as a 1-D array of that dtype:
    "nan" (the default quiet NaN and quiet NaNs with payloads and the sign bit set, where the
    format has them), "inf" (+inf, -inf; none for formats without infinities), "-0" (none where
    the format has no negative zero), "subnormal" (the smallest and the largest subnormal, both
    signs), "max" (the largest finite value and the lowest, and the smallest normal).
    Integers and bools have none (an empty array).

    >>> special_values("float16", kinds=("inf", "-0"))
    array([ inf, -inf,  -0.], dtype=float16)
    """
    dt = _np_dtype(dtype)
    v.check_options("kinds", kinds, SPECIALS)
    if not _is_float(dt):
        return np.zeros((0,), dt)
    real = np.dtype(f"f{dt.itemsize // 2}") if dt.kind == "c" else dt
    fi = _finfo(real)
    ubits = np.dtype(f"u{real.itemsize}")
    vals: list = []
    with np.errstate(invalid="ignore", over="ignore"):
        if "nan" in kinds:
            q = np.array(np.nan, real).view(ubits)
            mant = (1 << int(fi.nmant)) - 1
            sign = np.array(1 << (8 * real.itemsize - 1), ubits)
            for bits in (q, q | (mant & 0x5), q | (mant & 0x2), q | sign):   # payloads; a negative NaN
                x = np.array(bits, ubits).view(real)
                if np.isnan(x.astype(np.float64)):
                    vals.append(x)
        if "inf" in kinds:
            for x in (np.inf, -np.inf):
                y = np.array(x).astype(real)
                if np.isinf(y.astype(np.float64)):
                    vals.append(y)
        if "-0" in kinds:
            z = np.array(-0.0).astype(real)
            if np.signbit(z.astype(np.float64)) and not np.isnan(z.astype(np.float64)):
                vals.append(z)
        if "subnormal" in kinds:
            low = float(fi.smallest_subnormal)
            high = float(fi.tiny) - low
            for x in (low, -low, high, -high):
                y = np.array(x).astype(real)
                if y.astype(np.float64) != 0:
                    vals.append(y)
        if "max" in kinds:
            for x in (fi.max, fi.min, fi.tiny):
                vals.append(np.array(x).astype(real))
    out = np.array(vals, dtype=real).reshape(-1) if vals else np.zeros((0,), real)
    return out.astype(dt) if dt.kind == "c" else out


def dtypes(*, include=DEFAULT_DTYPES) -> st.SearchStrategy[np.dtype]:
    """NumPy dtypes from `include` (names or dtypes; 'bfloat16' via ml_dtypes), shrinking to the first.

    >>> dtypes(include=("float32", "int8")).example()  # doctest: +SKIP
    dtype('int8')
    """
    if isinstance(include, str):
        include = (include,)
    if not include:
        raise InvalidArgument("include=() is empty; name at least one dtype.")
    return st.sampled_from([_np_dtype(d) for d in include])


# The value strategies below are kept per (dtype, size, ...): one strategy object draws what a fresh
# equal one draws (the same choices, labels and spans), but hypothesis validates a strategy and
# works out its properties (is_empty, labels) once per object, which was a fifth of drawing a plan.
# The caches are unbounded on purpose (few distinct keys): hypothesis upweights the number literals
# of every loaded local module in its integer and float draws, so a new literal here (a maxsize)
# would change what a plan draws.
@functools.lru_cache(maxsize=None)
def _exact_values(dt: np.dtype, size: int) -> st.SearchStrategy[np.ndarray]:
    if dt.kind == "b":
        return st.lists(st.booleans(), min_size=size, max_size=size).map(lambda xs: np.array(xs, dtype=bool))
    if dt.kind in "iu":
        k = _INT_K[dt.itemsize]
        lo = 0 if dt.kind == "u" else -k
        return st.lists(st.integers(lo, k), min_size=size, max_size=size).map(lambda xs: np.array(xs, dtype=dt))
    k, emin = _EXACT.get(dt.name, (2, 0))
    scalar = st.builds(lambda m, e: float(m) * 2.0 ** e, st.integers(-k, k), st.integers(emin, 0))
    if dt.kind == "c":
        return st.lists(st.tuples(scalar, scalar), min_size=size, max_size=size).map(
            lambda xs: np.array([complex(a, b) for a, b in xs], dtype=dt))
    return st.lists(scalar, min_size=size, max_size=size).map(lambda xs: np.array(xs, dtype=np.float64).astype(dt))


@functools.lru_cache(maxsize=None)
def _random_values(dt: np.dtype, size: int, allow_nan: bool, allow_infinity: bool) -> st.SearchStrategy[np.ndarray]:
    if dt.kind in "biu":
        return _exact_values(dt, size) if dt.kind == "b" else st.lists(
            st.integers(int(np.iinfo(dt).min), int(np.iinfo(dt).max)), min_size=size, max_size=size
        ).map(lambda xs: np.array(xs, dtype=dt))
    # Signs and several binades per array, so a sum really rounds; width-limited to stay finite.
    width = {2: 16, 4: 32, 8: 64}.get(dt.itemsize if dt.kind == "f" else dt.itemsize // 2, 32)
    big = 1e3 if width != 16 else 1e2
    base = st.floats(-big, big, width=32 if width == 16 else width, allow_subnormal=False)
    special = [math.nan] * allow_nan + [math.inf, -math.inf] * allow_infinity
    scalar = st.one_of(base, st.sampled_from(special)) if special else base
    if dt.kind == "c":
        return st.lists(st.tuples(scalar, scalar), min_size=size, max_size=size).map(
            lambda xs: np.array([complex(a, b) for a, b in xs], dtype=dt))
    return st.lists(scalar, min_size=size, max_size=size).map(lambda xs: np.array(xs, dtype=np.float64).astype(dt))


@functools.lru_cache(maxsize=None)
def _picks(top: int, size: int) -> st.SearchStrategy[list]:
    return st.lists(st.integers(0, top), min_size=size, max_size=size)


# Module level: st.composite reads the function's source each time it decorates one (~3 ms),
# which a closure redefined per call would pay on every draw that builds this strategy.
@st.composite
def _draw_array(draw, allow_infinity, allow_nan, dtype_s, mode, shape_s, kinds=SPECIALS) -> np.ndarray:
    dt = _np_dtype(draw(dtype_s))
    shp = tuple(draw(shape_s))
    size = math.prod(shp)
    if mode == "random":
        vals = draw(_random_values(dt, size, allow_nan, allow_infinity))
    else:
        vals = draw(_exact_values(dt, size))
        table = special_values(dt, kinds) if mode == "special" else ()
        if len(table) and size:
            # index 0 keeps the exact-friendly value, so shrinking removes specials first
            picks = draw(_picks(2 * len(table), size))
            idx = np.asarray(picks) - 1 - len(table)
            vals = np.where(idx >= 0, table[np.clip(idx, 0, len(table) - 1)], vals)
    return np.asarray(vals, dtype=dt).reshape(shp)


def arrays(dtype, shape, *, mode: str = "exact", allow_nan: bool = False,
           allow_infinity: bool = False, specials=SPECIALS) -> st.SearchStrategy[np.ndarray]:
    """NumPy arrays of `dtype` and `shape` (each a value or a strategy).

    mode="exact" (default) draws small integers and small multiples of powers of two
    (see `_EXACT`), so every sum a collective computes is exact in any reduction order, as
    nccl-tests' data is; bools and integers stay small enough not to overflow a psum over
    8 devices. mode="random" draws floats over several binades with both signs (and NaN/inf
    if allowed), which makes sums round and exercises the comparator's bound; integers
    then span the dtype's range. mode="special" draws exact-friendly data in which some
    elements are the `special_values` of `specials` (NaN with payloads, ±inf, -0, subnormals,
    the largest finite values); integers and bools are drawn as in "exact". Shrinks towards zeros.

    >>> arrays("float32", (2, 3)).example()  # doctest: +SKIP
    array([[ 0.25, -3.  ,  0.  ], [ 1.5 ,  0.  , 16.  ]], dtype=float32)
    """
    v.check_choice("mode", mode, MODES)
    v.check_bool("allow_nan", allow_nan)
    v.check_bool("allow_infinity", allow_infinity)
    if mode != "random" and (allow_nan or allow_infinity):
        raise InvalidArgument("allow_nan/allow_infinity need mode='random'; use mode='special' with specials= "
                              "for NaN and infinities in exact-friendly data.")
    kinds = v.check_options("specials", specials, SPECIALS)
    dtype_s = dtype if v.is_strategy(dtype) else st.just(_np_dtype(dtype))
    if v.is_strategy(shape):
        shape_s = shape
    else:
        try:
            shape = tuple(int(d) for d in ((shape,) if isinstance(shape, int) else shape))
        except (TypeError, ValueError):
            raise InvalidArgument(f"shape={shape!r} must be a tuple of non-negative ints.") from None
        if any(d < 0 for d in shape):
            raise InvalidArgument(f"shape={shape!r} must be a tuple of non-negative ints.")
        shape_s = st.just(shape)

    return _draw_array(allow_infinity, allow_nan, dtype_s, mode, shape_s, kinds)
