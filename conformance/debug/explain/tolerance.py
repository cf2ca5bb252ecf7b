"""How closely two stages' values must agree: exact where the computation is exact, else a bound
scaled to the value's magnitude (the oracle's policy, `conformance.oracle.policy`, applied per
value of the debuggers).

A value is *exact* when every op that produced it is exact on floats: data movement, selection,
comparison, max / min, conversions (one correct rounding, the same in every engine), bit
manipulation, and reductions or collectives whose body is max / min / and / or / xor. Then two
stages must agree bit for bit (NaN equal to NaN, +0 equal to -0). Any other floating value
(sums, products, dots, convolutions, transcendentals) may legitimately round differently in
each engine (summation order, fused multiply-adds, widened accumulators, a division rewritten
as a multiplication by the reciprocal), and is held to

    |after - before| <= ulps * u * max|before|     (elementwise; max over the whole value)

with u the unit roundoff of its dtype and ``ulps`` = 256 for float32 / float64 and 16 for the
narrow floats (bfloat16, float16, float8: 256 of their roundoffs would admit anything). NaN
positions must match and an infinity must be the same infinity. A wrong collective, a lost
shard or a wrong op moves values by O(1) of their scale and is far outside the bound; a healthy
float32 program's reorderings stay within a few units of the scale's roundoff.
"""
from __future__ import annotations

import numpy as np

from conformance.debug import diff
from conformance.verdict.compare import unit_roundoff
from refsim.stablehlo import plan
from refsim.stablehlo.ops.reduce import body_kind

DEFAULT_ULPS = 256
NARROW_ULPS = 16

# StableHLO / MHLO / HLO-converted ops (without their dialect) whose float results are exact
EXACT_OPS = frozenset({
    "constant", "iota", "broadcast_in_dim", "broadcast", "reshape", "transpose", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "reverse", "gather", "select", "compare", "maximum", "minimum",
    "clamp", "negate", "abs", "sign", "floor", "ceil", "round_nearest_afz", "round_nearest_even", "convert",
    "bitcast_convert", "bitcast", "copy", "tuple", "get_tuple_element", "all_gather", "all_to_all",
    "collective_permute", "collective_broadcast", "partition_id", "replica_id", "sort", "optimization_barrier",
    "while", "if", "case", "call", "fusion", "manual_computation", "sharding_constraint", "reshard",
    "propagation_barrier", "sharding_group", "is_finite", "not", "and", "or", "xor", "shift_left",
    "shift_right_logical", "shift_right_arithmetic", "popcnt", "count_leading_zeros", "real", "imag", "complex",
    "rng_bit_generator", "reduce_precision", "next_after", "remainder", "top_k", "return",
})
EXACT_CUSTOM_CALLS = frozenset({"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "mhlo.sharding", "TopK"})
_BODY_OPS = frozenset({"reduce", "all_reduce", "reduce_scatter", "reduce_window", "scatter", "select_and_scatter"})


def _floating(dtype) -> bool:
    if dtype is None:
        return False
    d = np.dtype(dtype)
    return d.kind in "fc" or d.kind == "V" and d.itemsize <= 2


def op_rounds(op) -> bool:
    """True when `op` (a `refsim.stablehlo.plan.Op`) may round a floating result."""
    if not any(_floating(t.dtype) for t in op.types):
        return False
    short = op.name.split(".", 1)[-1]
    if op.name == "stablehlo.custom_call":
        return op.attrs.get("call_target_name") not in EXACT_CUSTOM_CALLS
    if short in _BODY_OPS:
        body = op.regions[-1] if op.regions else None
        if body is not None and not body.ops and tuple(body.returns) == (body.args[-1],):
            return False  # an overwrite (scatter's set)
        kinds = {body_kind(r) for r in op.regions[-1:]}
        return not kinds <= {"max", "min", "and", "or", "xor"}
    return short not in EXACT_OPS


def program_rounds(program) -> bool:
    """True when some op of the module (`plan.Program`) may round a floating result."""
    return any(op_rounds(op) for fn in program.funcs.values() for op in plan.walk(fn.body))


def ulps_for(dtype) -> int:
    d = np.dtype(dtype)
    return DEFAULT_ULPS if d.itemsize >= 4 or d.kind == "c" else NARROW_ULPS


def allowed(before: np.ndarray, ulps: float | None = None) -> float:
    """The allowed |after - before| for every element of a rounding value: ulps * u * max|before|."""
    b = np.asarray(before)
    finite = b[np.isfinite(b)] if b.dtype.kind in "fc" else b.astype(np.float64)[np.isfinite(b.astype(np.float64))]
    scale = float(np.abs(finite.astype(np.complex128 if b.dtype.kind == "c" else np.float64)).max()) if finite.size else 0.0
    k = ulps_for(b.dtype) if ulps is None else ulps
    return k * unit_roundoff(b.dtype) * scale


def bad_elements(before: np.ndarray, after: np.ndarray, bound: float | None) -> np.ndarray:
    """Elements outside the rule: bound None is exact (bit for bit, NaN == NaN, +0 == -0), else
    |after - before| <= bound with NaN positions and infinities matching."""
    before, after = np.asarray(before), np.asarray(after)
    if bound is None or not _floating(before.dtype):
        return diff.ulp_error(before, after) > 0
    err = diff.abs_error(before, after)
    return err > bound
