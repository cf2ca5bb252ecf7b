"""Comparing two stages' values, and naming the op that introduced a difference.

`Rule` says when two values agree (`conformance.explain.tolerance`: exact where the program is
exact, else a bound scaled to each value's magnitude; or the caller's `max_ulp` / `rtol`).

`anchored_op` finds the op of the later stage that *introduced* a difference with a local check
per op: the later stage's module is interpreted again, and every op paired with a value of the
earlier stage (by the name and source line JAX and XLA record in locations) is compared with
that value and then *replaced* by it. Each paired op therefore computes from the earlier stage's
inputs, so an op downstream of a wrong one agrees again, and the first op whose own output
differs is the one that introduced the difference, not the first output that differs downstream.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from conformance.debug import diff
from conformance.explain import stages as S
from conformance.explain import tolerance as T


@dataclasses.dataclass(frozen=True)
class Rule:
    """How values are compared: mode "auto" (`tolerance`'s policy, `rounds` saying whether the
    program may round floats), "exact" (bit for bit), or "legacy" (within `max_ulp` ULPs or a
    relative error `rtol`, as the caller asked)."""

    mode: str = "auto"
    rounds: bool = True
    max_ulp: float = 0.0
    rtol: float = 0.0

    def bound(self, before: np.ndarray) -> float | None:
        if self.mode == "exact" or not self.rounds or not T._floating(before.dtype):
            return None
        return T.allowed(before)

    def describe(self) -> str:
        if self.mode == "legacy":
            return f"within {self.max_ulp:g} ULP or relative {self.rtol:g}"
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
                rel = diff.abs_error(a, b).reshape(n, -1) <= rule.rtol * (1 + np.abs(a.astype(np.float64)).reshape(n, -1))
            bad &= ~rel
    else:
        bad = T.bad_elements(a, b, rule.bound(a)).reshape(n, -1)
    worst = ulp.max(axis=1) if ulp.shape[1] else np.zeros(n)
    elements = first_elements(a, b, bad, device_ids) if bad.any() else []
    return not bool(bad.any()), {int(d): float(w) for d, w in zip(device_ids, worst)}, elements


def compare_stages(prev, cur, device_ids, rule: Rule):
    """(agree, first differing output index, {device: max ulp}, first differing elements)."""
    if len(prev.outputs) != len(cur.outputs):
        return False, 0, {}, []
    for i, (a, b) in enumerate(zip(prev.outputs, cur.outputs)):
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


def _partners(earlier: dict, program) -> dict:
    """{op index: (the earlier stage's Runs it is paired with, the op to name)}.

    Ops are grouped by the name and source line in their location (`stages.static_groups`); a
    group of the earlier stage's key is extended with the groups right after it from the same
    source line that have no partner of their own (ops a lowering emits under other names, e.g. a
    reshape after an all_gather). In each group the last op whose type is that of the partner's
    last fitting value is compared; the op named is the group's op of the partner's primitive."""
    ext: dict = {}
    current = None
    for g, ops in S.static_groups(program).items():
        if g in earlier:
            current = g
            ext[g] = list(ops)
        elif current is not None and g[0][1:] == current[0][1:]:
            ext[current].extend(ops)
        else:
            current = None
    out = {}
    for g, ops in ext.items():
        for _, runs in reversed(earlier[g]):
            ref = np.asarray(runs.value)
            fit = [o for o in ops if len(o.types) == 1 and o.types[0].dtype is not None
                   and tuple(o.types[0].shape) == ref.shape[1:] and np.dtype(o.types[0].dtype) == ref.dtype]
            if fit:
                primary = next((o for o in ops if o.loc.name == g[0][0]), fit[-1])
                out[fit[-1].index] = (runs, primary)
                break
    return out


def _anchor(ref: np.ndarray, val: np.ndarray):
    """`ref` in `val`'s form (leading device dim N or 1), or None when it cannot stand in for it."""
    if ref.shape[0] == val.shape[0]:
        return ref
    if val.shape[0] == 1:
        return ref[:1] if (ref == ref[:1]).all() or np.array_equal(ref, ref[:1], equal_nan=True) else None
    return np.broadcast_to(ref, val.shape)


def anchored_op(prev, st, device_ids, rule: Rule):
    """(op, `per_device` triple) of the first op of stage `st` whose own output differs from its
    partner in `prev` when every paired op computes from `prev`'s values (module docstring), or
    (None, None)."""
    if not prev.trace or st.rerun is None or st.program is None:
        return None, None
    partners = _partners(prev.trace, st.program)
    if not partners:
        return None, None
    seen: dict = {}
    found: list = []

    def probe(op, outs):
        pair = partners.get(op.index)
        if pair is None or not outs or not isinstance(outs[0], np.ndarray):
            return None
        runs, primary = pair
        k = seen.get(op.index, 0)
        seen[op.index] = k + 1
        if k >= len(runs):
            return None
        ref, val = np.asarray(runs[k][1]), outs[0]
        res = differs(ref, val, device_ids, rule)
        if res is None:
            return None
        if not res[0] and not found:
            found.append((primary, res))
        new = _anchor(ref, val)
        return None if new is None else [new] + list(outs[1:])

    try:
        st.rerun(probe)
    except Exception:  # noqa: BLE001 - the run only names an op; the verdict stands without it
        pass
    return found[0] if found else (None, None)


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
