"""The allowed set as a comparison policy (docs/comparison.md, "The allowed set").

`build` walks a program's jaxpr a second time (`refsim.bounds.evaluate`) and, for each
floating output whose every contributing primitive has a bound rule, replaces the heuristic
policy by `AllowedSet`: per element, XLA's value must lie within the element's own bound of
its exact value (float64 center), so the verdict is per element:

* **agree**: |xla - center| <= bound;
* **disagree**: outside, reported with the bound and how it was derived (in explain mode, the
  op whose latitude dominates the element's bound);
* **undecidable**: a comparison, branch or rounding to an integer that the element depends on
  was decided by values closer than their bounds, so the spec allows either outcome and no
  bound holds: counted and reported, never a failure and never a pass (the element is not
  held to anything; the strategies should draw data that decides it).

Each decided element is held to the tighter of two rules: its allowed set (rigorous: a
disagreement is a result no implementation of the spec may give) or, where that bound is
wider, the heuristic (`fallback`: 256 units of roundoff of max|output|, refsim's value as the
reference). Worst-case bounds compound through deep programs (a training step's gradients get
bounds far above what any implementation shows; an interval that reaches a singularity, a
divisor that may be zero, makes the allowed set unbounded), and the heuristic there is today's
check: keeping it where it is tighter loses none of today's sensitivity, and the report counts
those elements.

Relaxations (`refsim.bounds.platform.RELAXATIONS`) in force widen the bounds of the ops they
cover; where one did and some output has an element held to its allowed set, the walk is
repeated without them and every such element that agrees only under a relaxation is counted per
output and shown in the report with the relaxation's name. (An element held to the heuristic or
undecidable is never asked about its bound without relaxations: where no element of any output
is held to the allowed set, as in the examples' training steps, the repeat is skipped.)
Outputs that depend on a primitive without a bound rule keep their heuristic policy, and the
report names the primitive ("no bound rule for X").
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Mapping

import numpy as np

from conformance.verdict import compare
from conformance.verdict.elements import sum_ok
from refsim import bounds as refsim_bounds
from refsim.bounds import platform as bounds_platform

_MARGIN = 1 + 2.0 ** -40   # the bound's own rounding in float64


@dataclasses.dataclass(frozen=True)
class AllowedSet(compare.SumBound):
    """Per element: |result - center| <= bound (module docstring). `exact` holds each device's
    center, `abs_sum` its bound (NaN: undecidable); `fallback_ref` / `fallback_allowed` the
    heuristic's reference (refsim's values) and allowed |diff| for undecidable elements (one number,
    or per device an array of per-element allowances: a stated per-element tolerance);
    `strict` each device's bound without relaxations (None: no relaxation widened it, or no
    element is held to the allowed set, `governed`, so none would read it);
    `derivation` how the bound was derived (the report's text); `scale` max|refsim output|."""

    elementwise_arrays: ClassVar[bool] = False
    #: integer and bool outputs too (`exact_outputs`): decided elements exact, undecided ones free
    holds_integers: ClassVar[bool] = True

    fallback_ref: Mapping[int, np.ndarray] | None = None
    fallback_allowed: float | Mapping[int, np.ndarray] = 0.0
    strict: Mapping[int, np.ndarray] | None = None
    derivation: str = ""
    scale: float = 0.0
    relaxations: tuple = ()
    fallback_describe: str = ""
    fallback_why: str = ""
    #: undecidable elements held to the fallback (the sharded value model) instead of not judged
    judge_undecidable: bool = False

    def describe(self) -> str:
        """The rule the output's elements are held to: the allowed set, the heuristic (where it is
        tighter everywhere, or undecidable), or each where it is tighter."""
        use = [self.governed(d) for d in self.abs_sum]
        n_allowed = sum(int(u.sum()) for u in use)
        total = sum(u.size for u in use)
        allowed = "allowed set: |xla - exact| <= per-element bound from the program"
        if n_allowed == total:
            return allowed
        if n_allowed == 0 and self.fallback_describe and not all(np.isnan(np.asarray(b)).all()
                                                                 for b in self.abs_sum.values()):
            return self.fallback_describe
        return f"{allowed} where tighter, else {self.fallback_describe or 'the heuristic'}"

    def why(self, exact: bool = False) -> str:
        text = ("allowed set: every result the spec allows lies within the element's bound of the exact value "
                "(float64), the bound carried through the program op by op (0.5 ulp per IEEE operation, the "
                "platform's transcendental accuracy, any order of additions in sums and dots)"
                + (f"; {self.derivation}" if self.derivation else ""))
        if self.fallback_why:
            text += f". Elements where that bound is wider are held to the {self.fallback_why}"
        return text

    def exact_elements(self, device_id: int, out_dtype) -> np.ndarray:
        return np.zeros(np.shape(self.exact[device_id]), bool)

    def fallback_bound(self, device_id: int):
        """The fallback's allowed |diff| on device `device_id`: a number, or an array per element."""
        fa = self.fallback_allowed
        return np.asarray(fa[device_id], np.float64) if isinstance(fa, Mapping) else fa

    def _undecidable(self, device_id):
        return np.isnan(self.abs_sum[device_id])

    def governed(self, device_id: int) -> np.ndarray:
        """Per element: True where the allowed set is the rule (decided, and its bound is the
        tighter of the two), False where the heuristic is (undecidable, or tighter there)."""
        b = np.asarray(self.abs_sum[device_id], np.float64)
        with np.errstate(invalid="ignore"):
            return ~np.isnan(b) & (b * _MARGIN <= self.fallback_bound(device_id))

    def reference_and_bound(self, device_id: int, out_dtype):
        """(reference, allowed |diff|): the center and its bound where the allowed set governs,
        refsim's value and the heuristic's bound where that is tighter, and for undecidable
        elements refsim's value with an infinite bound (nothing is asked of them)."""
        c = np.asarray(self.exact[device_id], np.float64)
        b = np.asarray(self.abs_sum[device_id], np.float64)
        use = self.governed(device_id)
        if use.all():
            return c.copy(), b * _MARGIN
        und = np.isnan(b) & (not self.judge_undecidable)
        with np.errstate(invalid="ignore"):
            ref = np.where(use, c, np.asarray(self.fallback_ref[device_id], np.float64))
            bound = np.where(use, b * _MARGIN, np.where(und, np.inf, self.fallback_bound(device_id)))
        return ref, bound

    def allowed_nonfinite(self, device_id: int, out_dtype):
        """An undecidable element may be anything, NaN and infinities included (unless
        `judge_undecidable`: then it is held to the fallback, non-finite where refsim's is)."""
        und = np.isnan(np.asarray(self.abs_sum[device_id], np.float64)) & (not self.judge_undecidable)
        return und, und, und

    def check_arrays(self, device_id: int, out_dtype) -> dict:
        ref, bound = self.reference_and_bound(device_id, out_dtype)
        pinf, ninf, nan = self.allowed_nonfinite(device_id, out_dtype)
        no = np.zeros(ref.shape, bool)
        return {"ref": ref, "bound": bound, "exact": no, "pinf": pinf, "ninf": ninf, "nan": nan, "signed_zero": no}

    # -- what OutputSummary reads (as of ScaledBound) --------------------------------------
    def allowed(self, out_dtype) -> float:
        """The largest allowed |diff| over the decided elements (each its own rule's)."""
        worst = 0.0
        for d, b in self.abs_sum.items():
            b = np.asarray(b, np.float64)
            use = self.governed(d)
            if use.any():
                worst = max(worst, float(b[use].max()))
            rest = ~use & (~np.isnan(b) | self.judge_undecidable)   # undecidable ones too where judged
            if rest.any():
                worst = max(worst, float(np.max(np.broadcast_to(self.fallback_bound(d), b.shape)[rest])))
        return worst

    def ulps_of(self, diff: float, out_dtype) -> float | None:
        if not compare._is_float(np.dtype(out_dtype)):
            return None                # an integer or bool output (`exact_outputs`): no ulps
        unit = compare.unit_roundoff(out_dtype) * self.scale
        return float(diff / unit) if unit > 0 else (0.0 if diff == 0 else float("inf"))


@dataclasses.dataclass
class OutputVerdict:
    """Per output: elements agreeing, undecidable, agreeing only under a relaxation, outside;
    the worst |xla - center| / bound over the decided elements and where."""

    index: int
    elements: int = 0
    heuristic: int = 0
    undecidable: int = 0
    relaxed_only: int = 0
    outside: int = 0
    worst_ratio: float = 0.0
    worst_at: tuple | None = None
    relaxed_example: str = ""

    def line(self, path: str = "") -> str:
        name = f"output {self.index}" + (f" {path}" if path else "")
        held = self.elements - self.undecidable - self.heuristic
        text = (f"{name}: allowed set for {held} of {self.elements} element(s), worst |xla - exact| / bound "
                f"{self.worst_ratio:.3g}")
        if self.worst_at is not None:
            text += f" (device {self.worst_at[0]}, element {self.worst_at[1]})"
        if self.heuristic:
            text += (f"; {self.heuristic} held to the heuristic, tighter there than the rigorous bound "
                     "(worst cases compounded through the program, or unbounded)")
        if self.undecidable:
            text += f"; {self.undecidable} undecidable (decided by values closer than their bounds: not judged)"
        if self.relaxed_only:
            text += f"; {self.relaxed_only} agree only under a relaxation ({self.relaxed_example})"
        if self.outside:
            text += f"; {self.outside} outside"
        return text


def _shard_slice(x: np.ndarray, index) -> np.ndarray:
    return np.asarray(x[tuple(index)] if len(tuple(index)) else x)


def _policies_from(result, ref, candidates, fallbacks, derivations=None) -> tuple[list, list]:
    """(per-output AllowedSet or None, notes) from a `refsim.bounds` result."""
    pols, notes = [], []
    for k, (arr, cand) in enumerate(zip(ref, candidates)):
        if not cand:
            pols.append(None)
            continue
        out = result.outputs[k]
        if not isinstance(out, refsim_bounds.BVal):
            why = ", ".join(sorted(getattr(out, "reasons", ()) or {"?"}))
            notes.append(f"output {k}: no bound rule for {why}: held to the heuristic")
            pols.append(None)
            continue
        if tuple(np.shape(out.center)) != tuple(arr.shape):
            notes.append(f"output {k}: the bound walk's shape {np.shape(out.center)} is not the output's "
                         f"{tuple(arr.shape)}: held to the heuristic")
            pols.append(None)
            continue
        full_b = out.full_bound()
        centers, bounds, fref = {}, {}, {}
        for sh in arr.shards:
            d = int(sh.device_id)
            centers[d] = _shard_slice(out.center, sh.index)
            bounds[d] = _shard_slice(full_b, sh.index)
            fref[d] = np.asarray(sh.data)
        fb = fallbacks[k]
        # a fallback with a bound per element (a stated tolerance) keeps it; else its one number
        per_element = getattr(fb, "per_element_allowed", None)
        pols.append(AllowedSet(n=1, exact=centers, abs_sum=bounds, fallback_ref=fref,
                               fallback_allowed=per_element() if per_element else float(fb.allowed(arr.dtype)),
                               derivation="" if derivations is None else derivations.get(k, ""),
                               scale=float(getattr(fb, "scale", 0.0)), relaxations=tuple(sorted(result.used)),
                               fallback_describe=fb.describe(), fallback_why=_why(fb)))
    return pols, notes


def exact_outputs(result, ref, candidates) -> tuple[list, list]:
    """(per-output AllowedSet or None, notes) for the integer and bool outputs held exact whose
    value may depend on float or complex values (`candidates[k]`; `refsim.bounds.coverage.
    inexact_dependence`): an element the walk decides (bound 0) stays exact; one a comparison,
    rounding or branch decided by values closer than their bounds (NaN) is undecidable; and where
    the walk has no bound for the output at all (a primitive without a rule, complex values), every
    element is: nothing says which values the spec allows there (a `while` loop's trip count that
    turns on a complex residual, say). None keeps the exact policy."""
    pols, notes = [], []
    for k, (arr, cand) in enumerate(zip(ref, candidates)):
        out = result.outputs[k] if cand else None
        if out is None:
            pols.append(None)
            continue
        shards = {int(sh.device_id): sh for sh in arr.shards}
        fref = {d: np.asarray(sh.data) for d, sh in shards.items()}
        common = dict(n=1, fallback_ref=fref, fallback_allowed=0.0, fallback_describe=compare.EXACT.describe(),
                      fallback_why=compare.EXACT.why(), relaxations=tuple(sorted(result.used)))
        if not isinstance(out, refsim_bounds.BVal):
            why = ", ".join(sorted(getattr(out, "reasons", ()) or {"?"}))
            notes.append(f"output {k}: {arr.dtype} decided by values without a bound rule ({why}): undecidable, "
                         "not compared")
            pols.append(AllowedSet(exact={d: x.astype(np.float64) for d, x in fref.items()},
                                   abs_sum={d: np.full(x.shape, np.nan) for d, x in fref.items()},
                                   derivation=f"decided by values without a bound rule ({why})", **common))
            continue
        if out.bound is None or tuple(np.shape(out.center)) != tuple(arr.shape):
            pols.append(None)
            continue
        full_b = out.full_bound()
        if not np.any(np.asarray(full_b) != 0):
            pols.append(None)
            continue
        pols.append(AllowedSet(exact={d: _shard_slice(out.center, sh.index) for d, sh in shards.items()},
                               abs_sum={d: _shard_slice(full_b, sh.index) for d, sh in shards.items()},
                               derivation="decided by comparisons, roundings or branches of bounded values",
                               **common))
    return pols, notes


def _holds_any(p) -> bool:
    """True when some element of `p` (an AllowedSet) is held to its allowed set."""
    return isinstance(p, AllowedSet) and any(p.governed(d).any() for d in p.abs_sum)


def _with_strict(pols: list, strict_result, ref) -> list:
    """Each AllowedSet that holds some element to its allowed set, with each device's bound without
    relaxations from `strict_result` (a walk with ``relaxations=()``)."""
    out = []
    for k, (p, arr) in enumerate(zip(pols, ref)):
        s_out = strict_result.outputs[k]
        if _holds_any(p) and isinstance(s_out, refsim_bounds.BVal):
            full = s_out.full_bound()
            p = dataclasses.replace(p, strict={int(sh.device_id): _shard_slice(full, sh.index) for sh in arr.shards})
        out.append(p)
    return out


def _why(policy) -> str:
    try:
        return policy.why(False)
    except TypeError:
        return policy.why()


def _relaxation_notes(result) -> list:
    notes = []
    for name, where in sorted(result.used.items()):
        r = bounds_platform.RELAXATIONS.get(name)
        ops = ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
        doc = "" if r is None else (" (documented)" if r.documented else " (not documented by the platform)")
        notes.append(f"relaxation {name}{doc} widened the bound of {ops}")
    return notes


def build(closed, flat_args, ref, candidates, fallbacks, *, relaxations=None, platform: str = "cpu"):
    """(policies, notes, result): for each output k with `candidates[k]` an `AllowedSet` where the
    walk bounds it (else `fallbacks[k]`, the heuristic, unchanged), the report's notes (missing
    rules, relaxations used) and the walk's result. `relaxations`: names in force (default: the
    platform's, `refsim.bounds.platform.default_relaxations`)."""
    if relaxations is None:
        relaxations = bounds_platform.default_relaxations(platform)
    result = refsim_bounds.evaluate(closed, flat_args, relaxations=relaxations)
    pols, notes = _policies_from(result, ref, candidates, fallbacks)
    if result.used and any(_holds_any(p) for p in pols):
        pols = _with_strict(pols, refsim_bounds.evaluate(closed, flat_args, relaxations=()), ref)
    notes += _relaxation_notes(result)
    out = [p if p is not None else f for p, f in zip(pols, fallbacks)]
    return out, notes, result


def verdicts(pols, xla) -> list[OutputVerdict]:
    """Per AllowedSet output, the element counts and the worst ratio (module docstring)."""
    res = []
    for k, (p, a) in enumerate(zip(pols, xla)):
        if not isinstance(p, AllowedSet):
            continue
        v = OutputVerdict(k)
        for sh in a.shards:
            d = int(sh.device_id)
            if d not in p.exact:
                continue
            y = np.asarray(sh.data)
            if y.shape != np.shape(p.exact[d]):      # a layout mismatch: compare reports it
                continue
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                yd = y.astype(np.float64)
                c = np.asarray(p.exact[d], np.float64)
                b = np.asarray(p.abs_sum[d], np.float64)
                und = np.isnan(b)
                diff = np.abs(yd - c)
                same_nonfinite = (~np.isfinite(c)) & ((yd == c) | (np.isnan(yd) & np.isnan(c)))
                diff = np.where(same_nonfinite, 0.0, diff)
                ok = diff <= b * _MARGIN
                ratio = np.where(und | ~np.isfinite(diff), 0.0, np.where(b > 0, diff / np.where(b > 0, b, 1), 0.0))
                ratio = np.where((b == 0) & (diff > 0), np.inf, ratio)
            use = p.governed(d)
            v.elements += y.size
            v.undecidable += int(und.sum())
            v.heuristic += int((~use & ~und).sum())
            v.outside += int((~ok & use).sum())
            ratio = np.where(use, ratio, 0.0)
            if ratio.size:
                i = int(np.argmax(ratio))
                if ratio.flat[i] > v.worst_ratio:
                    v.worst_ratio = float(ratio.flat[i])
                    v.worst_at = (d, tuple(int(t) for t in np.unravel_index(i, ratio.shape)))
            if p.strict is not None and d in p.strict:
                s = np.asarray(p.strict[d], np.float64)
                only = ok & use & ~(diff <= np.where(np.isnan(s), np.inf, s) * _MARGIN)
                n = int(only.sum())
                if n and not v.relaxed_only:
                    i = tuple(int(t) for t in np.argwhere(only)[0])
                    v.relaxed_example = (f"{', '.join(p.relaxations)}: device {d} element {i}: xla {y[i]!r}, exact "
                                         f"{c[i]!r}, |diff| {diff[i]:.3g} > spec bound {s[i]:.3g}")
                v.relaxed_only += n
        res.append(v)
    return res


def explain_disagreements(closed, flat_args, pols, xla, *, relaxations) -> dict:
    """{output: text} naming, for the elements outside their bound, the ops whose latitude
    dominates those elements' bounds (a walk in explain mode)."""
    result = refsim_bounds.evaluate(closed, flat_args, relaxations=relaxations, explain=True)
    out = {}
    for k, (p, a) in enumerate(zip(pols, xla)):
        if not isinstance(p, AllowedSet):
            continue
        bv = result.outputs[k]
        if not isinstance(bv, refsim_bounds.BVal) or bv.dom is None:
            continue
        dom = np.broadcast_to(bv.dom, np.shape(bv.center))
        counts: dict = {}
        exact = total = 0
        for sh in a.shards:
            d = int(sh.device_id)
            arrays = p.check_arrays(d, np.asarray(sh.data).dtype)
            bad = ~sum_ok(np.asarray(sh.data), **arrays) & p.governed(d)
            ids = _shard_slice(dom, sh.index)[bad]
            exact += int((np.asarray(p.abs_sum[d])[bad] == 0).sum())
            total += int(bad.sum())
            for i in ids.tolist():
                counts[i] = counts.get(i, 0) + 1
        if counts:
            top = sorted(counts.items(), key=lambda kv: -kv[1])[:3]
            names = [f"{result.ops[i] if 0 <= i < len(result.ops) else 'exact inputs'} ({n} element(s))"
                     for i, n in top]
            if exact == total:
                out[k] = ("the failing elements have exactly one allowed value (exact operands, each operation "
                          "correctly rounded), made last by " + "; ".join(names))
            else:
                out[k] = "the failing elements' bounds are dominated by " + "; ".join(names)
    return out
