"""Host values entering refsim: what an array argument may be, by JAX's rules.

`as_jax_array(x, arg=..., api=...)` turns one array-like into the ndarray JAX would hold:

- numeric only: bool, integer, floating and complex dtypes (and ml_dtypes' bfloat16, float8,
  int4 ...); strings, objects, datetimes are a TypeError with JAX's text (`refsim.device_put`
  alone also places NumPy's StringDType arrays, as `jax.device_put` does);
- JAX's canonical dtype: with `jax_enable_x64` off, 64-bit values become 32-bit
  (`np.full(8, 2**40)` becomes int32 and wraps, as `jax.device_put` does); a Python int
  that does not fit the canonical integer type is an OverflowError, as in JAX;
- one array: `None` is a TypeError (refsim places one array, not a pytree), and a ragged
  nested sequence is a ValueError naming the argument.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from refsim import compat


def _is_ml_dtype(dtype: np.dtype) -> bool:
    return dtype.kind == "V" and getattr(dtype.type, "__module__", "").startswith("ml_dtypes")


def check_numeric_dtype(dtype, *, arg: str, api: str) -> np.dtype:
    """`dtype` if JAX can hold it; TypeError with JAX's text otherwise."""
    dtype = np.dtype(dtype)
    if dtype.kind in "biufc" or _is_ml_dtype(dtype):
        return dtype
    raise TypeError(
        f"{api}: {arg} has dtype {dtype}. Dtype {dtype} is not a valid JAX array type. Only arrays of "
        f"numeric types are supported by JAX. Convert {arg} first, e.g. np.asarray({arg}, np.float32)."
    )


def canonical_dtype(dtype) -> np.dtype:
    """JAX's canonical dtype (64-bit -> 32-bit unless `jax_enable_x64` is on)."""
    import jax

    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _is_float0(dtype: np.dtype) -> bool:
    import jax

    return dtype == jax.dtypes.float0


def as_jax_array(x, *, arg: str = "x", api: str = "refsim.device_put", strings: bool = False,
                 float0: bool = False) -> np.ndarray:
    """`x` as an ndarray with JAX's canonical numeric dtype (see the module docstring).

    `strings=True` (`refsim.device_put`) also takes NumPy's variable-width `StringDType` arrays
    as they are: `jax.device_put` places them (JAX's string arrays: placement and resharding
    only; a jit refuses them), while fixed-width ``str_`` / ``bytes_`` arrays stay a TypeError,
    as in JAX. `float0=True` (a program's arguments) takes `jax.dtypes.float0` arrays, the
    data-less tangents of integer inputs that jit and pmap accept: they flow through a program's
    data movement (a pmap body squeezes them) and carry no values."""
    if x is None:
        raise TypeError(
            f"{api}: {arg}=None is not an array; pass a NumPy array, a Python scalar or (nested) "
            f"sequence of numbers, or a refsim.Array ({api} places one array, not a pytree)."
        )
    if isinstance(x, int) and not isinstance(x, bool):
        limit = np.iinfo(canonical_dtype(np.int64))
        if not limit.min <= x <= limit.max:
            raise OverflowError(
                f"{api}: Python int {arg}={x} too large to convert to {limit.dtype}; pass "
                f"np.int64({x}) with jax_enable_x64 on, or a value in [{limit.min}, {limit.max}]."
            )
    try:
        value = compat.to_numpy(x)  # a JAX key array becomes refsim's structured keys
    except ValueError as e:  # NumPy's "inhomogeneous shape" for ragged nested lists
        raise ValueError(
            f"{api}: {arg} is not a rectangular array: {e} Give every nested list the same length."
        ) from None
    if compat.jax_key_dtype(value.dtype) is not None:
        return value  # refsim's structured form of a JAX PRNG key array: placed as it is
    if float0 and value.dtype.kind == "V" and _is_float0(value.dtype):
        return value  # jax.dtypes.float0: no data, JAX takes it as it is
    if strings and value.dtype.kind == "T":
        return value  # NumPy's StringDType: placed as it is, as jax.device_put does
    dtype = check_numeric_dtype(value.dtype, arg=arg, api=api)
    canon = canonical_dtype(dtype)
    return value if canon == dtype else value.astype(canon)


def complex_from_parts(real, imag, dtype) -> np.ndarray:
    """The complex array of `dtype` with these real and imaginary parts, part by part.

    Not ``real + 1j * imag``: NumPy's complex product ``1j * inf`` is ``nan+infj`` and
    ``1j * nan`` is ``nan+nanj``, so a non-finite imaginary part would spoil the real part
    (``jax.lax.complex(1., inf)`` is ``1+infj``).
    """
    real, imag = np.broadcast_arrays(np.asarray(real), np.asarray(imag))
    out = np.empty(real.shape, dtype)
    out.real, out.imag = real, imag
    return out


def quiet_nan(x) -> np.ndarray:
    """`x` with every signalling NaN made quiet (the quiet bit, the significand's top bit, set;
    sign and payload kept): IEEE 754-2019 section 6.2 gives a quiet NaN as the result of an
    operation on a NaN, which StableHLO's maximum / minimum follow. Non-float dtypes, and
    float8 formats without IEEE NaNs (e4m3fn's only NaN is already quiet), come back unchanged.
    Complex values: part by part."""
    x = np.asarray(x)
    if x.dtype.kind == "c":
        return complex_from_parts(quiet_nan(x.real), quiet_nan(x.imag), x.dtype)
    native = x.dtype.kind == "f" and x.dtype.type.__module__ == "numpy"
    if not (native or x.dtype.name.startswith(("bfloat16", "float8", "float6", "float4"))):
        return x
    with np.errstate(invalid="ignore"):
        nan = np.isnan(x.astype(np.float32) if x.dtype.itemsize < 4 else x)
    if not nan.any():
        return x
    nmant = int((np.finfo if native else ml_dtypes.finfo)(x.dtype).nmant)
    uint = np.dtype(f"u{x.dtype.itemsize}")
    bits = x.view(uint)
    quieted = (bits | uint.type(1 << (nmant - 1))).view(x.dtype)
    with np.errstate(invalid="ignore"):
        still_nan = np.isnan(quieted.astype(np.float32) if x.dtype.itemsize < 4 else quieted)
    return np.where(nan & still_nan, quieted, x)
