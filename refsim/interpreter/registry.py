"""The rule table: one NumPy rule per JAX primitive, keyed by primitive name.

A rule is called as ``rule(ctx, *invals, **params)`` with the equation's params
exactly as JAX binds them. Every value is an ndarray whose first ``ctx.nm``
dimensions are the mesh dimensions (size 1 where the value is invariant over
that axis) followed by the value's own (local) shape. A rule returns one
ndarray, or a list of them when the primitive has multiple results, with the
same leading mesh dimensions convention.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from refsim.errors import UnsupportedPrimitive

RULES: dict[str, Callable[..., Any]] = {}


def register(*names: str):
    """Decorator registering a rule under one or more primitive names."""

    def deco(fn):
        for name in names:
            if name in RULES:
                raise ValueError(
                    f"primitive {name!r} already has a rule ({RULES[name].__module__}."
                    f"{RULES[name].__qualname__}); remove one of the two registrations."
                )
            RULES[name] = fn
        return fn

    return deco


def lookup(name: str) -> Callable[..., Any]:
    """The rule for primitive `name`; UnsupportedPrimitive naming it when there is none."""
    try:
        return RULES[name]
    except KeyError:
        raise UnsupportedPrimitive(name) from None


@functools.lru_cache(maxsize=None)
def import_rule_modules(package: str) -> None:
    """Import every public module of `package` (each registers its rules on import), once: the
    interpreter asks on every call, so later calls must not scan the package again."""
    import importlib
    import pkgutil

    pkg = importlib.import_module(package)
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")


def load_rules() -> dict[str, Callable[..., Any]]:
    """The rule table with every module of `refsim.interpreter.rules` imported."""
    import_rule_modules("refsim.interpreter.rules")
    return RULES


@dataclass
class Context:
    """What a rule may know about where it runs.

    nm: how many leading mesh dimensions every value carries (0 in global view).
    mesh: the (abstract) mesh those dimensions belong to, or None in global view.
    extra: interpreter-owned state (sub-jaxpr evaluation, fallback, probes).
    """

    nm: int = 0
    mesh: Any = None
    extra: dict = field(default_factory=dict)
