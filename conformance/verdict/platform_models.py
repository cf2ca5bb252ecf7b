"""NumPy models of a platform's own semantics where it departs from the documented one.

An xfails entry ``model(NAME)`` (`conformance.verdict.xfails`) expects XLA's result to differ from
refsim's in exactly the way model NAME predicts: `check(NAME, case, actual)` computes the
model's result for the case independently of refsim's rules and compares XLA's result with
it, so the entry matches only that deviation, and a different wrong result (a miscompile
that also drops NaN, but differently) is still a failure. Each model states the plain-JAX
observation it reproduces.
"""
from __future__ import annotations

import ast
import dataclasses
import re

import numpy as np

from conformance.verdict.compare import Exact, SumBound, as_outputs, compare
from conformance.verdict.elements import is_float
from conformance.verdict.reductions import reduction_terms
import refsim
from refsim.values import complex_from_parts

__all__ = ["MODELS", "check", "flush_subnormals"]

# XLA:CPU runs float arithmetic with denormals-are-zero and flush-to-zero; float16, bfloat16
# and float8 are computed in float32, so the threshold is float32's (float64: float64's).
_F32_TINY = float(np.finfo(np.float32).tiny)
_F64_TINY = float(np.finfo(np.float64).tiny)


def flush_subnormals(x):
    """`x` with every float below float32's smallest normal (float64's for 8-byte floats) replaced
    by a zero of the same sign; other dtypes unchanged."""
    a = np.asarray(x)
    if not is_float(a.dtype):
        return a
    if a.dtype.kind == "c":
        return complex_from_parts(flush_subnormals(a.real), flush_subnormals(a.imag), a.dtype)
    tiny = _F64_TINY if a.dtype.itemsize == 8 else _F32_TINY
    wide = a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(wide) < tiny, wide * 0.0, wide).astype(a.dtype)


def _flushed_case(case):
    return dataclasses.replace(case, args=tuple(flush_subnormals(a) for a in case.args))


def _flushed_outputs(result):
    """refsim Arrays with their shards' subnormals flushed (same layout)."""
    outs = []
    for arr in as_outputs(result):
        outs.append(_Out(arr.shape, arr.dtype, [_Shard(s.device_id, s.index, flush_subnormals(s.data))
                                                for s in arr.shards], getattr(arr, "sharding", None)))
    return outs


@dataclasses.dataclass
class _Shard:
    device_id: int
    index: tuple
    data: np.ndarray


@dataclasses.dataclass
class _Out:
    shape: tuple
    dtype: object
    shards: list
    sharding: object = None


def _model_arith(case, actual):
    """XLA:CPU's float arithmetic: denormals-are-zero / flush-to-zero, and ``x + 0`` folded to
    ``x`` (so a zero result may keep the sign IEEE 754 would clear, and an output folded to an
    input keeps the input's subnormals). The model is refsim's semantics on the case's inputs
    with subnormals flushed, outputs flushed, zero signs not checked; or, for a program folded to
    no arithmetic, refsim's on the inputs as given, zero signs not checked. Plain JAX on jax 0.10.2 CPU: ``psum`` of two float32 6e-39 over 2 devices gives 0
    (their sum 1.2e-38 is normal: the inputs were flushed); ``jax.jit(lambda a: a * 2**30)(
    np.float32(1e-40))`` gives 0; ``jax.jit(lambda a: a + np.float32(0))(np.float32(-0.0))`` gives
    -0.0 (NumPy: 0.0); float16 subnormals survive (computed in float32, where they are normal)."""
    flushed = _flushed_case(case)
    res = compare(_flushed_outputs(flushed.run(refsim)), actual, tolerances=_unsigned_zeros(flushed.tolerances()))
    if res.ok:
        return res
    # A program XLA folds to no arithmetic at all (a + axis_index over a size-1 axis is a + 0,
    # folded to a) flushes nothing: its subnormal inputs come back as they went in. Such an
    # output is refsim's on the inputs as given, zero signs aside.
    return compare(case.run(refsim), actual, tolerances=_unsigned_zeros(case.tolerances()))


def _unsigned_zeros(tolerances) -> list:
    """`tolerances` with a zero's sign left unchecked (Exact and SumBound alike)."""
    return [Exact(signed_zero=False) if isinstance(t, Exact)
            else dataclasses.replace(t, signed_zero=False) if isinstance(t, SumBound) else t for t in tolerances]


def _model_max_min(case, actual):
    """XLA:CPU's all-reduce max / min: NaN ignored (the accumulator starts at -inf / +inf and
    keeps itself when a comparison with NaN is false), an all-NaN group gives -inf / +inf, of
    -0 and +0 the one first in the group wins (the comparison is strict; IEEE 754-2019 and
    StableHLO: +0 for max, -0 for min), and inputs are flushed as in `xla-cpu-arith`. Plain JAX
    on jax 0.10.2 and 0.12 CPU: ``pmax([nan, 1, ..., 7]) == 7``, ``pmax`` over a size-1 axis of
    NaN gives -inf, ``pmin([nan, nan]) == inf``, ``pmax([-0., 0.])`` is -0.0 and
    ``pmin([0., -0.])`` is +0.0 on both devices, while ``jnp.maximum(nan, 1)`` is NaN and
    ``jnp.maximum(-0., 0.)`` is +0.0. Zero signs are checked."""
    name = getattr(case, "name", "")
    if getattr(case, "family", "") == "pargmax_pargmin":
        return _model_parg(case, actual)
    if name not in ("pmax", "pmin"):
        return None
    terms = reduction_terms(case, tuple(flush_subnormals(a) for a in case.args))
    outs = []
    for arr_expected in _model_layout(case):
        shards = []
        for s in arr_expected.shards:
            t = np.asarray(terms[int(s.device_id)])
            if t.dtype.kind == "b" or t.dtype.kind in "iu":
                red = t.max(axis=0) if name == "pmax" else t.min(axis=0)
            else:
                # acc = x if x > acc else acc, in group order from -inf (+inf for min): a NaN
                # compares false and is skipped, and of two equal values (-0 and +0) the first stays
                wide = t.astype(np.float64)
                better = np.greater if name == "pmax" else np.less
                acc = np.full(wide.shape[1:], -np.inf if name == "pmax" else np.inf)
                for term in wide:
                    acc = np.where(better(term, acc), term, acc)
                red = acc.astype(t.dtype)
            shards.append(_Shard(s.device_id, s.index, np.asarray(red).reshape(np.shape(s.data))))
        outs.append(_Out(arr_expected.shape, arr_expected.dtype, shards))
    return compare(outs, actual, tolerances=Exact())


_PARG_CALL = re.compile(r"jax\._src\.lax\.parallel\.parg(max|min)\(\s*a,\s*('[^']*')\s*\)")


def _model_parg(case, actual):
    """pargmax / pargmin built as JAX builds them (pmax / pmin, ``==``, select, pmin of the
    index) on XLA:CPU's max / min all-reduce: NaN replaced by the reduction's identity before the
    reduction, inputs flushed. Plain JAX on jax 0.10.2 and 0.12 CPU, 8 devices:
    ``pargmax([nan, 1, ..., 7]) == 7`` and ``pargmin(...) == 1`` on every device (the documented
    composition gives 2**31-1), an all-NaN axis gives 2**31-1 on both. The model is refsim
    running that composition written out with the NaN-ignoring reduction."""
    dt = np.asarray(case.args[0]).dtype
    if not is_float(dt) or dt.kind == "c":
        return None

    def fix(m):
        op, ax = m.group(1), m.group(2)
        ident = "-jnp.inf" if op == "max" else "jnp.inf"
        return (f"jax.lax.pmin(jnp.where(jax.lax.p{op}(jnp.where(jnp.isnan(a), {ident}, a).astype(a.dtype), {ax}) == a, "
                f"jax.lax.axis_index({ax}), jnp.iinfo(jnp.int32).max), {ax})")
    src = _PARG_CALL.sub(fix, case.source)
    if src == case.source:
        return None
    alt = dataclasses.replace(_flushed_case(case), source=src)
    return compare(alt.run(refsim), actual, tolerances=case.tolerances())


def _model_layout(case):
    """The output layout (shapes, indices) of `case`, taken from refsim (values unused)."""
    return as_outputs(case.run(refsim))


_PERMUTE_CALL = re.compile(r"(jax\.lax\.(?:ppermute|pshuffle)\(\s*[^,()]+,\s*)(\([^()]*\))")


def _model_ppermute_mesh_order(case, actual):
    """jax 0.10's multi-axis ppermute / pshuffle: the device numbering follows the mesh's axis
    order, not the order the axes are given (``_pcollectives_lowering_common`` sorts each
    replica group; `jax.lax.ppermute` documents the given order, and 0.11+ rejects the call).
    Plain JAX on jax 0.10.2, mesh 2x2 ('x','y'): ``ppermute(a, ('y','x'), perm=[(0,1),...])``
    moves data along the ('x','y') numbering. The model is refsim on the same program with each
    ppermute / pshuffle axis tuple sorted into mesh order."""
    order = list(case.mesh.axis_names)

    def fix(m):
        axes = ast.literal_eval(m.group(2))
        return m.group(1) + repr(tuple(sorted(axes, key=order.index)))
    src = _PERMUTE_CALL.sub(fix, case.source)
    if src == case.source:
        return None
    alt = dataclasses.replace(case, source=src)
    return compare(alt.run(refsim), actual, tolerances=case.tolerances())


MODELS = {
    "xla-cpu-arith": _model_arith,
    "xla-cpu-max-min": _model_max_min,
    "jax-0.10-ppermute-mesh-order": _model_ppermute_mesh_order,
}


def check(name: str, case, actual) -> bool | None:
    """True when XLA's `actual` equals model `name`'s result for `case`, False when it does not,
    None when the model does not apply to this case (e.g. a max/min model on a psum)."""
    if name not in MODELS:
        raise ValueError(f"unknown platform model {name!r}; choose from {', '.join(MODELS)}.")
    try:
        res = MODELS[name](case, actual)
    except Exception:  # noqa: BLE001 - a model that cannot evaluate this case does not apply
        return None
    return None if res is None else bool(res.ok)
