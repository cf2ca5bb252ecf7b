"""The bound-rule table: one rule per JAX primitive, keyed by primitive name (as refsim's
value rules are, `refsim.interpreter.registry`), filled by `register`.

A rule is called as ``rule(bctx, eqn, ins)`` with the equation (its params exactly as JAX
binds them, ``eqn.params``) and one `BVal` per operand, and returns one `BVal` (or `Unknown`)
per result. A rule registered with ``structural=True`` (calls, control flow, shard_map) also
receives `Unknown` operands and decides what they make of its results; for any other rule an
`Unknown` operand makes every result `Unknown`. A primitive without a rule makes what depends
on it `Unknown`, naming it: the verdict then falls back to the heuristic for those outputs.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from refsim.interpreter.registry import Context


@dataclasses.dataclass(frozen=True)
class Entry:
    rule: Callable[..., Any]
    structural: bool = False
    moves: bool = False      # data movement: adds no latitude of its own


BOUND_RULES: dict[str, Entry] = {}


def register(*names: str, structural: bool = False, moves: bool = False):
    """Decorator registering a bound rule under one or more primitive names (a duplicate raises);
    `moves`: the primitive only moves data (explain mode attributes nothing to it)."""

    def deco(fn):
        for name in names:
            if name in BOUND_RULES:
                old = BOUND_RULES[name].rule
                raise ValueError(f"primitive {name!r} already has a bound rule ({old.__module__}.{old.__qualname__}); "
                                 "remove one of the two registrations.")
            BOUND_RULES[name] = Entry(fn, structural, moves)
        return fn

    return deco


@dataclasses.dataclass
class BCtx:
    """Where a bound rule runs: `nm` leading mesh dims of every value, the region's `mesh`
    (None in global view), the platform relaxations in force (`relaxations`: names from
    `refsim.bounds.platform.RELAXATIONS`), and what the walk records: `used` (relaxation name ->
    labels of the equations whose bound it widened), `missing` (primitives without a rule) and,
    in explain mode, `ops` (one label per equation that contributed latitude, by op id).

    `dual`: the walk also carries every value's bound without relaxations (`BVal.strict`, where
    it differs; `refsim.bounds.walk.apply`). `touched` counts the times a relaxation in force
    changed a result (`note`, `widened`), shared by every region of one walk: an equation that
    changed it is evaluated once more without relaxations."""

    nm: int = 0
    mesh: Any = None
    relaxations: frozenset = frozenset()
    platform: str = "xla-cpu"
    explain: bool = False
    used: dict = dataclasses.field(default_factory=dict)
    ops: list = dataclasses.field(default_factory=list)
    op_ids: dict = dataclasses.field(default_factory=dict)
    constants: set = dataclasses.field(default_factory=set)
    dual: bool = False
    touched: list = dataclasses.field(default_factory=lambda: [0])
    labels: dict = dataclasses.field(default_factory=dict)   # per equation / jaxpr of this walk: label, liveness

    def region(self, nm: int, mesh) -> "BCtx":
        """The context of a manual region (shard_map body): the same records, other mesh dims."""
        return dataclasses.replace(self, nm=nm, mesh=mesh)

    def strict(self) -> "BCtx":
        """The same place without relaxations, recording nothing (the strict half of a dual walk)."""
        return dataclasses.replace(self, relaxations=frozenset(), dual=False, explain=False, used={}, ops=[],
                                   op_ids={}, touched=[0], labels={})

    def relaxed_only(self) -> "BCtx":
        """The same place and records, carrying no strict bound (a dual walk split in two)."""
        return dataclasses.replace(self, dual=False)

    def rule_context(self) -> Context:
        """A refsim value-rule Context for the same mesh dims (data movement, collectives)."""
        return Context(nm=self.nm, mesh=self.mesh, extra={})

    def label(self, eqn) -> str:
        """The equation's primitive and source line (once per equation of a walk: the walk notes
        a relaxation for many results, and reading the source line is the slow part)."""
        from refsim import compat

        key = id(eqn)
        hit = self.labels.get(key)
        if hit is None or hit[0] is not eqn:
            where = compat.eqn_source_line(eqn)
            hit = self.labels[key] = (eqn, f"{eqn.primitive.name}" + (f" at {where}" if where else ""))
        return hit[1]

    def op_id(self, eqn) -> int:
        """The id of `eqn` among the ops that contribute latitude (explain mode)."""
        key = id(eqn)
        i = self.op_ids.get(key)
        if i is None:
            i = self.op_ids[key] = len(self.ops)
            self.ops.append(self.label(eqn))
        return i

    def note(self, relaxation: str, eqn) -> None:
        """Record that `relaxation` widened the bound of `eqn`."""
        self.used.setdefault(relaxation, set()).add(self.label(eqn) if eqn is not None else "program inputs")
        self.touched[0] += 1

    def widened(self) -> None:
        """Record that a relaxation in force changed a result without naming it in the report
        (the walk without relaxations must evaluate that equation anew)."""
        self.touched[0] += 1

    def allows(self, relaxation: str) -> bool:
        return relaxation in self.relaxations
