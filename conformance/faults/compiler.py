"""Faults planted between lowering and execution, to check that `explain` says "compiler".

Each is an `edit_module(text) -> text` for `conformance.debug.explain(..., edit_module=...)`: it
rewrites the StableHLO module JAX lowered before XLA compiles it, so XLA builds and runs a
different program from the one the lowered stage interprets, as a wrong XLA pass would.
"""
from __future__ import annotations

import re

_PAIRS = re.compile(r"source_target_pairs = dense<(\[\[.*?\]\])>")


def reversed_permute_pairs(text: str) -> str:
    """Every `collective_permute` sends along its (source, target) pairs backwards."""

    def flip(m):
        pairs = re.findall(r"\[(-?\d+), (-?\d+)\]", m.group(1))
        if not pairs:
            return m.group(0)
        body = ", ".join(f"[{t}, {s}]" for s, t in pairs)
        return f"source_target_pairs = dense<[{body}]>"

    out, n = _PAIRS.subn(flip, text)
    if not n:
        raise ValueError("reversed_permute_pairs: the module has no collective_permute to edit; plant a fault "
                         "in a program that calls lax.ppermute.")
    return out


_ALL_REDUCE_ADD = re.compile(r"(\"stablehlo\.all_reduce\".*?\^bb0[^\n]*\n\s*%\S+ = )stablehlo\.add", re.S)


def all_reduce_sum_as_max(text: str) -> str:
    """The first summing `all_reduce` reduces with maximum instead (a wrong reduction computation)."""
    out, n = _ALL_REDUCE_ADD.subn(r"\1stablehlo.maximum", text, count=1)
    if not n:
        raise ValueError("all_reduce_sum_as_max: the module has no summing all_reduce; plant it in a program "
                         "that calls lax.psum.")
    return out
