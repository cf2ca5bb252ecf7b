"""Which primitives of a program the bound walk has no rule for (docs/comparison.md, "The allowed set").

`unruled_primitives(jaxpr)` reads a jaxpr statically, sub-jaxprs included, and names every
equation whose results the walk (`refsim.bounds.walk.apply`) would make `Unknown` for want of a
rule: a primitive missing from `BOUND_RULES` that the integer fallback does not cover (no float
or complex operand or result, refsim has a value rule, no sub-jaxpr), and any non-structural
equation with a complex operand or result ("complex values": no rule bounds complex arithmetic).
An output that depends on one of them is held to the heuristic; the verdict's report names it.
"""
from __future__ import annotations

import collections

from refsim.bounds import values as V
from refsim.bounds.registry import BOUND_RULES
from refsim.bounds.values import dtype_of
from refsim.interpreter.registry import RULES

COMPLEX = "complex values"


def _dtype(v):
    return dtype_of(v)


def _sub_jaxprs(params):
    for v in params.values():
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            if hasattr(x, "eqns"):
                yield x
            elif hasattr(getattr(x, "jaxpr", None), "eqns"):
                yield x.jaxpr


def _reason(eqn) -> str | None:
    name = eqn.primitive.name
    entry = BOUND_RULES.get(name)
    dts = [_dtype(v) for v in [*eqn.invars, *eqn.outvars]]
    if entry is not None:
        if not entry.structural and any(d is not None and d.kind == "c" for d in dts):
            return COMPLEX
        return None
    if name in RULES and not any(True for _ in _sub_jaxprs(eqn.params)) and \
            not any(d is None or V.is_float(d) or d.kind == "c" for d in dts):
        return None          # the integer fallback: refsim's rule on exact values
    return name


def unruled_primitives(jaxpr) -> dict[str, int]:
    """{primitive name (or "complex values"): number of equations} for the equations of
    `jaxpr` (a Jaxpr or ClosedJaxpr, sub-jaxprs included) the bound walk has no rule for;
    empty when every equation is covered."""
    from refsim.bounds import load_rules

    load_rules()
    counts: collections.Counter = collections.Counter()
    todo = [getattr(jaxpr, "jaxpr", jaxpr)]
    while todo:
        j = todo.pop()
        for eqn in j.eqns:
            why = _reason(eqn)
            if why is not None:
                counts[why] += 1
            todo.extend(_sub_jaxprs(eqn.params))
    return dict(sorted(counts.items()))


def _size(v) -> int:
    shape = getattr(getattr(v, "aval", None), "shape", ())
    n = 1
    for d in shape:
        n *= int(d) if isinstance(d, int) else 1
    return n


def work_estimate(jaxpr) -> int:
    """The element operations the bound walk would perform on `jaxpr` (a Jaxpr or ClosedJaxpr),
    read statically: every equation's result elements, and for `dot_general` its result
    elements times the contracted size (the walk forms |a| |b| products), sub-jaxprs included
    (a scan's body times its length). The walk costs about this many float64 passes' worth of
    work, a few times what refsim's own evaluation costs, so callers bound it (`conformance.oracle.
    policy.ALLOWED_SET_MAX_WORK`)."""
    total = 0
    todo = [(getattr(jaxpr, "jaxpr", jaxpr), 1)]
    while todo:
        j, times = todo.pop()
        for eqn in j.eqns:
            out = sum(_size(v) for v in eqn.outvars)
            if eqn.primitive.name == "dot_general":
                (lc, _rc), _ = eqn.params["dimension_numbers"]
                shape = getattr(eqn.invars[0].aval, "shape", ())
                k = 1
                for d in lc:
                    k *= int(shape[d])
                out *= max(1, k)
            total += out * times
            reps = int(eqn.params.get("length", 1)) if eqn.primitive.name == "scan" else 1
            todo.extend((s, times * reps) for s in _sub_jaxprs(eqn.params))
    return total


def _inexact(v) -> bool:
    d = _dtype(v)
    return d is not None and (V.is_float(d) or d.kind == "c")


def _has_inexact_values(jaxpr) -> bool:
    todo = [jaxpr]
    while todo:
        j = todo.pop()
        if any(_inexact(v) for v in j.invars) or any(_inexact(v) for e in j.eqns for v in e.outvars):
            return True
        for eqn in j.eqns:
            todo.extend(_sub_jaxprs(eqn.params))
    return False


def inexact_dependence(jaxpr) -> list[bool]:
    """Per output of `jaxpr` (a Jaxpr or ClosedJaxpr): whether its value may depend on a float or
    complex value, read statically. Conservative: every result of an equation depends on all its
    operands, and on any float or complex value inside its sub-jaxprs (a loop's trip count or a
    branch taken may turn on one). An integer or bool output that does is exact only where the
    comparisons, roundings and branches deciding it are decided (the allowed set says where)."""
    from jax.extend.core import Literal

    j = getattr(jaxpr, "jaxpr", jaxpr)
    dep: dict = {}
    for v in j.invars:
        dep[v] = _inexact(v)
    for v in getattr(j, "constvars", ()):
        dep[v] = _inexact(v)
    for eqn in j.eqns:
        d = any(_inexact(v) if isinstance(v, Literal) else dep.get(v, _inexact(v)) for v in eqn.invars)
        d = d or any(_has_inexact_values(s) for s in _sub_jaxprs(eqn.params))
        for v in eqn.outvars:
            dep[v] = d or _inexact(v)
    return [(_inexact(v) if isinstance(v, Literal) else dep.get(v, _inexact(v))) for v in j.outvars]
