"""Helpers shared by the NumPy rules: mesh-dimension broadcasting and dtype handling.

Every value is ``mesh dims (ctx.nm of them) + local dims``. A mesh dim is either
the mesh axis size or 1 (the value is invariant over that axis). Rules broadcast
the mesh dims of their operands against each other with views, never copies.
"""
from __future__ import annotations

from typing import Sequence

import ml_dtypes
import numpy as np

# Float types that XLA:CPU computes in float32 and rounds back (float normalization).
_NARROW_FLOATS = {
    np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16),
    *(np.dtype(getattr(ml_dtypes, n)) for n in (
        "float8_e4m3fn", "float8_e5m2", "float8_e4m3b11fnuz", "float8_e4m3fnuz",
        "float8_e5m2fnuz", "float8_e3m4", "float8_e4m3", "float8_e8m0fnu",
        "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn") if hasattr(ml_dtypes, n)),
}


def is_narrow_float(dtype) -> bool:
    """bf16, f16 and the 8/6/4-bit floats: computed in f32 by XLA:CPU, then rounded."""
    return np.dtype(dtype) in _NARROW_FLOATS


def is_float(dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype in _NARROW_FLOATS or np.issubdtype(dtype, np.floating)


def is_complex(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.complexfloating)


def is_inexact(dtype) -> bool:
    return is_float(dtype) or is_complex(dtype)


def is_signed_int(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.signedinteger)


def is_unsigned_int(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.unsignedinteger)


def is_int(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.integer)


def compute_dtype(dtype) -> np.dtype:
    """The dtype XLA:CPU computes `dtype` arithmetic in (f32 for narrow floats)."""
    return np.dtype(np.float32) if is_narrow_float(dtype) else np.dtype(dtype)


def finfo(dtype):
    return ml_dtypes.finfo(dtype) if is_narrow_float(dtype) else np.finfo(dtype)


def iinfo(dtype):
    return np.iinfo(dtype)


def mesh_shape(nm: int, *arrays: np.ndarray) -> tuple[int, ...]:
    """The common mesh shape of `arrays` (each mesh dim the axis size or 1)."""
    return tuple(np.broadcast_shapes(*(a.shape[:nm] for a in arrays))) if nm else ()


def bcast_mesh(nm: int, *arrays: np.ndarray) -> list[np.ndarray]:
    """Broadcast only the mesh dims of `arrays` to their common mesh shape (views)."""
    if not nm:
        return list(arrays)
    m = mesh_shape(nm, *arrays)
    return [a if a.shape[:nm] == m else np.broadcast_to(a, m + a.shape[nm:]) for a in arrays]


def bcast_local_rank(nm: int, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Give lower-rank operands (scalar literals) size-1 local dims after the mesh dims.

    Elementwise jaxpr equations may mix a rank-0 literal with rank-r operands; NumPy
    broadcasting aligns from the right, so the missing local dims go right after the
    mesh dims to keep the mesh dims aligned.
    """
    rank = max(a.ndim for a in arrays) - nm
    out = []
    for a in arrays:
        missing = rank - (a.ndim - nm)
        out.append(a.reshape(a.shape[:nm] + (1,) * missing + a.shape[nm:]) if missing else a)
    return out


def shift(axes: Sequence[int], nm: int) -> tuple[int, ...]:
    """Local axis numbers as axis numbers of the stacked array."""
    return tuple(int(a) + nm for a in axes)


def mesh_index(nm: int, m: Sequence[int], total_ndim: int) -> list[np.ndarray]:
    """Open-grid integer indices for the mesh dims, broadcastable over `total_ndim` dims.

    Index k has shape ``(1,)*k + (m[k],) + (1,)*(total_ndim-k-1)``; a size-1 mesh dim gets
    index 0, so an invariant operand is read without materialising a broadcast.
    """
    out = []
    for k in range(nm):
        shape = [1] * total_ndim
        shape[k] = m[k]
        out.append(np.arange(m[k]).reshape(shape))
    return out


def as_dtype(x: np.ndarray, dtype) -> np.ndarray:
    """Cast to `dtype` without a copy when it already has it."""
    dtype = np.dtype(dtype)
    return x if x.dtype == dtype else x.astype(dtype)
