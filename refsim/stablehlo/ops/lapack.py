"""The LAPACK custom calls JAX lowers linear algebra to on CPU (`lapack_<t><routine>_ffi`).

Each call returns what the LAPACK routine leaves in its outputs (jaxlib/cpu/lapack_kernels):
potrf the factor in the triangle `uplo` names and the other triangle as given; getrf the
packed L\\U factors and 1-based pivots; geqrf the packed R and Householder vectors with
their taus; orgqr / ungqr the explicit Q; syevd / heevd the eigenvectors (in place of the
matrix) and ascending eigenvalues; gesdd the singular values (and U, V^H when asked); trsm the
triangular solve. `info` is 0 on success and LAPACK's positive index where a factorization
breaks down. The arithmetic is refsim's kernels (`refsim.interpreter.rules.factorizations`).
Attribute bytes are LAPACK's characters ('L' = 76, 'U' = 85, 'N' = 78, 'T' = 84, 'C' = 67,
'V' = 86, 'A' = 65, 'S' = 83, 'R' = 82).
"""
from __future__ import annotations

import numpy as np

from refsim.interpreter.registry import RULES
from refsim.stablehlo.registry import register

_TYPES = "sdcz"


def _cfg(op) -> dict:
    cfg = op.attrs.get("mhlo.backend_config")
    if not isinstance(cfg, dict):  # XLA's compiled module: the FFI attributes are the backend_config
        cfg = op.attrs.get("backend_config")
        cfg = cfg if isinstance(cfg, dict) else {}
    return {k: chr(int(v)) if isinstance(v, (int, np.integer)) else v for k, v in (cfg or {}).items()}


def _names(routine: str, complex_routine: str | None = None) -> list[str]:
    out = []
    for t in _TYPES:
        r = complex_routine if (complex_routine and t in "cz") else routine
        out.append(f"stablehlo.custom_call @lapack_{t}{r}_ffi")
    return out


def _results(fn):
    """HLO's custom calls return one tuple (XLA's compiled module); StableHLO's return each
    value: the rule's values are given in the form the op has."""
    import functools

    @functools.wraps(fn)
    def rule(m, op, env, *args):
        res = fn(m, op, env, *args)
        if isinstance(res, np.ndarray):
            return res
        outs = list(res)
        if len(op.results) == 1 and len(outs) > 1:
            return [tuple(outs)]
        return outs

    return rule


def _result_shapes(op) -> list[tuple]:
    """Each result's shape: from the op's result types, or from HLO's `xla_shape` tuple text
    (a custom call of XLA's compiled module has one tuple result)."""
    import re

    if len(op.types) > 1:
        return [tuple(t.shape) for t in op.types]
    return [tuple(int(d) for d in dims.split(",") if d) for dims in re.findall(r"\w+\[([\d,]*)\]",
                                                                                 str(op.attrs.get("xla_shape", "")))]


def _info(ok: np.ndarray) -> np.ndarray:
    return np.where(ok, 0, 1).astype(np.int32)


@register(*_names("potrf"))
@_results
def potrf_rule(m, op, env, a):
    """Cholesky factor in the `uplo` triangle; the other triangle keeps the input."""
    upper = _cfg(op).get("uplo", "L") == "U"
    x = np.asarray(a)
    lower_in = np.swapaxes(x, -1, -2).conj() if upper else x
    factor = RULES["cholesky"](m.ctx, lower_in)
    ok = ~np.isnan(factor).any(axis=(-1, -2))
    if upper:
        factor = np.swapaxes(factor, -1, -2).conj()
        out = np.where(np.triu(np.ones(x.shape[-2:], bool)), factor, x)
    else:
        out = np.where(np.tril(np.ones(x.shape[-2:], bool)), factor, x)
    out = np.where(ok[..., None, None], out, x)
    return [out.astype(x.dtype), _info(ok)]


@register(*_names("getrf"))
@_results
def getrf_rule(m, op, env, a):
    """LU with partial pivoting: packed L\\U, 1-based pivots, info = first zero pivot (1-based)."""
    lu, piv, _ = RULES["lu"](m.ctx, a)
    k = min(lu.shape[-2:])
    diag = np.diagonal(lu, axis1=-2, axis2=-1)[..., :k]
    zero = diag == 0
    info = np.where(zero.any(-1), np.argmax(zero, -1) + 1, 0).astype(np.int32)
    return [lu, (np.asarray(piv) + 1).astype(np.int32), info]


@register(*_names("geqrf"))
@_results
def geqrf_rule(m, op, env, a):
    return RULES["geqrf"](m.ctx, a)


@register(*_names("orgqr", "ungqr"))
@_results
def orgqr_rule(m, op, env, a, taus):
    return RULES["householder_product"](m.ctx, a, taus)


@register(*_names("syevd", "heevd"))
@_results
def syevd_rule(m, op, env, a):
    """Eigenvectors (columns, in place of the matrix) and ascending eigenvalues of one triangle."""
    cfg = _cfg(op)
    v, w = RULES["eigh"](m.ctx, a, lower=cfg.get("uplo", "L") == "L")
    if cfg.get("mode", "V") == "N":
        v = np.asarray(a)
    return [v, w, np.zeros(w.shape[:-1], np.int32)]


@register(*_names("gesdd"))
@_results
def gesdd_rule(m, op, env, a):
    """(a as left by the routine, s, u, vt, info); u and vt are zeros for mode 'N' (not computed)."""
    mode = _cfg(op).get("mode", "A")
    x = np.asarray(a)
    if mode == "N":
        (s,) = RULES["svd"](m.ctx, x, full_matrices=False, compute_uv=False)
        shapes = _result_shapes(op)
        u = np.zeros(x.shape[:1] + shapes[2], x.dtype)
        vt = np.zeros(x.shape[:1] + shapes[3], x.dtype)
    else:
        s, u, vt = RULES["svd"](m.ctx, x, full_matrices=mode == "A", compute_uv=True)
    return [x, s, u, vt, np.zeros(s.shape[:-1], np.int32)]


@register(*_names("trsm"))
@_results
def trsm_rule(m, op, env, a, b):
    """x with op(a) x = b (side 'L') or x op(a) = b (side 'R') from the `uplo` triangle of a."""
    cfg = _cfg(op)
    trans = cfg.get("trans_x", "N")
    return RULES["triangular_solve"](m.ctx, a, b, left_side=cfg.get("side", "L") == "L",
                                     lower=cfg.get("uplo", "L") == "L", transpose_a=trans in ("T", "C"),
                                     conjugate_a=trans == "C", unit_diagonal=cfg.get("diag", "N") == "U")
