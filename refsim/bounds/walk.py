"""The second walk over a jaxpr: every variable's center and bound (`refsim.bounds.values`).

`eval_jaxpr` mirrors refsim's equation loop (`refsim.interpreter.core`): values are stacked
with ``bctx.nm`` leading mesh dims, one rule per equation from `BOUND_RULES`. After each rule,
`finish` applies what holds for every float result: a center past the dtype's overflow
threshold is that infinity when every allowed value overflows and undecidable when only some
do (an infinite bound: the allowed set is unbounded); a non-finite center is exact unless
undecidable or unbounded; and, where the platform flushes
subnormals (relaxation ``xla-cpu-ftz``), an allowed set holding a nonzero value below the
flush threshold also holds zero. (A data-movement result is not finished again: each of its
elements is an operand's, finished already, `_finished_copy`.) With ``bctx.dual`` the walk also
carries every value as the walk without relaxations has it (`apply`).
"""
from __future__ import annotations

from typing import Sequence

import dataclasses
import functools
import math
import weakref

import numpy as np

from jax.extend.core import Literal

from refsim import compat
from refsim.bounds import values as V
from refsim.bounds.registry import BOUND_RULES, BCtx
from refsim.bounds.values import BVal, Unknown, dtype_of
from refsim.interpreter import core
from refsim.interpreter.registry import RULES

DropVar = compat.drop_var_type()

FTZ = "xla-cpu-ftz"


def from_value(x, dtype, bctx: BCtx, note=None, origin=None) -> BVal | Unknown:
    """A program input, constant or literal as a BVal: exact as given (float64 center), except
    that where the platform reads subnormals as zero such an input may be read as zero."""
    if dtype is None:
        return Unknown(frozenset({"non-array value"}))
    if np.dtype(dtype).kind == "c":
        return Unknown(frozenset({"complex values"}))
    x = np.asarray(x)
    if x.dtype.kind == "O":
        return Unknown(frozenset({"non-array value"}))
    c = V.as_center(x, dtype)
    b = None
    if V.is_float(dtype) and bctx.allows(FTZ) and c.size:
        a = np.abs(c)
        sub = (a > 0) & (a < V.flush_threshold(dtype))
        if sub.any():
            b = np.where(sub, a, 0.0)
            bctx.note(FTZ, note)
    out = BVal(c, b, np.dtype(dtype), origin=origin)
    if b is not None and bctx.dual:
        out.strict = BVal(c, None, np.dtype(dtype), origin=origin)
    return out


def _literal(lit, bctx: BCtx):
    return from_value(core.literal_value(lit, bctx.nm), dtype_of(lit), bctx, origin="constant")


class _Plan:
    """What the walk derives from a jaxpr alone, once per Jaxpr object (kept while it lives, as
    refsim's interpreter keeps its own plan, `core.per_jaxpr`): per equation, its operands (each
    with whether it is a Literal), its results (None for a dropped one) and the variables read
    there for the last time (dropped from the environment after it)."""

    __slots__ = ("steps",)

    def __init__(self, jaxpr):
        self.steps = [(eqn, [(v, isinstance(v, Literal)) for v in eqn.invars],
                       [None if isinstance(v, DropVar) else v for v in eqn.outvars], dead)
                      for eqn, dead in zip(jaxpr.eqns, core.dead_after(jaxpr))]


_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def eval_jaxpr(bctx: BCtx, jaxpr, consts: Sequence, args: Sequence) -> list:
    """The BVal (or Unknown) of every output of the open `jaxpr` given its consts and args."""
    env: dict = {}
    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    if len(args) != len(jaxpr.invars):
        raise TypeError(f"jaxpr takes {len(jaxpr.invars)} arguments, got {len(args)}.")
    for v, x in zip(jaxpr.invars, args):
        env[v] = x

    for eqn, reads, writes, dead in core.per_jaxpr(_PLANS, jaxpr, _Plan).steps:
        outs = apply(bctx, eqn, [_literal(v, bctx) if lit else env[v] for v, lit in reads])
        for v, o in zip(writes, outs):
            if v is not None:
                env[v] = o
        for v in dead:
            env.pop(v, None)
    return [_literal(v, bctx) if isinstance(v, Literal) else env[v] for v in jaxpr.outvars]


def eval_closed(bctx: BCtx, closed, args: Sequence) -> list:
    """`eval_jaxpr` of a ClosedJaxpr: its consts (exact) lifted to the context's mesh dims."""
    jaxpr = closed.jaxpr
    consts = [from_value(core.lift(c, bctx.nm), dtype_of(v), bctx, origin="constant")
              for c, v in zip(closed.consts, jaxpr.constvars)]
    return eval_jaxpr(bctx, jaxpr, consts, args)


def run_sub(bctx: BCtx, jaxpr, args: Sequence) -> list:
    """A sub-jaxpr (Jaxpr or ClosedJaxpr) in the caller's context."""
    if hasattr(jaxpr, "consts") and hasattr(jaxpr, "jaxpr"):
        return eval_closed(bctx, jaxpr, args)
    return eval_jaxpr(bctx, jaxpr, (), args)


def _merged_unknown(ins) -> Unknown | None:
    out = None
    for x in ins:
        if isinstance(x, Unknown):
            out = x if out is None else out | x
    return out


def _has_sub_jaxprs(params) -> bool:
    for v in params.values():
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            if hasattr(x, "eqns") or hasattr(getattr(x, "jaxpr", None), "eqns"):
                return True
    return False


# elementwise primitives whose operands may differ in local rank (a rank-0 value beside rank-r ones)
_ELEMENTWISE_MIXED_RANK = frozenset({
    "add", "add_any", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2", "nextafter", "select_n",
    "and", "or", "xor", "eq", "ne", "lt", "le", "gt", "ge", "clamp"})


def _local_ranks_aligned(nm: int, ins: list) -> list:
    """`ins` with every lower-rank BVal given size-1 local dims right after the `nm` mesh dims, as
    refsim's elementwise rules do (`refsim.interpreter.rules._util.bcast_local_rank`): NumPy aligns
    from the right, so a device-varying scalar (an axis_index) beside a vector would otherwise meet
    the vector's last dim instead of the mesh dims. The reshaped value drops `alias` and `extreme`
    (relations of the old shape): that can only make a later comparison undecidable, never decided."""
    vals = [v for v in ins if isinstance(v, BVal)]
    if len(vals) < 2:
        return ins
    ranks = [np.ndim(v.center) for v in vals]
    top = max(ranks)
    if min(ranks) == top:
        return list(ins)           # one rank: nothing to lift (the loop below keeps every value)
    rank = top - nm
    out = []
    for v in ins:
        if not isinstance(v, BVal) or np.ndim(v.center) >= rank + nm or np.ndim(v.center) < nm:
            out.append(v)
            continue
        missing = rank + nm - np.ndim(v.center)

        def lift(a, missing=missing):
            a = np.asarray(a)
            return a.reshape(a.shape[:nm] + (1,) * missing + a.shape[nm:]) if a.ndim >= nm else a

        out.append(V.replaced(
            v, center=lift(v.center), bound=None if v.bound is None else lift(v.bound),
            dom=None if v.dom is None else lift(v.dom), alias=None, extreme=None, strict=None))
    return out


def apply(bctx: BCtx, eqn, ins: list) -> list:
    """One equation's results: its bound rule, the integer fallback, or Unknown naming it.

    In a dual walk (``bctx.dual``) every result also carries its value in the walk without
    relaxations (`BVal.strict`, where it differs): a structural rule passes both through its
    sub-walks; any other rule runs once, and once more on the operands' strict values without
    relaxations where an operand has one or where a relaxation changed this equation's results
    (`BCtx.touched`). Elsewhere the two walks do the same work on the same values, so they share
    one result object: the strict results are those of a second walk with ``relaxations=()``."""
    if not bctx.dual:
        return _apply(bctx, eqn, ins)
    entry = BOUND_RULES.get(eqn.primitive.name)
    if entry is not None and entry.structural:
        return _apply(bctx, eqn, ins)
    strict_ins = [V.strict_view(x) for x in ins]
    shadowed = any(s is not x for s, x in zip(strict_ins, ins))
    mark = bctx.touched[0]
    outs = _apply(bctx, eqn, ins)
    if not shadowed and bctx.touched[0] == mark:
        return outs
    return paired(outs, _apply(bctx.strict(), eqn, strict_ins), ins)


def paired(outs: list, strict_outs: list, ins=()) -> list:
    """`outs` with each result's strict value set from `strict_outs` (where it differs); a result
    that is one of `ins` is copied first, so an operand never changes."""
    res = []
    for o, s in zip(outs, strict_outs):
        if isinstance(o, BVal) and isinstance(s, BVal) and s is not o and o.strict is not s:
            if any(o is x for x in ins):
                o = dataclasses.replace(o)
            o.strict = s
        res.append(o)
    return res


def _apply(bctx: BCtx, eqn, ins: list) -> list:
    name = eqn.primitive.name
    if name in _ELEMENTWISE_MIXED_RANK and getattr(bctx, "nm", 0):
        ins = _local_ranks_aligned(bctx.nm, ins)
    n = len(eqn.outvars)
    entry = BOUND_RULES.get(name)
    unknown = _merged_unknown(ins)
    if entry is None:
        if unknown is None:
            outs = _integer_fallback(bctx, eqn, ins)
            if outs is not None:
                return outs
        return [Unknown(frozenset({name}) | (unknown.reasons if unknown else frozenset()))] * n
    if unknown is not None and not entry.structural:
        return [unknown] * n
    if not entry.structural and _complex_result(eqn):
        return [Unknown(frozenset({"complex values"}))] * n    # no rule bounds complex arithmetic
    outs = entry.rule(bctx, eqn, ins)
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    moves = entry.moves
    outs = [finish(bctx, eqn, o) if isinstance(o, BVal) and not (moves and _finished_copy(o)) else o
            for o in outs]
    if entry.structural:
        return outs
    if bctx.explain and not moves:
        for o in outs:   # an exact result still names the operation that made it
            if isinstance(o, BVal) and o.dom is None and V.is_float(o.dtype):
                o.dom = np.int32(bctx.op_id(eqn))
    for x in ins:
        if not isinstance(x, BVal) or x.origin != "constant":
            return outs
    # computed from constants only (or from nothing): XLA folds it into a constant (its rewrites see one)
    for o in outs:
        if isinstance(o, BVal):
            o.origin = "constant"
    return outs


def _complex_result(eqn) -> bool:
    """Whether a result of `eqn` is complex (a result without a dtype counts as float32)."""
    for v in eqn.outvars:
        d = dtype_of(v)
        if d is not None and d.kind == "c":
            return True
    return False


def _integer_fallback(bctx: BCtx, eqn, ins: list):
    """A primitive on integers, bools and keys only (no floats in or out, no sub-jaxprs): refsim's
    own rule on the exact values is exact. Undecidable operands make the results undecidable:
    elementwise where every operand and result has the result's shape, else everywhere."""
    rule = RULES.get(eqn.primitive.name)
    if rule is None or _has_sub_jaxprs(eqn.params):
        return None
    dts = [dtype_of(v) for v in [*eqn.invars, *eqn.outvars]]
    if any(d is None or V.is_float(d) or d.kind == "c" for d in dts):
        return None
    try:
        out = rule(bctx.rule_context(), *[x.center for x in ins], **eqn.params)
    except Exception:  # noqa: BLE001 - a rule that cannot take these values: no bound
        return None
    outs = list(out) if eqn.primitive.multiple_results else [out]
    # a rank-0 result may come back as a NumPy scalar (np.bool_ from `and` of two scalars)
    outs = [np.asarray(o) if isinstance(o, np.generic) else o for o in outs]
    if not all(isinstance(o, np.ndarray) for o in outs):
        return None
    bounds = [x.bound for x in ins if x.bound is not None]
    res = []
    for o, v in zip(outs, eqn.outvars):
        b = None
        if bounds:
            if all(np.shape(x.center) == o.shape for x in ins):
                b = V.add_bounds(*[np.broadcast_to(bb, o.shape) for bb in bounds])
            elif any(np.isnan(bb).any() for bb in bounds):
                b = np.full(o.shape, np.nan)
        const = all(x.origin == "constant" for x in ins)
        res.append(BVal(o, b, dtype_of(v), origin="constant" if const else None))
    return res


_MAX, _MIN = np.maximum.reduce, np.minimum.reduce   # np.max / np.min without their wrappers' cost


def _finished_copy(o: BVal) -> bool:
    """True for a nonempty float result of data movement: every element is an element of an operand
    (or a fill value: zero, NaN) with its bound, and every operand has been through `finish` (a
    result) or `from_value` (an input, a constant, a literal: the same flush to zero, no center past
    the overflow threshold), so `finish` would give it back unchanged: no center or center-plus-bound
    past the threshold that is not already infinite or unbounded, no element left to flush."""
    return V.is_float(o.dtype) and np.size(o.center) > 0


def _finite_below(a, b, thr) -> bool:
    """True when every |center| `a` is finite and every allowed value's magnitude is below `thr`
    (in Python floats: no NumPy scalar arithmetic, no warning to silence; NaN fails every test)."""
    amax = float(_MAX(a, axis=None))
    bmax = 0.0 if b is None else float(_MAX(b, axis=None))
    return amax + bmax < thr and math.isfinite(amax) and math.isfinite(bmax)


def finish(bctx: BCtx, eqn, o: BVal) -> BVal:
    """The rules that hold for every result (module docstring)."""
    if not V.is_float(o.dtype):
        b = o.bound
        if b is not None and not np.isnan(b).any():
            return V.replaced(o, bound=None)
        return o
    c, b = np.asarray(o.center, np.float64), o.bound
    if c.size == 0:
        return V.replaced(o, center=c, bound=None)
    a = np.abs(c)
    thr = V.overflow_threshold(o.dtype)
    if _finite_below(a, b, thr):
        # every center finite, every allowed value below the overflow threshold: only a flush
        # to zero can apply (the same result as below, in fewer passes over the arrays; finite
        # operands: nothing to silence)
        if FTZ in bctx.relaxations:
            t = V.flush_threshold(o.dtype)
            lo = a if b is None else a - b
            if _MIN(lo, axis=None) < t:
                widen = (a > (0.0 if b is None else b)) & (lo < t)
                if widen.any():
                    b = np.where(widen, a, 0.0 if b is None else b)
                    bctx.note(FTZ, eqn)
        return V.replaced(o, center=c, bound=b)
    with np.errstate(invalid="ignore", over="ignore"):
        fin = np.isfinite(c)
        hi = a if b is None else a + b
        if (np.where(fin & np.isfinite(hi), hi, 0.0) >= thr).any():
            inf = np.copysign(np.inf, c) if V.has_inf(o.dtype) else np.full(c.shape, np.nan)
            lo = a if b is None else a - b
            certain = fin & (lo >= thr)
            possible = fin & np.isfinite(hi) & (hi >= thr) & ~certain
            c = np.where(certain, inf, c)
            b = np.where(certain, 0.0, np.where(possible, np.inf, o.bound_or_zero()))
            a = np.abs(c)
            fin = np.isfinite(c)
        if b is not None and not fin.all():
            b = np.where(fin, b, np.where(np.isnan(b) | np.isinf(b), b, 0.0))
        if bctx.allows(FTZ):
            t = V.flush_threshold(o.dtype)
            bz = 0.0 if b is None else b
            widen = fin & (a > bz) & (a - bz < t)
            if widen.any():
                b = np.where(widen, a, bz)
                bctx.note(FTZ, eqn)
    return V.replaced(o, center=c, bound=b)
