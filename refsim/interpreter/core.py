"""The equation loop: evaluate a jaxpr with one NumPy rule per equation.

Every value is a stacked ndarray (``ctx.nm`` leading mesh dimensions, then the
value's own shape). The loop does no per-device work itself; rules do O(1)
NumPy calls over all devices at once.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from jax.extend.core import DropVar, Literal

from refsim.compat import physical_dtype, to_numpy
from refsim.errors import UnsupportedPrimitive
from refsim.interpreter import unreduced
from refsim.interpreter.registry import RULES, Context
from refsim.interpreter.rules.refs import RefCell
from refsim.interpreter.unreduced import Partials

# Called as hook(eqn, invals, outvals) after each equation when set in ctx.extra["probe"].
Probe = Callable[[Any, list, list], None]


def literal_value(lit, nm: int) -> np.ndarray:
    """A jaxpr literal as an array with `nm` leading size-1 mesh dimensions."""
    aval = lit.aval
    val = np.asarray(lit.val, dtype=getattr(aval, "dtype", None))
    return val.reshape((1,) * nm + val.shape)




def _check_out(eqn, i: int, out: np.ndarray, aval, nm: int) -> np.ndarray:
    """Rules must return the aval's dtype and local shape; a mismatch is a rule bug."""
    shape = getattr(aval, "shape", None)
    if shape is None:  # tokens and other non-array values pass through
        return out
    if isinstance(out, RefCell):  # a mutable reference: its storage is checked where it is written
        return out
    if isinstance(out, Partials):  # an unreduced global value: check its stacked partial sums
        _check_out(eqn, i, out.parts, aval, out.mesh.ndim)
        return out
    if not isinstance(out, np.ndarray):
        out = np.asarray(out)
    if out.ndim != nm + len(shape) or tuple(out.shape[nm:]) != tuple(shape) or out.dtype != physical_dtype(aval.dtype):
        raise AssertionError(
            f"refsim rule for {eqn.primitive.name!r} returned output {i} with shape "
            f"{out.shape} dtype {out.dtype}; expected {nm} mesh dims + {tuple(shape)} "
            f"of dtype {aval.dtype}. This is a bug in the rule."
        )
    return out


def apply_eqn(ctx: Context, eqn, invals: list) -> list:
    """Run one equation's rule (or the opt-in JAX fallback); returns the checked output list."""
    rule = RULES.get(eqn.primitive.name)
    out = None
    if rule is not None and ctx.nm == 0:
        out = unreduced.apply(ctx, eqn, invals, rule)
    if out is not None:
        pass
    elif rule is not None:
        out = rule(ctx, *invals, **eqn.params)
    elif ctx.extra.get("fallback"):
        from refsim.interpreter.fallback import evaluate_with_jax

        out = evaluate_with_jax(ctx, eqn, invals)
    else:
        raise UnsupportedPrimitive(eqn.primitive.name)
    nm = ctx.nm
    outs = list(out) if eqn.primitive.multiple_results else [out]
    outs = [_check_out(eqn, i, o, v.aval, nm) for i, (o, v) in enumerate(zip(outs, eqn.outvars))]
    probe: Probe | None = ctx.extra.get("probe")
    if probe is not None:
        probe(eqn, invals, outs)
    return outs


def eval_jaxpr(jaxpr, consts: Sequence[Any], *args: Any, ctx: Context) -> list:
    """Evaluate an (open) jaxpr on stacked values; returns the list of outputs."""
    nm = ctx.nm
    env: dict = {}

    def read(v):
        if isinstance(v, Literal):
            return literal_value(v, nm)
        return env[v]

    for var, val in zip(jaxpr.constvars, consts):
        env[var] = val
    if len(args) != len(jaxpr.invars):
        raise TypeError(f"jaxpr takes {len(jaxpr.invars)} arguments, got {len(args)}.")
    for var, val in zip(jaxpr.invars, args):
        env[var] = val
    dead_after = _dead_after(jaxpr)
    for i, eqn in enumerate(jaxpr.eqns):
        outs = apply_eqn(ctx, eqn, [read(v) for v in eqn.invars])
        for var, val in zip(eqn.outvars, outs):
            if not isinstance(var, DropVar):
                env[var] = val
        for var in dead_after[i]:
            del env[var]
    return [read(v) for v in jaxpr.outvars]


def _dead_after(jaxpr) -> list:
    """For each equation, the variables it reads for the last time (not jaxpr outputs).

    Dropping them from the environment frees a stacked intermediate as soon as nothing
    needs it, so peak memory follows the live values rather than the whole program.
    """
    last: dict = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not isinstance(v, Literal):
                last[v] = i
    for v in jaxpr.outvars:
        if not isinstance(v, Literal):
            last.pop(v, None)
    dead: list = [[] for _ in jaxpr.eqns]
    for v, i in last.items():
        dead[i].append(v)
    return dead


def eval_closed_jaxpr(closed_jaxpr, *args: Any, ctx: Context) -> list:
    """Evaluate a ClosedJaxpr; its consts are lifted to `ctx.nm` leading size-1 dims."""
    consts = [lift(c, ctx.nm) for c in closed_jaxpr.consts]
    return eval_jaxpr(closed_jaxpr.jaxpr, consts, *args, ctx=ctx)


def lift(value: Any, nm: int) -> np.ndarray:
    """A device-invariant value as a stacked array: `nm` leading size-1 dims (a view)."""
    arr = to_numpy(value)  # a closed-over JAX key array becomes refsim's structured keys
    return arr.reshape((1,) * nm + arr.shape)
