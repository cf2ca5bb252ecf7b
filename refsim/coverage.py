"""Which JAX primitives refsim can interpret: the rule table against the installed JAX.

JAX's primitives are enumerated from its modules (every `Primitive` instance defined
in `jax._src`), so the count tracks the installed version without a hand-kept list.
"""
from __future__ import annotations

import dataclasses

from refsim import compat
from refsim.interpreter.registry import load_rules


# Why a JAX primitive has no refsim rule. Every name the coverage report lists as missing
# gets one of these reasons (an unlisted name reads "no rule yet").
_PALLAS = ("Pallas / Mosaic kernel language: exists only inside a pallas_call kernel body, "
           "which refsim does not interpret")
_INTERNAL = "internal to a JAX transformation or the hijax machinery: never in a jaxpr that is lowered"
_GPU = "GPU-only (cuDNN / cuBLAS-Lt custom call): no CPU lowering to compare against"
_FOREIGN = ("runs foreign code (FFI kernel, serialized StableHLO, TPU custom call): no JAX-level "
            "semantics to restate; use fallback=True")
_SHAPE_POLY = "jax.export shape polymorphism (symbolic dimensions): refsim runs concrete shapes only"
_RNG = ("the experimental philox & threefry4x32 key impls and the legacy rng_uniform: their "
        "bit layouts are not reproduced, so philox keys have no rule")
_PALLAS_NAMES = ("add_dependency", "bitcast", "core_map", "delay", "dma_start", "dma_wait",
                 "get_barrier_semaphore", "get_global", "masked_load", "masked_swap", "matmul_acc_lhs",
                 "matmul_pop", "matmul_push_rhs", "multiple_of", "num_programs", "pack_elementwise",
                 "program_id", "reciprocal", "roll", "run_scoped", "semaphore_read", "semaphore_signal",
                 "semaphore_wait", "stochastic_round", "unpack_elementwise", "with_memory_space_constraint",
                 "einshape_lo", "fusible", "custom_fusion", "pallas_call", "pack_dtype", "unpack_dtype",
                 "conv", "has_memory_space", "matmul_lhs_fifo", "matmul_pop_fifo")
_THUNKY = ("jax 0.12's experimental `thunky` GPU runtime program (thunks, PTX kernels): not a "
           "jaxpr-level SPMD program")
_INTERNAL_NAMES = ("accum_grad_in_ref", "box_get", "box_set", "new_box", "call_hi_primitive_linearized", "create_linear", "custom_lin", "jaxpr_call",
                   "log_extend", "log_read", "new_log", "trace_value", "zeros_like", "remat_opt",
                   "prng_join", "prng_random_bits", "prng_seed", "prng_split", "to_edtype", "from_edtype",
                   "broadcast_to", "pin", "unpin", "stage", "run_state", "select_and_scatter",
                   "unreachable")
_GPU_NAMES = ("cudnn_fusion", "scaled_matmul", "scaled_matmul_wrapper", "scaled_dot",
              *(f"dot_product_attention_{k}" for k in ("fwd", "bwd", "fp8_fwd", "fp8_bwd",
                                                       "fwd_wrapper", "bwd_wrapper", "fp8_fwd_wrapper",
                                                       "fp8_bwd_wrapper")))
REASONS: dict[str, str] = {
    **{n: _PALLAS for n in _PALLAS_NAMES},
    **{n: _INTERNAL for n in _INTERNAL_NAMES},
    **{n: _GPU for n in _GPU_NAMES},
    **{n: _FOREIGN for n in ("ffi_call", "buffer_callback", "call_exported", "tpu_custom_call")},
    **{n: _SHAPE_POLY for n in ("dim_as_value", "dimension_size", "shape_assertion")},
    **{n: _RNG for n in ("rng_uniform", "philox2x32", "philox4x32", "threefry4x32")},
    "check": ("jax.experimental.checkify's error check: checkify.checkify functionalizes it away; "
              "unfunctionalized it lowers to a host error callback refsim does not model"),
    "inspect_sharding": ("jax.debug.inspect_array_sharding: its callback receives the sharding XLA's "
                         "partitioner chose at compile time, which refsim has no compiler to choose"),
    "mpmd_map": "MPMD programs run through refsim.mpmd (docs/mpmd.md), not the SPMD interpreter",
}


def reason(name: str) -> str:
    """Why primitive `name` has no refsim rule."""
    if name.startswith("thunky."):
        return _THUNKY
    return REASONS.get(name, "no rule yet")


@dataclasses.dataclass(frozen=True)
class Coverage:
    """covered: JAX primitives with a rule; missing: JAX primitives without one;
    extra: rule names this JAX does not define (other JAX versions' names)."""

    jax_version: str
    covered: tuple[str, ...]
    missing: tuple[str, ...]
    extra: tuple[str, ...]

    @property
    def total(self) -> int:
        return len(self.covered) + len(self.missing)

    def as_dict(self) -> dict:
        return {"jax_version": self.jax_version, "total": self.total, "covered": list(self.covered),
                "missing": list(self.missing), "extra": list(self.extra),
                "reasons": {n: reason(n) for n in self.missing}}


def coverage() -> Coverage:
    """Compare refsim's rules with every primitive the installed JAX defines."""
    rules = set(load_rules())
    prims = compat.all_primitive_names()
    return Coverage(
        jax_version=".".join(map(str, compat.jax_version())),
        covered=tuple(sorted(prims & rules)),
        missing=tuple(sorted(prims - rules)),
        extra=tuple(sorted(rules - prims)),
    )


def render(cov: Coverage, *, show_missing: bool = True) -> str:
    """A plain-text report: counts, then the covered and missing names in columns."""
    def columns(names, width=4):
        names = list(names)
        col = max((len(n) for n in names), default=0) + 2
        rows = [names[i:i + width] for i in range(0, len(names), width)]
        return "\n".join("  " + "".join(n.ljust(col) for n in r).rstrip() for r in rows)

    lines = [
        f"refsim coverage of jax {cov.jax_version}: {len(cov.covered)} of {cov.total} primitives have a rule; "
        f"{len(cov.missing)} without one.",
        "",
        f"with a rule ({len(cov.covered)}):",
        columns(cov.covered),
    ]
    if show_missing:
        lines += ["", f"without a rule ({len(cov.missing)}), by reason:"]
        groups: dict[str, list[str]] = {}
        for n in cov.missing:
            groups.setdefault(reason(n), []).append(n)
        for why, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            lines += ["", f"- {why} ({len(names)}):", columns(names)]
    if cov.extra:
        lines += ["", f"rules for names this JAX does not define ({len(cov.extra)}):", columns(cov.extra)]
    return "\n".join(lines)
