"""Notes that name a platform's documented behaviour as the likely cause of a disagreement.

`conformance.check` compares XLA with refsim's semantics. Some platforms document that they
compute some ops less exactly by default; a disagreement on such a program is then more likely
that default than a miscompile, and the report says so, with the way to check the program under
the exact semantics. The note never changes the verdict.
"""
from __future__ import annotations

__all__ = ["notes", "reduced_precision_dots"]

_FLOAT32 = ("float32", "complex64")


def _subjaxprs(eqn):
    """The jaxprs in an equation's params (scan/while/cond bodies, pjit, custom rules), by shape:
    JAX moves its core classes between modules across versions."""
    for v in eqn.params.values():
        for x in v if isinstance(v, (tuple, list)) else (v,):
            if hasattr(x, "eqns"):
                yield x
            elif hasattr(getattr(x, "jaxpr", None), "eqns"):
                yield x.jaxpr


def reduced_precision_dots(jaxpr) -> int:
    """How many float32/complex64 dot_general / conv equations (nested jaxprs included) leave
    their precision to the platform (precision None or DEFAULT and no preferred_element_type
    wider than the operands)."""
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
            dtypes = {str(v.aval.dtype) for v in eqn.invars}
            prec = eqn.params.get("precision")
            precs = prec if isinstance(prec, (tuple, list)) else (prec,)
            default = all(p is None or str(p).upper().endswith("DEFAULT") for p in precs)
            if dtypes & set(_FLOAT32) and default:
                count += 1
        for sub in _subjaxprs(eqn):
            count += reduced_precision_dots(sub)
    return count


def notes(platform: str, jaxpr, ok: bool) -> list[str]:
    """The notes for a call on `platform` of `jaxpr` (a core.Jaxpr) whose verdict is `ok`."""
    import jax

    if ok or platform not in ("gpu", "cuda", "rocm"):
        return []
    if jax.config.jax_default_matmul_precision not in (None, "default", "DEFAULT", "fastest"):
        return []
    n = reduced_precision_dots(jaxpr)
    if not n:
        return []
    return [f"note: this program has {n} float32 dot_general/convolution(s) at DEFAULT precision; on NVIDIA "
            "GPUs (Ampere and newer) XLA computes these with TF32 inputs (10-bit mantissa, relative error "
            "about 1e-3), as JAX documents for Precision.DEFAULT. To check the program under float32 "
            "semantics, run it under jax.default_matmul_precision('highest') (or set "
            "JAX_DEFAULT_MATMUL_PRECISION=highest); a disagreement that remains is not TF32."]
