"""Which JAX primitives refsim can interpret: the rule table against the installed JAX.

JAX's primitives are enumerated from its modules (every `Primitive` instance defined
in `jax._src`), so the count tracks the installed version without a hand-kept list.
"""
from __future__ import annotations

import dataclasses

from refsim import _compat
from refsim.interpreter.registry import load_rules


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
                "missing": list(self.missing), "extra": list(self.extra)}


def coverage() -> Coverage:
    """Compare refsim's rules with every primitive the installed JAX defines."""
    rules = set(load_rules())
    prims = _compat.all_primitive_names()
    return Coverage(
        jax_version=".".join(map(str, _compat.jax_version())),
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
        lines += ["", f"without a rule ({len(cov.missing)}):", columns(cov.missing)]
    if cov.extra:
        lines += ["", f"rules for names this JAX does not define ({len(cov.extra)}):", columns(cov.extra)]
    return "\n".join(lines)
