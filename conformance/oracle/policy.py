"""The tolerance policy for users' programs: exact where the result is exact, else a bound
scaled by the magnitude of the output.

A general program (matmuls, softmax, layer norm in float32) has no rigorous error bound that
refsim could compute: XLA and NumPy legitimately sum in different orders, fuse multiply-adds,
and use different exp/log/tanh approximations. So each output gets one of:

* `Exact` when the output is an integer or bool array, or when every primitive in the program
  is exact on floats (data movement, selection, comparison, min/max: `EXACT_PRIMITIVES`):
  bit-exact, NaN == NaN.
* `ScaledBound(ulps)` otherwise (floating outputs of a program that rounds): every element
  must satisfy ``|xla - refsim| <= ulps * u * max|refsim output|`` where u is the unit
  roundoff of the output dtype (2**-24 for float32) and the maximum runs over the whole
  output (all devices). The default ``ulps = 256`` admits about 1.5e-5 of the output's scale
  in float32: tens of times the reordering noise measured on the examples (a few ulps,
  docs/oracle.md), and far below what a wrong collective, a wrong device order or a lost
  shard produces (an O(1) relative error) or a matmul silently run in bfloat16 (~2**-9).
  NaN must match NaN, an infinity itself.
* For narrow floating outputs (bfloat16, float16, the float8 and float4 types) 256 of their own
  units would be useless (256 * 2**-8 is the output's whole magnitude in bfloat16), so their
  bound is the float32 one plus `NARROW_ULPS` units of the output dtype:
  ``|xla - refsim| <= (ulps * 2**-24 + NARROW_ULPS * u) * max|refsim output|``. XLA computes
  narrow floats in float32 and rounds at fusion boundaries while refsim rounds after every
  operation, so the two differ by a few roundings of the output dtype (at most 1.6 units of
  max|output| measured on a bfloat16 transformer block, docs/oracle.md); `NARROW_ULPS = 8`
  admits 3.1% of the scale in bfloat16 and 0.4% in float16, and a bfloat16 matmul off by 10%
  disagrees. In float8 (u = 2**-4 or 2**-3) eight units are half the scale or all of it: there
  the bound catches only gross errors.

This is a documented heuristic, not a proof: an output whose elements cancel to far below
its largest element may need a larger `ulps`, and a bug smaller than the bound passes.
Collective-only programs stay exact, and the built-in suites keep the rigorous
`compare.SumBound` for their sums.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from conformance.verdict import compare

#: Primitives whose floating results are exact (no rounding): the program stays bit-exact.
EXACT_PRIMITIVES = frozenset({
    # containers: exact when their bodies are (their bodies' primitives are listed too)
    "jit", "pjit", "shard_map", "closed_call", "remat2", "custom_jvp_call", "custom_vjp_call",
    "while", "cond", "scan",
    # data movement and selection
    "reshape", "transpose", "broadcast_in_dim", "squeeze", "slice", "dynamic_slice", "dynamic_update_slice",
    "concatenate", "pad", "gather", "rev", "select_n", "copy", "iota", "split", "sort", "argmax", "argmin",
    "reduce_max", "reduce_min", "cummax", "cummin", "clamp", "max", "min", "neg", "abs", "sign", "floor",
    "ceil", "round", "is_finite", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "xor",
    "shift_left", "shift_right_logical", "shift_right_arithmetic", "population_count", "clz",
    # correctly rounded in both engines: a conversion is one IEEE rounding, the same on both sides
    "convert_element_type", "bitcast_convert_type",
    "stop_gradient", "optimization_barrier", "sharding_constraint", "reshard", "device_put",
    "random_bits", "random_seed", "random_wrap", "random_unwrap", "threefry2x32",
    # collectives that move data without arithmetic
    "ppermute", "all_gather", "all_gather_invariant", "all_to_all", "ragged_all_to_all", "pmax", "pmin",
    "axis_index", "pbroadcast", "pvary",
})

DEFAULT_ULPS = 256
#: Units of roundoff of a narrow output dtype added to the float32 bound (module docstring).
NARROW_ULPS = 8


def is_narrow_float(dtype) -> bool:
    """bfloat16, float16 and the float8 / float4 types (floating, fewer than 32 bits)."""
    return compare._is_float(dtype) and np.dtype(dtype).kind != "c" and np.dtype(dtype).itemsize < 4


@dataclasses.dataclass(frozen=True)
class ScaledBound(compare.SumBound):
    """``|xla - refsim| <= ulps * u * max|refsim|`` elementwise (see the module docstring); for a
    narrow output (`narrow_ulps` > 0) ``(ulps * 2**-24 + narrow_ulps * u) * max|refsim|``.

    Built with `ScaledBound.of(refsim_output, ulps)`; `exact[d]` holds device d's refsim
    shard (float64) and `abs_sum[d]` the output-wide scale max|refsim|.
    """

    ulps: int = DEFAULT_ULPS
    narrow_ulps: int = 0

    def describe(self) -> str:
        if self.narrow_ulps:
            return (f"scaled bound: |diff| <= {self.ulps} float32 ulp + {self.narrow_ulps} ulp of the dtype, "
                    "of max|output|")
        return f"scaled bound: |diff| <= {self.ulps} ulp of max|output|"

    @classmethod
    def of(cls, array, ulps: int = DEFAULT_ULPS) -> "ScaledBound":
        # The reference is refsim's shard itself (narrow floats widened to float32, exactly):
        # no float64 copy, so a large output costs no extra full-size arrays here.
        shards = {int(s.device_id): _reference(np.asarray(s.data)) for s in array.shards}
        finite = [m for m in (_max_abs_finite(d) for d in shards.values()) if m is not None]
        scale = float(max(finite)) if finite else 0.0
        narrow = NARROW_ULPS if is_narrow_float(array.dtype) else 0
        return cls(n=1, exact=shards, abs_sum={d: np.float64(scale) for d in shards}, ulps=int(ulps),
                   narrow_ulps=narrow)

    def why(self, exact: bool = False) -> str:
        """The rule the elements outside the bound were held to (compare's mismatch text)."""
        rule = (f"({self.ulps} * 2**-24 + {self.narrow_ulps} * u)" if self.narrow_ulps else f"{self.ulps} * u")
        return (f"scaled bound: |xla - refsim| <= {rule} * max|refsim output| (max {self.scale:.6g}); "
                "a heuristic for programs that round, with refsim's value as the reference (docs/oracle.md)")

    def ulps_of(self, diff: float, out_dtype) -> float:
        """`diff` in units of roundoff of the output's scale (how much of the bound it uses)."""
        unit = compare.unit_roundoff(out_dtype) * self.scale
        return float(diff / unit) if unit > 0 else (0.0 if diff == 0 else float("inf"))

    @property
    def scale(self) -> float:
        return float(next(iter(self.abs_sum.values()), 0.0))

    def allowed(self, out_dtype) -> float:
        """The allowed |xla - refsim| for every element of an output of `out_dtype`."""
        tiny = float(compare._finfo(out_dtype).smallest_subnormal)
        if self.narrow_ulps:
            units = self.ulps * compare.unit_roundoff(np.float32) + self.narrow_ulps * compare.unit_roundoff(out_dtype)
            return units * self.scale + tiny
        return self.ulps * compare.unit_roundoff(out_dtype) * self.scale + tiny

    def reference_and_bound(self, device_id: int, out_dtype):
        """(refsim's shard, the allowed |diff|): one bound for every element, broadcast (no copy)."""
        ref = np.asarray(self.exact[device_id])
        return ref, np.broadcast_to(np.float64(self.allowed(out_dtype)), ref.shape)

    def exact_elements(self, device_id: int, out_dtype) -> np.ndarray:
        """No element is held to bit equality (refsim's value is a reference, not the exact one)."""
        return np.broadcast_to(False, np.shape(self.exact[device_id]))

    def allowed_nonfinite(self, device_id: int, out_dtype):
        """Nothing beyond what the comparison already admits: NaN where refsim has NaN, an
        infinity where refsim has that infinity (broadcast masks, no full-size arrays)."""
        shape = np.shape(self.exact[device_id])
        no = np.broadcast_to(False, shape)
        return no, no, no


def _reference(x: np.ndarray) -> np.ndarray:
    """`x` as the comparison reads it: NumPy's own float and complex types as they are, the
    ml_dtypes narrow floats (bfloat16, float8, ...) widened exactly to float32."""
    if x.dtype.kind in "fc" and x.dtype.type.__module__ == "numpy":
        return x
    return x.astype(np.float32)


def _max_abs_finite(x: np.ndarray):
    """max |x| (the modulus for complex) over the finite elements, None if there are none; for
    real x two reductions and no temporaries when every element is finite (max and min
    propagate NaN, and an infinity shows in them)."""
    if x.size == 0:
        return None
    if x.dtype.kind != "c":
        ends = (float(np.max(x)), float(np.min(x)))
        if all(np.isfinite(e) for e in ends):
            return max(abs(e) for e in ends)
    with np.errstate(invalid="ignore", over="ignore"):
        fin = np.abs(x[np.isfinite(x)])
    return float(fin.max()) if fin.size else None


def rounds(primitives) -> list[str]:
    """The primitives of a program that may round a floating result (sorted)."""
    return sorted(p for p in primitives if p not in EXACT_PRIMITIVES)


def choose(outputs, primitives, policy="auto", ulps: int = DEFAULT_ULPS) -> list:
    """One comparison policy per refsim output.

    policy: "auto" (the module docstring's rule), "exact" (bit-exact everywhere), or a
    `compare` policy object / list of them used as given.
    """
    if policy == "exact":
        return [compare.EXACT] * len(outputs)
    if policy != "auto":
        pols = list(policy) if isinstance(policy, (list, tuple)) else [policy] * len(outputs)
        if len(pols) != len(outputs):
            raise ValueError(f"policy lists {len(pols)} policies for {len(outputs)} outputs; give one per output.")
        return pols
    if isinstance(ulps, bool) or not isinstance(ulps, int) or ulps < 0:
        raise ValueError(f"ulps={ulps!r}; pass a non-negative int number of units of roundoff.")
    inexact = bool(rounds(primitives))
    out = []
    for a in outputs:
        floating = compare._is_float(a.dtype)
        out.append(ScaledBound.of(a, ulps) if floating and inexact else compare.EXACT)
    return out


# -- the allowed set (issue 39): per-element bounds where the program has bound rules ---------------
#: `policy=` values that choose the automatic policies: "auto" (the allowed set with the platform's
#: declared relaxations), "spec" (the allowed set without them: an element that agrees only under a
#: relaxation disagrees), "heuristic" (the scaled bound alone, as before the allowed set).
AUTO_POLICIES = ("auto", "spec", "heuristic")
#: The bound walk holds a float64 center and bound per element of every live value: above this
#: many input and output elements it is not run (the heuristic judges, and a note says so).
ALLOWED_SET_MAX_ELEMENTS = 1 << 24
#: Nor above this many element operations (`refsim.bounds.coverage.work_estimate`: every
#: result element, and each dot's products): the walk costs ~2.5 ns of CPU per element operation
#: and runs twice where a relaxation widened a bound, against refsim's ~0.2 ns, so a GPT-style
#: step of 3.7 M parameters (1.2e10 operations) would take 31 CPU-s where refsim takes 2.7
#: (docs/comparison.md). `$CONFORMANCE_ALLOWED_SET_MAX_WORK` changes it; `policy="spec"` runs the
#: walk whatever its size. The examples' training steps need 1e5-2e6.
ALLOWED_SET_MAX_WORK = 1 << 26
WORK_ENV = "CONFORMANCE_ALLOWED_SET_MAX_WORK"


def allowed_set_max_work() -> int:
    """`ALLOWED_SET_MAX_WORK`, or `$CONFORMANCE_ALLOWED_SET_MAX_WORK` where set to an integer."""
    import os

    value = os.environ.get(WORK_ENV, "").strip()
    try:
        return int(float(value)) if value else ALLOWED_SET_MAX_WORK
    except ValueError:
        raise ValueError(f"${WORK_ENV}={value!r} is not a number; set it to the largest number of element "
                         f"operations the bound walk may take (default {ALLOWED_SET_MAX_WORK}).") from None


def allowed_set(closed, flat_args, ref, pols, policy="auto", platform: str = "cpu"):
    """(policies, notes, bound result or None): each output `choose` held to the plain scaled
    bound gets `conformance.verdict.allowed.AllowedSet` where every primitive it depends on has a
    bound rule (else it keeps the scaled bound and a note names the primitive). A failure of the
    bound walk itself leaves every policy as it was, with a note."""
    from conformance.verdict import allowed

    if policy == "heuristic":
        return pols, [], None
    candidates = [type(p) is ScaledBound for p in pols]
    exact_int = [type(p) is compare.Exact and not compare._is_float(np.dtype(a.dtype)) and np.dtype(a.dtype).kind != "c"
                 for p, a in zip(pols, ref)]
    if any(exact_int):   # integer and bool outputs decided by float values (comparisons, roundings, branches)
        from refsim.bounds.coverage import inexact_dependence

        exact_int = [e and dep for e, dep in zip(exact_int, inexact_dependence(closed))]
    if not any(candidates) and not any(exact_int):
        return pols, [], None
    relax = () if policy == "spec" else None
    size = sum(int(np.prod(np.shape(a))) for a in (*flat_args, *ref))
    if size > ALLOWED_SET_MAX_ELEMENTS:
        return pols, [f"allowed set not computed: {size} input and output elements, above "
                      f"ALLOWED_SET_MAX_ELEMENTS = {ALLOWED_SET_MAX_ELEMENTS}: held to the heuristic"], None
    if policy != "spec":
        from refsim.bounds.coverage import work_estimate

        work, limit = work_estimate(closed), allowed_set_max_work()
        if work > limit:
            return pols, [f"allowed set not computed: its bound walk would take {work:.2g} element operations, "
                          f"above {limit:.2g} (${WORK_ENV}; policy='spec' computes it whatever its size): "
                          "held to the heuristic"], None
    try:
        out, notes, result = allowed.build(closed, flat_args, ref, candidates, pols, relaxations=relax,
                                           platform=platform)
        ints, int_notes = allowed.exact_outputs(result, ref, exact_int)
    except Exception as e:  # noqa: BLE001 - the heuristic still judges; the note says why
        return pols, [f"allowed set not computed ({type(e).__name__}: {str(e).splitlines()[0][:160]}): "
                      "held to the heuristic"], None
    return [i if i is not None else p for i, p in zip(ints, out)], notes + int_notes, result
