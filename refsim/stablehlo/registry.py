"""The op table: one rule per StableHLO / sdy / mhlo / func op name.

A rule is called as ``rule(machine, op, *operands)`` and returns one stacked ndarray or a
list of them (one per result). Every value has one leading device dimension: N (the value
differs per device; N = replicas x partitions) or 1 (the same on every device).
"""
from __future__ import annotations

from typing import Any, Callable

from refsim.errors import UnsupportedPrimitive
from refsim.interpreter.registry import import_rule_modules

OPS: dict[str, Callable[..., Any]] = {}


class UnsupportedOp(UnsupportedPrimitive):
    """The module uses an op (or custom call target) that refsim.stablehlo has no rule for."""

    def __init__(self, name: str, where: str = ""):
        self.primitive = name
        self.op = name
        NotImplementedError.__init__(
            self,
            f"refsim.stablehlo has no rule for op {name!r}{' (' + where + ')' if where else ''}. Add one "
            f"with @register({name!r}) in refsim/stablehlo/ops/.")


def register(*names: str):
    """Decorator registering a rule under one or more op names (a duplicate is an error)."""

    def deco(fn):
        for name in names:
            if name in OPS:
                raise ValueError(f"op {name!r} already has a rule ({OPS[name].__module__}.{OPS[name].__qualname__}); "
                                 "remove one of the two registrations.")
            OPS[name] = fn
        return fn

    return deco


def op_key(op) -> str:
    """The name an op is looked up by: custom calls by their target (``custom_call @Sharding``)."""
    if op.name == "stablehlo.custom_call":
        return f"stablehlo.custom_call @{op.attrs.get('call_target_name', '?')}"
    return op.name


def load() -> dict:
    """The op table with every module of `refsim.stablehlo.ops` imported."""
    import_rule_modules("refsim.stablehlo.ops")
    return OPS
