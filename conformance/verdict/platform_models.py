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
    """XLA:CPU's float arithmetic: denormals-are-zero / flush-to-zero, a sum all-reduce that starts
    from +0, and ``x + 0`` folded to ``x``. Plain JAX on jax 0.10.2 and 0.12 CPU: ``psum`` of two
    float32 6e-39 over 2 devices gives 0 (their sum 1.2e-38 is normal: the inputs were flushed);
    ``psum`` of (-0., -0.) gives +0.0 and of (-1.5e-38, 1.4e-38) gives -0.0 (the sum -1e-39
    flushed); ``jax.jit(lambda a: a * 2**30)(np.float32(1e-40))`` gives 0;
    ``jax.jit(lambda a: a + np.float32(0))(np.float32(-0.0))`` gives -0.0 (NumPy: 0.0); float16
    subnormals survive (computed in float32, where they are normal).

    The model has two halves; XLA's result must equal one of them, zero signs included:

    * computed: refsim's semantics on the case's inputs with subnormals flushed, outputs flushed,
      each output held to the case's own policy, except that a floating psum / pmean /
      psum_scatter's zero takes the sign XLA:CPU's all-reduce gives it (`_cpu_sum`: from +0, the
      members added in group order, every operand and partial sum flushed), where the spec's
      (`SumBound(signed_zero=True)`) is -0 exactly when every term is -0. ``a + axis_index``
      over a group of several devices is not folded: its zero signs are IEEE's, refsim's.
    * folded: a program XLA folds to no arithmetic, ``a + axis_index(axes)`` with the axes' total
      size 1, is the program without the ``+ axis_index(...)``: its inputs come back as they went
      in, subnormals and -0 included. (A psum / pmean over a one-member group is folded to its
      operand too, which is what the spec's sum of one term gives: no model needed.)"""
    flushed = _flushed_case(case)
    expected = _flushed_outputs(flushed.run(refsim))
    tolerances = flushed.tolerances()
    if any(isinstance(t, SumBound) for t in tolerances):
        tolerances, expected = _cpu_sum_policy(flushed, tolerances, expected)
    return _computed_or_folded(case, actual, expected, tolerances)


def _computed_or_folded(case, actual, expected, tolerances):
    """The comparison with the computed half (`expected` under `tolerances`), else, where the case
    has a ``+ axis_index`` XLA folds away, with the folded half (its own policy)."""
    res = compare(expected, actual, tolerances=tolerances)
    if res.ok:
        return res
    folded = _folded_axis_index(case)
    if folded is None:
        return res
    return compare(folded.run(refsim), actual, tolerances=case.tolerances())


_AXIS_INDEX_ADD = re.compile(r"\s*\+\s*jax\.lax\.axis_index\(\s*('[^']*'|\([^()]*\))\s*\)\.astype\(a\.dtype\)")


def _folded_axis_index(case):
    """`case` with each ``+ jax.lax.axis_index(axes).astype(a.dtype)`` over axes of total size 1
    removed (XLA folds that ``a + 0`` to ``a``); None when there is none."""
    mesh = getattr(case, "mesh", None)
    source = getattr(case, "source", None)
    if mesh is None or not source:
        return None

    def fold(m):
        axes = ast.literal_eval(m.group(1))
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        size = 1
        for a in axes:
            size *= mesh.axis_size(a)
        return "" if size == 1 else m.group(0)
    src = _AXIS_INDEX_ADD.sub(fold, source)
    return None if src == source else dataclasses.replace(case, source=src)


def _compute_dtype(dtype) -> np.dtype:
    """The type XLA:CPU adds a float dtype in: float64 for 8-byte floats (and complex128's parts),
    float32 for every narrower one (float16, bfloat16 and float8 are widened)."""
    dtype = np.dtype(dtype)
    size = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
    return np.dtype(np.float64 if size == 8 else np.float32)


def _cpu_sum(terms: np.ndarray, mean: bool) -> np.ndarray:
    """XLA:CPU's in-process sum all-reduce / reduce-scatter of the (n, ...) real or complex
    `terms` (group order): ``acc = +0``, then ``acc += terms[j]`` for j = 0 .. n-1, each addition
    in the compute type (`_compute_dtype`) with denormals-are-zero (operands flushed) and
    flush-to-zero (the result flushed, keeping its sign), rounded back to the terms' dtype; a
    mean then divides by n (flushed). A complex sum adds its parts separately. The zero signs
    this gives are the platform's: +0 + (-0) is +0, so a sum of -0 terms is +0, and a negative
    partial sum below the smallest normal flushes to -0."""
    t = np.asarray(terms)
    if t.dtype.kind == "c":
        re, im = _cpu_sum(t.real, mean), _cpu_sum(t.imag, mean)
        return complex_from_parts(re, im, t.dtype)
    ct = _compute_dtype(t.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        acc = np.zeros(t.shape[1:], t.dtype)
        for term in t:
            wide = flush_subnormals(acc.astype(ct)) + flush_subnormals(term.astype(ct))
            acc = flush_subnormals(wide).astype(t.dtype)
        if mean:
            acc = flush_subnormals(acc.astype(ct) / ct.type(t.shape[0])).astype(t.dtype)
    return acc


def _cpu_sum_policy(flushed, tolerances, expected):
    """(policies, expected outputs) of the computed half: each floating `SumBound` with its
    reference's zeros signed as `_cpu_sum` signs them and the sign checked where the element is
    exact, and refsim's (flushed) zeros given the same signs. A reference that XLA:CPU flushes (a
    nonzero sum below the smallest normal) is that signed zero."""
    sums = {}
    out_tols = []
    for k, tol in enumerate(tolerances):
        if not isinstance(tol, SumBound) or tol.integer_terms:
            out_tols.append(tol)
            continue
        terms = reduction_terms(flushed)
        cpu = {d: _cpu_sum(t, tol.mean) for d, t in terms.items()}
        exact = {d: _signed_like(np.asarray(tol.exact[d]), cpu[d]) for d in tol.exact}
        out_tols.append(dataclasses.replace(tol, exact=exact, signed_zero=True))
        sums[k] = cpu
    outs = []
    for k, arr in enumerate(expected):
        if k not in sums:
            outs.append(arr)
            continue
        shards = [_Shard(s.device_id, s.index, _signed_like(np.asarray(s.data), sums[k][int(s.device_id)]))
                  for s in arr.shards]
        outs.append(_Out(arr.shape, arr.dtype, shards, arr.sharding))
    return out_tols, outs


def _signed_like(x: np.ndarray, cpu: np.ndarray) -> np.ndarray:
    """`x` (a reference or refsim's values) with `cpu`'s signed zero wherever `cpu` is a zero and
    `x`, flushed, is too (part by part for complex values); other elements unchanged."""
    if x.dtype.kind == "c":
        return complex_from_parts(_signed_like(x.real, cpu.real), _signed_like(x.imag, cpu.imag), x.dtype)
    c = np.asarray(cpu).astype(np.float64)
    tiny = _F64_TINY if _compute_dtype(cpu.dtype) == np.float64 else _F32_TINY
    with np.errstate(invalid="ignore"):
        # in float64: compared in float16 or bfloat16 (NumPy 2 keeps a Python float's "weak" type)
        # float32's smallest normal is 0, and no -0 of those types was ever re-signed
        zero = (c == 0) & (np.abs(np.asarray(x, np.float64)) < tiny)
        return np.where(zero, np.where(np.signbit(c), -0.0, 0.0).astype(x.dtype), x).astype(x.dtype)


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


def _model_gloo_arith(case, actual):
    """`xla-cpu-arith` across processes: XLA:CPU's collectives of a `jax.distributed` run go over
    gloo (every group, also one whose devices share a process), whose sum all-reduce does not
    start from +0 (plain JAX, 2 processes x 4 CPU devices, jax 0.10.2: ``pmean`` of a replicated
    -1e-39 over 3 devices is -0.0, where the in-process all-reduce gives +0.0) and whose order of
    members is gloo's own. So here a floating psum / pmean / psum_scatter's zero sign is not
    predicted (its values are: refsim on flushed inputs within the case's bound); everything else
    is as `xla-cpu-arith` (its folded half included)."""
    flushed = _flushed_case(case)
    tolerances = [dataclasses.replace(t, signed_zero=False) if isinstance(t, SumBound) else t
                  for t in flushed.tolerances()]
    return _computed_or_folded(case, actual, _flushed_outputs(flushed.run(refsim)), tolerances)


MODELS = {
    "xla-cpu-arith": _model_arith,
    "xla-cpu-gloo-arith": _model_gloo_arith,
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
