"""The equation loop: evaluate a jaxpr with one NumPy rule per equation.

Every value is a stacked ndarray (``ctx.nm`` leading mesh dimensions, then the
value's own shape). The loop does no per-device work itself; rules do O(1)
NumPy calls over all devices at once.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import numpy as np

from jax.extend.core import Literal

from refsim.compat import drop_var_type, physical_dtype, to_numpy
from refsim.errors import UnsupportedPrimitive
from refsim.interpreter import unreduced
from refsim.interpreter.registry import RULES, Context
from refsim.interpreter.rules.refs import RefCell
from refsim.interpreter.unreduced import Partials

DropVar = drop_var_type()

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


def _rule_output(ctx: Context, eqn, name: str, params: dict, invals: list, try_unreduced: bool):
    """The equation's raw output: its unreduced form where `try_unreduced` and `unreduced.apply`
    handles it, else its rule, else the opt-in JAX fallback; UnsupportedPrimitive without any."""
    rule = RULES.get(name)
    if rule is not None and try_unreduced:
        out = unreduced.apply(ctx, eqn, invals, rule)
        if out is not None:
            return out
    if rule is not None:
        return rule(ctx, *invals, **params)
    if ctx.extra.get("fallback"):
        from refsim.interpreter.fallback import evaluate_with_jax

        return evaluate_with_jax(ctx, eqn, invals)
    raise UnsupportedPrimitive(name)


def apply_eqn(ctx: Context, eqn, invals: list) -> list:
    """Run one equation's rule (or the opt-in JAX fallback); returns the checked output list."""
    out = _rule_output(ctx, eqn, eqn.primitive.name, eqn.params, invals, ctx.nm == 0)
    nm = ctx.nm
    outs = list(out) if eqn.primitive.multiple_results else [out]
    outs = [_check_out(eqn, i, o, v.aval, nm) for i, (o, v) in enumerate(zip(outs, eqn.outvars))]
    probe: Probe | None = ctx.extra.get("probe")
    if probe is not None:
        probe(eqn, invals, outs)
    return outs


def eval_jaxpr(jaxpr, consts: Sequence[Any], *args: Any, ctx: Context) -> list:
    """Evaluate an (open) jaxpr on stacked values; returns the list of outputs.

    Runs the jaxpr's `_Plan` (built once per Jaxpr object): the same rules, output checks,
    probe calls and freeing of dead values as `apply_eqn` per equation, without deriving
    them from the jaxpr again on every call (a scan body runs once per iteration).
    """
    nm = ctx.nm
    plan = _plan_of(jaxpr)
    env = [None] * plan.nslots
    for slot, val in zip(plan.const_slots, consts):
        env[slot] = val
    if len(args) != len(plan.in_slots):
        raise TypeError(f"jaxpr takes {len(plan.in_slots)} arguments, got {len(args)}.")
    for slot, val in zip(plan.in_slots, args):
        env[slot] = val
    extra = ctx.extra
    # Whether any value so far is an unreduced `Partials` (an input, or an output of an earlier
    # equation): until one is, an equation whose output types are not unreduced has nothing
    # for `unreduced.apply` to do (it would return None), so it is not called.
    partials = nm == 0 and (_any_partials(consts) or _any_partials(args))
    probe: Probe | None = extra.get("probe")   # set when the evaluation starts (api._new_extra)
    rule_of = RULES.get   # looked up per equation, not kept in the plan: a rule may be swapped (tests, faults)
    for eqn, name, multiple, params, ins, has_literal, checks, dead, unreduced_outs in plan.steps:
        if has_literal:
            invals = [env[r] if r.__class__ is int else _read_other(r, nm) for r in ins]
        else:
            invals = [env[r] for r in ins]
        rule = rule_of(name)
        if rule is not None and (nm or (unreduced_outs is False and not partials)):
            out = rule(ctx, *invals, **params)   # _rule_output's common case, without its call
        else:
            out = _rule_output(ctx, eqn, name, params, invals, nm == 0 and (unreduced_outs is not False or partials))
        # the output checks of _check_out (whose message a mismatch raises), made cheap for an
        # ndarray whose aval states its local shape and dtype; other values take its own path
        if multiple:
            outs = list(out)
            for i, (o, (slot, shape, ndim, dtype, aval)) in enumerate(zip(outs, checks)):
                if o.__class__ is not np.ndarray or dtype is None:
                    o = outs[i] = _check_out(eqn, i, o, aval, nm)
                    partials = partials or isinstance(o, Partials)
                elif o.ndim != nm + ndim or o.shape[nm:] != shape or o.dtype != dtype:
                    _check_out(eqn, i, o, aval, nm)
                if slot >= 0:
                    env[slot] = o
            del outs[len(checks):]  # as apply_eqn: one output per outvar
        else:
            slot, shape, ndim, dtype, aval = checks[0]
            if out.__class__ is not np.ndarray or dtype is None:
                out = _check_out(eqn, 0, out, aval, nm)
                partials = partials or isinstance(out, Partials)
            elif out.ndim != nm + ndim or out.shape[nm:] != shape or out.dtype != dtype:
                _check_out(eqn, 0, out, aval, nm)
            if slot >= 0:
                env[slot] = out
            outs = None
        if probe is not None:
            probe(eqn, invals, [out] if outs is None else outs)
        for slot in dead:
            env[slot] = None
    return [env[r] if r.__class__ is int else _read_other(r, nm) for r in plan.out_refs]


def _read_other(ref, nm: int):
    """A plan ref that is not a slot: a Literal's value, or a variable nothing defines (the
    KeyError a dict environment raised)."""
    if isinstance(ref, Literal):
        return literal_value(ref, nm)
    raise KeyError(ref)


def _any_partials(values) -> bool:
    for v in values:
        if isinstance(v, Partials):
            return True
    return False


class _Plan:
    """What evaluating a jaxpr derives from the jaxpr alone, once per Jaxpr object.

    Variables become slots of a list environment. Each step holds an equation, its primitive
    name, multiple_results, params, its input refs (slots; a Literal stays itself and is read
    per call), whether any input is a Literal, per output (slot or -1 for a DropVar, local
    shape, rank, physical dtype or None when `_check_out` must decide, aval), the slots it
    reads for the last time (`dead_after`), and whether an output type is unreduced (False:
    none is, True: some are, None: reading the type raised, so `unreduced.apply` decides as
    it did per call).
    """

    __slots__ = ("nslots", "const_slots", "in_slots", "steps", "out_refs")

    def __init__(self, jaxpr):
        slots: dict = {}

        def slot(v) -> int:
            s = slots.get(v)
            if s is None:
                s = slots[v] = len(slots)
            return s

        def ref(v):  # a read: a Literal, or a variable nothing defined yet (read raises KeyError)
            if isinstance(v, Literal) or v not in slots:
                return v
            return slots[v]

        self.const_slots = [slot(v) for v in jaxpr.constvars]
        self.in_slots = [slot(v) for v in jaxpr.invars]
        dead = dead_after(jaxpr)
        steps = []
        for i, eqn in enumerate(jaxpr.eqns):
            ins = [ref(v) for v in eqn.invars]
            checks = []
            for v in eqn.outvars:
                aval = v.aval
                shape = getattr(aval, "shape", None)
                dtype = None
                if shape is not None:
                    shape = tuple(shape)
                    try:
                        dtype = physical_dtype(aval.dtype)
                    except Exception:  # noqa: BLE001 - _check_out raises it (or not) per call, as before
                        dtype = None
                checks.append((-1 if isinstance(v, DropVar) else slot(v), shape,
                               None if shape is None else len(shape), dtype, aval))
            try:
                ur = any(unreduced.out_unreduced(v.aval) for v in eqn.outvars)
            except Exception:  # noqa: BLE001 - unreduced.apply raises it per call, as before
                ur = None
            steps.append((eqn, eqn.primitive.name, eqn.primitive.multiple_results, eqn.params, ins,
                          any(not isinstance(r, int) for r in ins), checks,
                          [slots[v] for v in dead[i] if v in slots], ur))
        self.steps = steps
        self.out_refs = [ref(v) for v in jaxpr.outvars]
        self.nslots = len(slots)


_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def per_jaxpr(table: "weakref.WeakKeyDictionary", jaxpr, build):
    """``table[jaxpr]``, made by ``build(jaxpr)`` on first use and kept while the Jaxpr object lives
    (made for this call only where the jaxpr cannot be weakly referenced)."""
    try:
        return table[jaxpr]
    except KeyError:
        value = table[jaxpr] = build(jaxpr)
        return value
    except TypeError:  # not weakly referenceable
        return build(jaxpr)


def _plan_of(jaxpr) -> _Plan:
    """The jaxpr's plan, built on first use and kept while the Jaxpr object lives."""
    return per_jaxpr(_PLANS, jaxpr, _Plan)


def dead_after(jaxpr) -> list:
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
