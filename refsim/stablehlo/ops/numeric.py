"""convolution, fft, reduce_precision, rng_bit_generator and the MHLO spellings XLA's HLO
converter keeps for some elementwise ops; each evaluated by refsim's jaxpr kernel of the same
semantics (docstrings of those kernels state them)."""
from __future__ import annotations

import re

import numpy as np

from refsim.interpreter.registry import RULES
from refsim.stablehlo.ops.elementwise import _make
from refsim.stablehlo.registry import register

# HLO ops jaxlib's converter leaves in the MHLO dialect (no StableHLO equivalent at that
# version), with the jaxpr primitive whose kernel computes them.
_MHLO = {"erf": "erf", "tan": "tan", "acos": "acos", "acosh": "acosh", "asin": "asin", "asinh": "asinh",
         "atan": "atan", "atanh": "atanh", "cosh": "cosh", "sinh": "sinh", "logistic": "logistic"}
for _name, _prim in _MHLO.items():
    register(f"mhlo.{_name}")(_make(_prim))


@register("stablehlo.reduce_precision", "mhlo.reduce_precision")
def reduce_precision_rule(m, op, env, x):
    return RULES["reduce_precision"](m.ctx, x, exponent_bits=int(op.attrs["exponent_bits"]),
                                     mantissa_bits=int(op.attrs["mantissa_bits"]))


@register("stablehlo.fft")
def fft_rule(m, op, env, x):
    """FFT / IFFT / RFFT / IRFFT over the trailing `fft_length` dims (XLA's conventions)."""
    return RULES["fft"](m.ctx, x, fft_type=str(op.attrs["fft_type"]), fft_lengths=tuple(op.attrs["fft_length"]))


@register("stablehlo.rng_bit_generator")
def rng_bit_generator_rule(m, op, env, state):
    """(new state, bits) of the algorithm named (DEFAULT is XLA's: three-fry on CPU and GPU)."""
    out = op.types[1]
    return RULES["rng_bit_generator"](m.ctx, state, shape=out.shape, dtype=out.dtype,
                                      algorithm=str(op.attrs.get("rng_algorithm", "DEFAULT")))


_CONV = re.compile(r"\[([^\]]*)\]x\[([^\]]*)\]->\[([^\]]*)\]")


def conv_dimension_numbers(text: str) -> tuple:
    """`[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]` as JAX's (lhs_spec, rhs_spec, out_spec): each
    (batch or out-feature dim, feature or in-feature dim, spatial dims in order)."""
    m = _CONV.search(text)
    if m is None:
        raise ValueError(f"refsim.stablehlo: cannot read convolution dimension numbers {text!r}.")

    def spec(part: str, first: str, second: str) -> tuple:
        labels = [t.strip() for t in part.split(",")]
        spatial = sorted((int(t), i) for i, t in enumerate(labels) if t.isdigit())
        return (labels.index(first), labels.index(second), *[i for _, i in spatial])

    return spec(m.group(1), "b", "f"), spec(m.group(2), "o", "i"), spec(m.group(3), "b", "f")


@register("stablehlo.convolution")
def convolution_rule(m, op, env, lhs, rhs):
    """StableHLO convolution (cross-correlation) with strides, padding, dilations, feature and batch
    groups; `window_reversal` flips the kernel's spatial dims first."""
    a = op.attrs
    dn = conv_dimension_numbers(str(a["dimension_numbers"]))
    d = len(dn[0]) - 2
    rev = a.get("window_reversal")
    if rev is not None and any(rev):
        axes = tuple(1 + dn[1][2 + k] for k in range(d) if rev[k])
        rhs = np.flip(rhs, axes)
    pad = a.get("padding")
    pad = [tuple(int(v) for v in row) for row in np.asarray(pad).reshape(-1, 2)] if pad is not None else [(0, 0)] * d
    return RULES["conv_general_dilated"](
        m.ctx, lhs, rhs, window_strides=tuple(a.get("window_strides") or (1,) * d), padding=pad,
        lhs_dilation=tuple(a.get("lhs_dilation") or (1,) * d), rhs_dilation=tuple(a.get("rhs_dilation") or (1,) * d),
        dimension_numbers=dn, feature_group_count=int(a.get("feature_group_count", 1)),
        batch_group_count=int(a.get("batch_group_count", 1)), precision=None,
        preferred_element_type=op.types[0].dtype)
