"""Runners with a planted miscompile, to check the debugger (and to demonstrate it).

Each runner rewrites one equation of the region it is given, on the XLA side only, and
then runs `xla_runner` (plant one with ``with conformance.faults.inject(runner):``, or pass it as
`bisect(..., runner=...)`): refsim still interprets the original program, so `bisect` must
name exactly that equation. An equation is chosen by its position in the region or as
the first equation of a primitive; prefixes that stop before it run unchanged.
"""
from __future__ import annotations

from typing import Callable

from conformance.debug.region import Region, Runner, xla_runner
from conformance.faults import firing
from conformance.faults.stages import mark


def _position(region: Region, where) -> int | None:
    eqns = region.jaxpr.eqns
    if isinstance(where, int):
        return where if where < len(eqns) else None
    return next((i for i, e in enumerate(eqns) if e.primitive.name == where), None)


def rewrite(where, change: Callable[[dict], dict], runner: Runner = xla_runner, *, name: str | None = None) -> Runner:
    """A runner compiling the region with equation `where` (an index, or the first equation of a
    primitive name) bound with params `change(params)`; each prefix it changes counts as a firing
    (`conformance.faults.firing`) of fault `name` (default "rewrite WHERE")."""
    name = name or f"rewrite {where!r}"

    def run(region: Region, args):
        i = _position(region, where)
        if i is not None:
            eqn = region.jaxpr.eqns[i]
            params = dict(eqn.params)
            new = change(dict(params))
            if set(new) != set(params) or not all(firing.same_param(new[k], params[k], k) for k in new):
                firing.note(name)
                region = region.with_eqn(i, eqn.replace(params=new))
        return runner(region, args)

    return mark("jaxpr", name, f"equation {where!r} (an index, or the first of that primitive)")(run)


def _named(base: str, where, default) -> str:
    return base if where == default else f"{base}({where!r})"


def reversed_ppermute(where="ppermute") -> Runner:
    """XLA runs ppermute `where` with every (source, target) pair reversed."""
    return rewrite(where, lambda p: {**p, "perm": tuple((t, s) for s, t in p["perm"])},
                   name=_named("reversed_ppermute", where, "ppermute"))


def regrouped_psum(where="psum", groups=None) -> Runner:
    """XLA runs psum `where` with `axis_index_groups=groups` (default: each group's members rotated
    by one across groups, so every group changes; a psum with fewer than two groups is left as it
    is, and the runner does not fire)."""

    def change(p):
        g = groups
        if g is None:
            old = p["axis_index_groups"]
            if not old or len(old) < 2:
                return p
            g = tuple(tuple(old[(k + (j == 0)) % len(old)][j] for j in range(len(old[k]))) for k in range(len(old)))
        return {**p, "axis_index_groups": tuple(tuple(x) for x in g)}

    return rewrite(where, change, name=_named("regrouped_psum", where, "psum"))


reverse_first_ppermute = reversed_ppermute("ppermute")
