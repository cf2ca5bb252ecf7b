"""Comparing two stages' values, and naming the op that introduced a difference.

`Rule` says when two values agree (`conformance.debug.explain.tolerance`: exact where the program is
exact, else a bound scaled to each value's magnitude; or the caller's `max_ulp` / `rtol`).

`anchored_op` finds the op of the later stage that *introduced* a difference with a local check
per op: the later stage's module is interpreted again, and every op paired with a value of the
earlier stage (by the name and source line JAX and XLA record in locations; in XLA's compiled
module, whose passes reorder and fuse ops, by location, type and evaluation order) is compared
with that value and then *replaced* by it. Each paired op therefore computes from the earlier stage's
inputs, so an op downstream of a wrong one agrees again, and the first op whose own output
differs is the one that introduced the difference, not the first output that differs downstream.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from conformance.debug import diff
from conformance.debug.explain import stages as S
from conformance.debug.explain import tolerance as T


@dataclasses.dataclass(frozen=True)
class Rule:
    """How values are compared: mode "auto" (`tolerance`'s policy, `rounds` saying whether the
    program may round floats), "exact" (bit for bit), or "legacy" (within `max_ulp` ULPs or a
    relative error `rtol`, as the caller asked)."""

    mode: str = "auto"
    rounds: bool = True
    max_ulp: float = 0.0
    rtol: float = 0.0
    #: the program's allowed set (`judge.Judge`), judging each stage's float outputs (mode "auto" only)
    judge: Any = dataclasses.field(default=None, compare=False)

    def bound(self, before: np.ndarray) -> float | None:
        if self.mode == "exact" or not self.rounds or not T._floating(before.dtype):
            return None
        return T.allowed(before)

    def describe(self) -> str:
        if self.mode == "legacy":
            return f"within {self.max_ulp:g} ULP or relative {self.rtol:g}"
        if self.judge is not None and self.judge.active:
            name = "the spec's allowed set" if self.judge.policy == "spec" else \
                "the allowed set under the platform's declared relaxations"
            return (f"float outputs held to {name} where it decides the element and is tighter; elsewhere "
                    + ("bit-exact" if not self.rounds else
                       "within 256 (float32) / 16 (narrow) units of roundoff of max|value|") + " between stages")
        if self.mode == "exact" or not self.rounds:
            return "bit-exact (the program's floating values are exact)" if self.mode == "auto" else "bit-exact"
        return "exact for exact values; floats within 256 (float32) / 16 (narrow) units of roundoff of max|value|"


def rule_for(stages, *, max_ulp: float = 0, rtol: float = 0, tolerance: str = "auto") -> Rule:
    """The rule for a program's stages: the caller's ULP / rtol when given, else `tolerance`."""
    if tolerance not in ("auto", "exact"):
        raise ValueError(f"tolerance={tolerance!r}; use 'auto' (exact where exact, else scaled to each value) or "
                         "'exact' (bit for bit).")
    if max_ulp or rtol:
        return Rule("legacy", True, float(max_ulp), float(rtol))
    programs = [s.program for s in stages if getattr(s, "program", None) is not None]
    rounds = any(T.program_rounds(p) for p in programs) if programs else True
    return Rule(tolerance, rounds)


def first_elements(a, b, bad, device_ids, limit: int = 3) -> list:
    """(device id, local index, value before, value after) of the first differing element of the
    first `limit` differing devices."""
    out = []
    for p in np.flatnonzero(bad.any(axis=1))[:limit]:
        k = int(np.flatnonzero(bad[p])[0])
        idx = np.unravel_index(k, a.shape[1:]) if a.ndim > 1 else ()
        out.append((int(device_ids[p]), tuple(int(i) for i in idx), a[p][idx].item(), b[p][idx].item()))
    return out


def per_device(a, b, device_ids, rule: Rule) -> tuple[bool, dict, list]:
    """(every device agrees under `rule`, {device id: max ULP error of its shard}, first differing
    elements) of two (N, *shard) values."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, {int(d): float("inf") for d in device_ids}, []
    n = a.shape[0]
    ulp = diff.ulp_error(a, b).reshape(n, -1)
    if rule.mode == "legacy":
        bad = ulp > rule.max_ulp
        if rule.rtol and a.dtype.kind in "fc":
            with np.errstate(all="ignore"):
                rel = diff.abs_error(a, b).reshape(n, -1) <= rule.rtol * (1 + np.abs(a).astype(np.float64).reshape(n, -1))
            bad &= ~rel
    else:
        bad = T.bad_elements(a, b, rule.bound(a)).reshape(n, -1)
    worst = ulp.max(axis=1) if ulp.shape[1] else np.zeros(n)
    elements = first_elements(a, b, bad, device_ids) if bad.any() else []
    return not bool(bad.any()), {int(d): float(w) for d, w in zip(device_ids, worst)}, elements


def compare_stages(prev, cur, device_ids, rule: Rule, left_spec: list | None = None):
    """(agree, first differing output index, {device: max ulp}, first differing elements).

    With `rule.judge` (the allowed set), an output it bounds is judged element by element
    (`judge.Judge.bad_elements`); `left_spec`, when given, receives (output, mask) of the elements
    that leave the spec's allowed set at `cur` (inside at `prev`)."""
    if len(prev.outputs) != len(cur.outputs):
        return False, 0, {}, []
    judge = rule.judge
    for i, (a, b) in enumerate(zip(prev.outputs, cur.outputs)):
        if judge is not None and i < len(judge.outputs) and judge.outputs[i] is not None \
                and np.shape(a) == np.shape(b) and np.asarray(a).dtype == np.asarray(b).dtype:
            bad, left = judge.bad_elements(prev, cur, i, rule)
            if left_spec is not None and left.any():
                left_spec.append((i, left))
            if bad.any():
                a, b = np.asarray(a), np.asarray(b)
                n = a.shape[0]
                ulp = diff.ulp_error(a, b).reshape(n, -1)
                worst = ulp.max(axis=1) if ulp.shape[1] else np.zeros(n)
                return (False, i, {int(d): float(w) for d, w in zip(device_ids, worst)},
                        first_elements(a, b, bad.reshape(n, -1), device_ids))
            continue
        ok, devs, elements = per_device(a, b, device_ids, rule)
        if not ok:
            return False, i, devs, elements
    return True, None, {}, []


def differs(ref, val, device_ids, rule: Rule):
    """None when the two traced values have different types (not comparable), else `per_device`'s triple."""
    ref, val = np.asarray(ref), np.asarray(val)
    if ref.shape[1:] != val.shape[1:] or ref.dtype != val.dtype:
        return None
    n = len(device_ids)
    if ref.shape[0] not in (1, n) or val.shape[0] not in (1, n):
        return None
    return per_device(np.broadcast_to(ref, (n,) + ref.shape[1:]), np.broadcast_to(val, (n,) + val.shape[1:]),
                      device_ids, rule)


# ops that compute nothing: never compared with an equation's value (a copy or a bitcast of a value
# has its type, and a constant is whatever the module says)
_CARRIERS = frozenset({"stablehlo.constant", "mhlo.constant", "mhlo.copy", "mhlo.bitcast", "mhlo.fusion",
                       "stablehlo.tuple", "stablehlo.get_tuple_element", "func.call", "sdy.manual_computation"})


def _fits(op, ref: np.ndarray) -> bool:
    return (op.name not in ("stablehlo.constant", "mhlo.constant") and len(op.types) == 1 and op.types[0].dtype is not None and tuple(op.types[0].shape) == ref.shape[1:]
            and np.dtype(op.types[0].dtype) == ref.dtype)


def _groups(earlier: dict, program) -> dict:
    """{earlier group: the later stage's ops that computed it}, in program order.

    Ops are grouped by the name and source line in their location (`stages.static_groups`). A
    group whose key the earlier stage has is paired with it. A group without one is paired with
    an earlier group of the same source line that has no partner either and whose value has the
    type of one of its ops (the same equation under another name: `custom_jvp_call` lowered as
    `jit(relu)`); failing that it extends the group right before it on the same line (ops a
    lowering emits under other names, e.g. a reshape after an all_gather)."""
    later = S.static_groups(program)
    spare: dict = {}
    for g in earlier:
        if g not in later:
            spare.setdefault(g[0][1:], []).append(g)
    ext: dict = {}
    current = None
    for g, ops in later.items():
        if g in earlier:
            current = g
            ext[g] = list(ops)
            continue
        line = g[0][1:]
        alias = next((e for e in spare.get(line, ())
                      if any(_fits(o, np.asarray(runs.value)) for o in ops for _, runs in earlier[e])), None)
        if alias is not None:
            spare[line].remove(alias)
            current = alias
            ext[alias] = list(ops)
        elif current is not None and line == current[0][1:]:
            ext[current].extend(ops)
        else:
            current = None
    return ext


def _result_ops(earlier: dict, program) -> dict:
    """{op index: (earlier key, the op to name)} for the ops of each group of `_groups` that compute
    the group's values: those whose type is that of one of the earlier group's values and whose
    result no other op of the group reads (a group of consecutive equations has several; a
    primitive lowered to several ops has its last). The op named is the op itself, or, when its
    location names another primitive (a reshape a faulty all_gather lowering added), the last op
    of the earlier key's primitive before it."""
    out = {}
    for g, ops in _groups(earlier, program).items():
        refs = [np.asarray(runs.value) for _, runs in earlier[g]]
        read = {slot for o in ops for slot in o.operands}
        last_own = None
        for o in ops:
            if o.loc.name == g[0][0] and (last_own is None or o.name.split(".", 1)[-1] not in _SHAPING):
                last_own = o  # the primitive's own op, not a reshape its lowering added
            if any(_fits(o, r) for r in refs) and not set(o.results) & read:
                mine = o.loc.name == g[0][0] and (o.name.split(".", 1)[-1] not in _SHAPING or last_own is None)
                out[o.index] = (g[0], o if mine or last_own is None else last_own)
    return out


# ops that only reshape or move a value: a lowering adds them around the primitive's own op
_SHAPING = frozenset({"reshape", "broadcast_in_dim", "broadcast", "transpose", "convert", "bitcast", "copy", "slice",
                      "concatenate", "pad", "constant", "reverse", "get_tuple_element", "tuple"})


def _anchor(ref: np.ndarray, val: np.ndarray):
    """`ref` in `val`'s form (leading device dim N or 1), or None when it cannot stand in for it."""
    if ref.shape[0] == val.shape[0]:
        return ref
    if val.shape[0] == 1:
        return ref[:1] if (ref == ref[:1]).all() or np.array_equal(ref, ref[:1], equal_nan=True) else None
    return np.broadcast_to(ref, val.shape)


def _queues(earlier: dict) -> dict:
    """{(name, file, line, shape, dtype): [value, ...]}: every evaluation of the earlier stage's
    values by location and type, in evaluation order."""
    flat = []
    for (key, _), entries in earlier.items():
        for _, runs in entries:
            for counter, value in runs:
                v = np.asarray(value)
                flat.append((counter, key + (v.shape[1:], v.dtype.str), v))
    out: dict = {}
    for _, k, v in sorted(flat, key=lambda t: t[0]):
        out.setdefault(k, []).append(v)
    return out


def _closest(q, val, device_ids, rule):
    """The index in `q` of the value nearest `val` (largest absolute difference), among those of its type."""
    best, where = None, 0
    for i, ref in enumerate(q):
        r = np.asarray(ref)
        if r.shape[1:] != val.shape[1:] or r.dtype != val.dtype:
            continue
        with np.errstate(all="ignore"):
            d = diff.abs_error(np.broadcast_to(r, (max(r.shape[0], val.shape[0]),) + r.shape[1:]),
                               np.broadcast_to(val, (max(r.shape[0], val.shape[0]),) + val.shape[1:]))
        d = float(np.nanmax(d)) if np.size(d) and not np.isnan(d).all() else float("inf")
        if best is None or d < best:
            best, where = d, i
    return where


def _anchored_run(prev, st, device_ids, rule: Rule, compiled: bool, results: dict, anchor=None,
                  in_order: bool = False, closest: bool = False):
    """One re-interpretation of `st` with its paired ops compared with, and (where `anchor(primary)`
    says so, default all) replaced by, `prev`'s values. Returns ([(op to name, per_device triple)]
    of the ops that differ, in evaluation order; the outputs, or None if the run failed).
    An op pairs with the first value of its key that it agrees with, else the first not yet
    taken (with `closest`, the nearest one: a rewritten op computes nearly its earlier value); with
    `in_order`, the ops `anchor` puts right take their key's values in order."""
    queues = _queues(prev.trace)
    found: list = []

    def probe(op, outs):
        if not outs or not isinstance(outs[0], np.ndarray):
            return None
        val = outs[0]
        if compiled:
            if op.name in _CARRIERS or not op.loc.name or not op.loc.file:
                return None
            key, primary = op.loc.key, op
        elif op.index in results:
            key, primary = results[op.index]
        else:
            return None
        q = queues.get(key + (val.shape[1:], val.dtype.str))
        if not q:
            return None
        pick, res = 0, None
        ordered = in_order and anchor is not None and anchor(primary)
        for i, ref in enumerate(q if not ordered else ()):
            r = differs(ref, val, device_ids, rule)
            if r is not None and r[0]:
                pick, res = i, r
                break
        if res is None and closest and not ordered:
            pick = _closest(q, val, device_ids, rule)
        ref = q.pop(pick)
        if not compiled and pick:
            del q[:pick]  # same evaluation order: the values skipped will never be paired
        if res is None:
            res = differs(ref, val, device_ids, rule)
            if res is None:
                return None
            found.append((primary, res))
        if anchor is not None and not anchor(primary):
            return None
        new = _anchor(ref, val)
        return None if new is None else [new] + list(outs[1:])

    try:
        outs = st.rerun(probe)
    except Exception:  # noqa: BLE001 - the run only names an op; the verdict stands without it
        outs = None
    return found, outs


_COLLECTIVES = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
                          "collective_broadcast", "custom_call"})


def anchored_op(prev, st, device_ids, rule: Rule):
    """(op, `per_device` triple, verified) of the op of stage `st` that introduced the difference
    from `prev`, or (None, None, False).

    Which op of the later module computes an equation's (or earlier op's) value comes from the
    groups of `_result_ops` (for the compiled module, any op that computes something, at its own
    location); which evaluation it pairs with is the first not yet taken, of the same location
    and type, that it agrees with, else the first not yet taken (passes reorder and duplicate ops,
    so evaluation order alone cannot pair them). With every pair anchored, the ops whose own output
    differs are the candidates. A collective among them is *verified* when putting right only the
    ops of its name (every evaluation of it) makes the stage's outputs agree with `prev`'s; the
    first verified collective is named (a large program's elementwise ops can be mispaired, its
    collectives, which move values between devices, rarely are), else the first collective
    candidate, else the first candidate, both unverified. (Verifying an elementwise op this way could blame an op downstream of the fault:
    putting right every evaluation of a later op also hides an earlier fault.)"""
    if not prev.trace or st.rerun is None or st.program is None:
        return None, None, False
    compiled = st.name == "compiled"
    results = {} if compiled else _result_ops(prev.trace, st.program)
    if not results and not compiled:
        return None, None, False
    found, _ = _anchored_run(prev, st, device_ids, rule, compiled, results)
    if not found:
        return None, None, False
    collectives = [(o, r) for o, r in found if o.name.split(".", 1)[-1] in _COLLECTIVES]
    for name in dict.fromkeys(o.name for o, _ in collectives):
        # Paired by agreement first (passes reorder ops), then in evaluation order: a faulty op can
        # agree with another op's value of the same key (a pipeline's reversed forward ppermute equals
        # a value of its backward one), and then only the order pairs it right.
        for in_order in (False, True):
            _, outs = _anchored_run(prev, st, device_ids, rule, compiled, results,
                                    anchor=lambda p, n=name: p.name == n, in_order=in_order)
            if outs is not None and all(per_device(a, b, device_ids, rule)[0] for a, b in zip(prev.outputs, outs)):
                op, res = next((o, r) for o, r in found if o.name == name)
                return op, res, True
    op, res = (collectives or found)[0]
    return op, res, False


def output_op(program, index: int):
    """The op of @main defining result `index`, looking through copies, bitcasts and tuples."""
    main = program.main
    slot = main.body.returns[index]
    defs = {r: op for op in main.body.ops for r in op.results}
    op = defs.get(slot)
    while op is not None and op.name in ("mhlo.copy", "mhlo.bitcast", "stablehlo.reshape", "stablehlo.tuple",
                                         "sdy.sharding_constraint", "stablehlo.custom_call",
                                         "stablehlo.get_tuple_element") and op.operands:
        nxt = defs.get(op.operands[0])
        if nxt is None:
            break
        op = nxt
    return op


# -- the op that takes a value out of the allowed set ------------------------------------------

_NOT_BLAMED = _SHAPING | {"fusion", "call", "return", "while", "if", "case", "manual_computation",
                          "optimization_barrier", "custom_call"}


def deviation_op(prev, st, device_ids, judge, output: int, mask: np.ndarray):
    """(op, how) of stage `st` responsible for the elements `mask` of `output` leaving the spec's
    allowed set (inside at stage `prev`), or (None, "").

    1. The later module is interpreted again with each paired op (as `anchored_op` pairs them, a
       changed op with its nearest earlier value) compared bit for bit with, and replaced by, the
       earlier stage's value: the ops whose own value differs are the candidates.
    2. A candidate is *verified* when putting right only its evaluations brings those elements
       back inside the spec's set; the first verified one is named.
    3. Failing that, the two modules' ops are diffed per source location: an op kind the later
       module has at a location where the earlier one had another (`divide` became `multiply`).
    """
    if st.rerun is None or st.program is None or st.name not in ("lowered", "compiled"):
        return None, ""
    exact = Rule("exact")
    compiled = st.name == "compiled"
    ob = judge.outputs[output]
    found, results = [], {}
    if prev.trace:
        results = {} if compiled else _result_ops(prev.trace, st.program)
        if compiled or results:
            found, _ = _anchored_run(prev, st, device_ids, exact, compiled, results, closest=True)
    tried = set()
    for op, _ in found:
        if op.index in tried or op.name.split(".", 1)[-1] in _NOT_BLAMED:
            continue
        tried.add(op.index)
        if len(tried) > 12:
            break
        _, outs = _anchored_run(prev, st, device_ids, exact, compiled, results, anchor=lambda p, i=op.index: p.index == i,
                                closest=True)
        if outs is None or output >= len(outs) or np.shape(outs[output]) != np.shape(ob.center):
            continue
        if ob.inside(outs[output], ob.spec)[mask].all():
            return op, (f"its value differs from the {prev.name} stage's; putting right this op alone brings "
                        "the elements back inside the spec's allowed set")
    op = module_diff_op(prev, st)
    if op is not None:
        return op, (f"the {prev.name} module computes this source line with other ops; not verified by value")
    for op, _ in found:
        if op.name.split(".", 1)[-1] not in _NOT_BLAMED:
            return op, (f"the first op whose own value differs from the {prev.name} stage's (bit for bit); "
                        "putting it right alone did not bring the elements back: not verified")
    return None, ""


def module_diff_op(prev, st):
    """The first op of `st`'s module (lowered or compiled) whose kind its source location does not have
    in `prev`'s module (its ops by location; for the jaxpr stage, no module: None), ignoring ops
    that only move or reshape values."""
    if prev.program is None or st.program is None:
        return None
    def kinds(program):
        out: dict = {}
        for (key, _), ops in S.static_groups(program).items():
            out.setdefault(key[1:], set()).update(o.name.split(".", 1)[-1] for o in ops
                                                  if o.name.split(".", 1)[-1] not in _NOT_BLAMED)
        return out
    before = kinds(prev.program)
    for (key, _), ops in S.static_groups(st.program).items():
        had = before.get(key[1:])
        if had is None:
            continue
        for o in ops:
            short = o.name.split(".", 1)[-1]
            if short not in _NOT_BLAMED and had and short not in had:
                return o
    return None


def line_change(prev, st, op) -> str:
    """What the earlier stage's module computes at `op`'s source line that the later one does not,
    and `op`'s constant operands: "stablehlo.divide at this line became stablehlo.multiply by
    constant 0.2" ("" when neither module says more)."""
    parts = []
    if prev.program is not None and st.program is not None and op.loc.file:
        line = (op.loc.file, op.loc.line)
        def kinds(program):
            return {o.name for (key, _), ops in S.static_groups(program).items() if key[1:] == tuple(line)
                    for o in ops if o.name.split(".", 1)[-1] not in _NOT_BLAMED}
        gone = sorted(kinds(prev.program) - kinds(st.program))
        if gone and op.name not in kinds(prev.program):
            parts.append(f"the {prev.name} module computes this line with {', '.join(gone)}; "
                         f"the {st.name} module with {op.name}")
    consts = _constant_operands(st.program, op) if st.program is not None else []
    if consts:
        parts.append(f"{op.name.split('.', 1)[-1]} by constant {', '.join(consts)}")
    return "; ".join(parts)


def _constant_operands(program, op) -> list:
    from refsim.stablehlo import plan

    for fn in program.funcs.values():
        ops = list(plan.walk(fn.body))
        if any(o.index == op.index for o in ops):
            defs = {r: o for o in ops for r in o.results}
            out = []
            for slot in op.operands:
                d = defs.get(slot)
                if d is not None and d.name in ("stablehlo.constant", "mhlo.constant"):
                    text = d.text.split("dense<", 1)[-1].split(">", 1)[0] if "dense<" in d.text else d.text
                    out.append(text)
            return out
    return []
