"""Per-element bounds: the allowed set of a JAX program (docs/comparison.md, "The allowed set").

`evaluate(closed_jaxpr, args)` walks the jaxpr a second time, after refsim's own evaluation,
and gives every output element a center (its value computed in float64) and an absolute bound:
every result the specification allows -- half an ulp for each IEEE-exact operation, the
platform's accuracy for transcendentals, any order and tree of additions in reductions, dots
and all-reduces -- lies within the bound of the center, propagated through the program by
each operation's local derivatives. A NaN bound marks an undecidable element (a comparison,
branch or rounding to an integer decided by values closer than their bounds); an `Unknown`
output depends on a primitive without a bound rule (`Unknown.reasons` names it).

One rule per primitive, in `refsim.bounds.registry.BOUND_RULES` (modules under
`refsim.bounds.rules`); platform accuracy and relaxations in `refsim.bounds.platform`.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil

import numpy as np

from refsim import blas
from refsim.bounds import platform
from refsim.bounds import values as V
from refsim.bounds.coverage import unruled_primitives
from refsim.bounds.registry import BOUND_RULES, BCtx, register
from refsim.bounds.values import BVal, Unknown

__all__ = ["BOUND_RULES", "BVal", "BoundResult", "Unknown", "evaluate", "platform", "register", "unruled_primitives"]


@functools.lru_cache(maxsize=None)
def load_rules() -> dict:
    """Import every rule module once (and refsim's value rules, which the bound rules call); the table."""
    from refsim.bounds import rules
    from refsim.interpreter.registry import load_rules as load_value_rules

    load_value_rules()

    for info in sorted(pkgutil.iter_modules(rules.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"refsim.bounds.rules.{info.name}")
    return BOUND_RULES


@dataclasses.dataclass
class BoundResult:
    """The walk's outcome: one `BVal` or `Unknown` per output (global view), the relaxations
    that widened some bound (name -> labels of the equations), in explain mode the labels
    of the ops that `BVal.dom` ids refer to, and with ``strict=True`` the outputs as a walk
    without relaxations gives them (`strict_outputs`; None otherwise)."""

    outputs: list
    relaxations: frozenset
    used: dict
    ops: list
    strict_outputs: list | None = None

    def strict_result(self) -> "BoundResult":
        """The walk without relaxations, as `evaluate(..., relaxations=())` returns it (needs ``strict=True``)."""
        if self.strict_outputs is None:
            raise ValueError("this walk did not carry the strict bounds; call evaluate(..., strict=True).")
        return BoundResult(self.strict_outputs, frozenset(), {}, [])


@functools.lru_cache(maxsize=None)
def _walk():
    """The walk module, once the rules are loaded (imported on first use, not per call)."""
    load_rules()
    from refsim.bounds import walk

    return walk


def _global(x):
    """An input's global value (a refsim.Array's, checked for replicas), or None."""
    if hasattr(x, "shards"):
        try:
            return np.asarray(x)
        except Exception:  # noqa: BLE001 - replicas that disagree, unreduced partial values
            return None
    return np.asarray(x)


def evaluate(closed, args, *, relaxations=frozenset(), explain: bool = False, strict: bool = False) -> BoundResult:
    """Centers and bounds of every output of `closed` (a ClosedJaxpr) on `args` (its flat
    inputs: ndarrays or refsim.Arrays, global view). `relaxations`: names from
    `platform.RELAXATIONS` in force; `explain`: also track which op dominates each bound;
    `strict`: the same walk also gives the outputs without relaxations (`BoundResult.strict_outputs`,
    equal to a second walk with ``relaxations=()``), evaluating anew only what a relaxation changed."""
    walk = _walk()
    bctx = BCtx(relaxations=frozenset(relaxations), explain=explain, dual=bool(strict and relaxations))
    ins = []
    for a, v in zip(args, closed.jaxpr.invars):
        g = _global(a)
        if g is None:
            ins.append(Unknown(frozenset({"an input without one global value"})))
        else:
            ins.append(walk.from_value(g, walk.dtype_of(v), bctx))
    # the walk's products (several per dot_general) on one thread setting; NumPy's errstate for
    # the bounds' infinities and NaNs entered once (`values.quiet`)
    with blas.held(), V.quietly():
        outs = walk.eval_closed(bctx, closed, ins)
    strict_outs = None
    if strict:
        strict_outs = [V.strict_view(o) for o in outs]
        for o in outs:        # the results hold no reference into the walk without relaxations
            if isinstance(o, BVal):
                o.strict = None
    return BoundResult(outs, frozenset(relaxations), {k: sorted(v) for k, v in bctx.used.items()}, list(bctx.ops),
                       strict_outs)
