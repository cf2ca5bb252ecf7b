"""`arrays()` and `dtypes()`: input data, exact-friendly by default."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.strategies import _validate as v

# dtypes every collective test draws by default (64-bit types need jax_enable_x64).
DEFAULT_DTYPES = ("float32", "int32", "float16", "bfloat16", "bool", "int8", "uint32", "complex64")
MODES = ("exact", "random")

# Exact-friendly values are k * 2**e with |k| <= K and E_MIN <= e <= 0: with p significand
# bits, any sum of up to 2**p / (K * 2**-E_MIN) such values is exact in any order
# (float32: 2**24 / 64 terms; float16: 2**11 / 32 = 64 terms; bfloat16: 2**8 / 2 = 128).
_EXACT = {
    "float64": (16, -2), "float32": (16, -2), "complex64": (16, -2), "complex128": (16, -2),
    "float16": (8, -2), "bfloat16": (2, 0),
}
_INT_K = {1: 4, 2: 16, 4: 16, 8: 16}


def _np_dtype(dtype) -> np.dtype:
    if isinstance(dtype, str) and dtype == "bfloat16" or getattr(dtype, "__name__", "") == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(dtype)
    except TypeError:
        raise InvalidArgument(f"dtype={dtype!r} is not a NumPy dtype (or 'bfloat16').") from None


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


# Module level: st.composite reads the function's source each time it decorates one (~3 ms),
# which a closure redefined per call would pay on every draw that builds this strategy.
@st.composite
def _draw_array(draw, allow_infinity, allow_nan, dtype_s, mode, shape_s) -> np.ndarray:
    dt = _np_dtype(draw(dtype_s))
    shp = tuple(draw(shape_s))
    size = math.prod(shp)
    vals = draw(_exact_values(dt, size) if mode == "exact" else
                _random_values(dt, size, allow_nan, allow_infinity))
    return vals.reshape(shp)


def arrays(dtype, shape, *, mode: str = "exact", allow_nan: bool = False,
           allow_infinity: bool = False) -> st.SearchStrategy[np.ndarray]:
    """NumPy arrays of `dtype` and `shape` (each a value or a strategy).

    mode="exact" (default) draws small integers and small multiples of powers of two
    (see `_EXACT`), so every sum a collective computes is exact in any reduction order, as
    nccl-tests' data is; bools and integers stay small enough not to overflow a psum over
    8 devices. mode="random" draws floats over several binades with both signs (and NaN/inf
    if allowed), which makes sums round and exercises the comparator's bound; integers
    then span the dtype's range. Shrinks towards zeros.

    >>> arrays("float32", (2, 3)).example()  # doctest: +SKIP
    array([[ 0.25, -3.  ,  0.  ], [ 1.5 ,  0.  , 16.  ]], dtype=float32)
    """
    v.check_choice("mode", mode, MODES)
    v.check_bool("allow_nan", allow_nan)
    v.check_bool("allow_infinity", allow_infinity)
    if mode == "exact" and (allow_nan or allow_infinity):
        raise InvalidArgument("allow_nan/allow_infinity need mode='random'; exact mode draws finite values only.")
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

    return _draw_array(allow_infinity, allow_nan, dtype_s, mode, shape_s)
