"""Every stage judged against the program's allowed set (docs/comparison.md, "The allowed set").

The stages are not only compared with each other: each stage's floating outputs are held to the
set of results the specification allows for the *program* (`refsim.bounds`: per element a center,
the value computed in float64, and a bound; every allowed result lies within the bound of the
center). The walk runs twice: under the spec alone (no relaxations) and under the platform's
declared relaxations (`refsim.bounds.platform.RELAXATIONS`, e.g. `xla-reciprocal-division`).

Per output element, at the boundary between two evaluated stages:

* **allowed set** where the walk decides the element and its bound is the tighter of the two
  rules (as in `conformance.check`: the bound no wider than the 256-ulp heuristic of
  `conformance.debug.explain.tolerance`): the later stage *diverges* when the element leaves the
  policy's set (the relaxed one by default, the spec's with ``policy="spec"``) while the earlier
  stage's was inside. An element that leaves the spec's set but stays inside the relaxed one is a
  *deviation under a relaxation*: reported with the relaxation that covers it, never a failure
  under the default policy. A value already outside at the earlier stage is compared with it by
  the heuristic (the deviation entered earlier).
* **heuristic** where the walk has no bound rule for the output (the report names the primitive),
  or the element's bound is wider than the heuristic (worst cases compounded through a deep
  program, or an unbounded interval): the adjacent stages are compared by the heuristic, as before.
* **undecidable** where a comparison, branch or rounding to an integer that the element depends
  on was decided by values closer than their bounds: counted and reported, never a pass and never
  a failure.

Non-floating outputs keep the exact comparison.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from conformance.debug.explain import stages as S
from conformance.debug.explain import tolerance as T

_MARGIN = 1 + 2.0 ** -40   # the bound's own rounding in float64 (as conformance.verdict.allowed)
#: above this many input and output elements the walk is not run (as conformance.check)
MAX_ELEMENTS = 1 << 24
POLICIES = ("auto", "spec", "heuristic")


@dataclasses.dataclass
class OutputBounds:
    """One output's allowed set in the stages' form, (N, *shard) per partition: `center` (float64),
    `spec` (the bound without relaxations; NaN: undecidable), `relaxed` (the bound under the
    platform's relaxations; None where none widened it)."""

    index: int
    center: np.ndarray
    spec: np.ndarray
    relaxed: np.ndarray | None

    def bound(self, policy: str) -> np.ndarray:
        return self.spec if policy == "spec" or self.relaxed is None else self.relaxed

    def inside(self, value: np.ndarray, bound: np.ndarray) -> np.ndarray:
        """Per element: `value` within `bound` of the center (a non-finite center: the same value)."""
        v = np.asarray(value).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(v - self.center)
            same = ~np.isfinite(self.center) & ((v == self.center) | (np.isnan(v) & np.isnan(self.center)))
            return same | (diff <= bound * _MARGIN)

    def undecidable(self) -> np.ndarray:
        und = np.isnan(self.spec)
        return und | np.isnan(self.relaxed) if self.relaxed is not None else und


@dataclasses.dataclass
class Deviation:
    """Where a value first leaves the spec's allowed set: the `boundary` ("lowering", "compiler",
    "backend") before `stage`, the `output`, `count` of its elements outside the spec's bound,
    `elements` [(device, index, center, value, |diff|, spec bound, relaxed bound)], `derivation`
    (how the spec's bound was derived: "exactly one allowed value ..., made last by div at f.py:7"),
    `relaxations` (the declared relaxations that cover it; empty: none does), `op` / `op_text` /
    `source` / `op_index` (the op of that stage's module responsible) and `how` (how it was found)."""

    boundary: str
    stage: str
    previous: str
    output: int
    count: int
    elements: list
    derivation: str = ""
    relaxations: tuple = ()
    op: str | None = None
    op_text: str = ""
    source: str = ""
    op_index: int | None = None
    how: str = ""
    change: str = ""   # what the module before computed at that line ("divide ... became multiply by 0.2")

    @property
    def covered(self) -> bool:
        return bool(self.relaxations)

    def lines(self, policy: str) -> list:
        if self.covered and policy != "spec":
            what = f"agrees only under relaxation {', '.join(self.relaxations)}"
        elif self.covered:
            what = (f"leaves the spec's allowed set (the declared relaxation {', '.join(self.relaxations)} covers "
                    "it: the default policy accepts it)")
        else:
            what = "leaves the allowed set"
        out = [f"allowed set: the {self.stage} stage {what}: {self.count} element(s) of output {self.output} "
               f"inside the spec's allowed set at the {self.previous} stage are outside it at the {self.stage} "
               f"stage (deviation entered at the {self.boundary} boundary)"]
        if self.derivation:
            out.append(f"  bound broken: {self.derivation}")
        for d, i, c, v, diff, sb, rb in self.elements:
            rel = "" if rb is None else f", relaxed bound {rb:.3g}"
            out.append(f"  device {d} element {list(i)}: allowed {c!r} (spec bound {sb:.3g}{rel}), "
                       f"{self.stage} {v!r}, |diff| {diff:.3g}")
        if self.op:
            out.append(f"  op: {self.op}" + (f" (op #{self.op_index})" if self.op_index is not None else "")
                       + (f" at {self.source}" if self.source else "") + (f" ({self.how})" if self.how else ""))
            if self.op_text:
                out.append(f"    {self.op_text}")
            if self.change:
                out.append(f"    {self.change}")
        from refsim.bounds import platform as bp

        for name in self.relaxations:
            r = bp.RELAXATIONS.get(name)
            if r is not None:
                doc = "documented" if r.documented else "declared: not in the platform's documentation"
                out.append(f"  relaxation {name} ({doc}): {r.covers}; source: {r.source}")
        if not self.relaxations:
            out.append("  no declared relaxation of the platform covers it")
        return out

    def to_json(self) -> dict:
        return {"boundary": self.boundary, "stage": self.stage, "output": self.output, "count": self.count,
                "derivation": self.derivation, "relaxations": list(self.relaxations), "op": self.op,
                "op_index": self.op_index, "op_text": self.op_text, "source": self.source, "how": self.how,
                "change": self.change,
                "elements": [{"device": d, "index": list(i), "allowed": float(c), "value": float(v),
                              "diff": float(diff), "spec_bound": float(sb),
                              "relaxed_bound": None if rb is None else float(rb)}
                             for d, i, c, v, diff, sb, rb in self.elements]}


class Judge:
    """The allowed set of one program in the stages' form, and the per-stage verdicts.

    `outputs[k]`: an `OutputBounds`, or None where output k is held to the heuristic (not a real
    float, or no bound rule: `notes` says why). `counts[stage]`: per stage {"allowed", "heuristic",
    "undecidable", "outside", "relaxed_only"} element counts. `deviation`: the first `Deviation`
    (a spec-leaving value, covered by a relaxation or not)."""

    def __init__(self, policy: str, closed, flat_args, outputs, notes, used):
        self.policy = policy
        self.closed, self.flat_args = closed, flat_args
        self.outputs = outputs
        self.notes = notes
        self.used = used            # relaxation name -> labels of the equations it widened
        self.counts: dict = {}
        self.deviation: Deviation | None = None
        self.refsim_outside: list = []
        self._inside: dict = {}
        self._placements = None
        self._ids = None

    # -- building -----------------------------------------------------------------------------
    @classmethod
    def build(cls, staged, jaxpr_stage, placements, device_ids, *, policy: str = "auto",
              platform: str = "cpu") -> "Judge | None":
        """The allowed set of `staged` (an `explain.program.Staged` with `jaxpr`), or a Judge with no
        bounded output and a note saying why (the walk failed, is too large, or has no rule)."""
        from refsim import bounds
        from refsim.bounds import platform as bp

        if policy == "heuristic" or getattr(staged, "jaxpr", None) is None:
            return None
        ref = jaxpr_stage.outputs if jaxpr_stage is not None else None
        if ref is None:
            return None
        judge = cls(policy, None, None, [None] * len(ref), [], {})
        try:
            closed, flat = staged.jaxpr()
            judge.closed, judge.flat_args = closed, flat
            size = sum(int(np.prod(np.shape(a))) for a in (*flat, *ref))
            if size > MAX_ELEMENTS:
                judge.notes.append(f"allowed set not computed: {size} input and output elements, above "
                                   f"{MAX_ELEMENTS}: every output held to the heuristic")
                return judge
            if policy != "spec":   # as conformance.check: the walk's cost is bounded unless the spec is asked for
                from conformance.oracle.policy import WORK_ENV, allowed_set_max_work
                from refsim.bounds.coverage import work_estimate

                work, limit = work_estimate(closed), allowed_set_max_work()
                if work > limit:
                    judge.notes.append(f"allowed set not computed: its bound walk would take {work:.2g} element "
                                       f"operations, above {limit:.2g} (${WORK_ENV}; policy='spec' computes it "
                                       "whatever its size): every output held to the heuristic")
                    return judge
            relax = bp.default_relaxations(platform)   # computed under "spec" too: to say what would cover it
            relaxed = bounds.evaluate(closed, flat, relaxations=relax, strict=True)
            spec = relaxed.strict_result() if relaxed.used else relaxed
        except Exception as e:  # noqa: BLE001 - the heuristic still judges; the note says why
            judge.notes.append(f"allowed set not computed ({type(e).__name__}: {str(e).splitlines()[0][:160]}): "
                               "every output held to the heuristic")
            return judge
        judge.used = dict(relaxed.used)
        if len(spec.outputs) != len(ref):
            judge.notes.append(f"the bound walk gives {len(spec.outputs)} outputs for the stages' {len(ref)}: "
                               "every output held to the heuristic")
            return judge
        judge._placements, judge._ids = placements, device_ids
        for k, (a, sv) in enumerate(zip(ref, spec.outputs)):
            dtype = np.asarray(a).dtype
            if not T._floating(dtype) or dtype.kind == "c":
                if dtype.kind == "c":
                    judge.notes.append(f"output {k}: no bound rule for complex values: held to the heuristic")
                continue
            if not isinstance(sv, bounds.BVal):
                why = ", ".join(sorted(getattr(sv, "reasons", ()) or {"?"}))
                judge.notes.append(f"output {k}: no bound rule for {why}: held to the heuristic")
                continue
            rv = relaxed.outputs[k]
            try:
                center = judge._form(k, np.asarray(sv.center, np.float64))
                sb = judge._form(k, np.asarray(sv.full_bound(), np.float64))
                rb = judge._form(k, np.asarray(rv.full_bound(), np.float64)) if relaxed is not spec else None
            except Exception as e:  # noqa: BLE001 - a layout the stages' form cannot take
                judge.notes.append(f"output {k}: the allowed set could not be laid out per device "
                                   f"({type(e).__name__}): held to the heuristic")
                continue
            if center.shape != np.shape(a):
                judge.notes.append(f"output {k}: the bound walk's shape {center.shape[1:]} is not the stages' "
                                   f"{np.shape(a)[1:]}: held to the heuristic")
                continue
            judge.outputs[k] = OutputBounds(k, center, sb, rb)
        return judge

    def _form(self, k: int, value: np.ndarray) -> np.ndarray:
        pl = self._placements[k] if self._placements is not None and k < len(self._placements) else None
        return S.shards_by_index(value[None], pl, self._ids)

    @property
    def active(self) -> bool:
        return any(o is not None for o in self.outputs)

    # -- per stage ----------------------------------------------------------------------------
    def inside(self, st, k: int):
        """(inside the spec's set, inside the policy's set) of stage `st`'s output k, cached."""
        key = (st.name, k)
        if key not in self._inside:
            ob = self.outputs[k]
            v = st.outputs[k]
            spec_in = ob.inside(v, ob.spec)
            pol_in = spec_in if self.policy == "spec" or ob.relaxed is None else ob.inside(v, ob.relaxed)
            self._inside[key] = (spec_in, pol_in)
        return self._inside[key]

    def governed(self, k: int, heuristic_bound: float | None) -> np.ndarray:
        """Per element: the allowed set decides it and is the tighter rule."""
        ob = self.outputs[k]
        b = ob.bound(self.policy)
        with np.errstate(invalid="ignore"):
            tight = np.isfinite(b) if heuristic_bound is None else b * _MARGIN <= heuristic_bound
        return ~ob.undecidable() & tight

    def bad_elements(self, prev, cur, k: int, rule) -> tuple[np.ndarray, np.ndarray]:
        """(elements of output k whose later stage differs, elements that newly leave the spec's set:
        inside it at `prev`, outside at `cur`), each (N, *shard)."""
        a, b = np.asarray(prev.outputs[k]), np.asarray(cur.outputs[k])
        hb = rule.bound(a)
        gov = self.governed(k, hb)
        und = self.outputs[k].undecidable()
        p_spec, p_pol = self.inside(prev, k)
        c_spec, c_pol = self.inside(cur, k)
        heur = T.bad_elements(a, b, hb)
        bad = np.where(gov & p_pol, ~c_pol, np.where(und, False, heur))
        left_spec = gov & p_spec & ~c_spec
        c = self.counts.setdefault(cur.name, {"allowed": 0, "heuristic": 0, "undecidable": 0, "outside": 0,
                                              "relaxed_only": 0})
        c["allowed"] += int(gov.sum())
        c["heuristic"] += int((~gov & ~und).sum())
        c["undecidable"] += int(und.sum())
        c["outside"] += int((gov & ~c_pol).sum())
        c["relaxed_only"] += int((gov & ~c_spec & c_pol).sum()) if self.policy != "spec" else 0
        if prev.name == "jaxpr" and not (p_spec | ~gov).all() and k not in self.refsim_outside:
            self.refsim_outside.append(k)
        return bad, left_spec

    # -- a deviation: its derivation, the relaxations that cover it --------------------------
    def deviation_at(self, prev, cur, k: int, mask: np.ndarray, boundary: str, limit: int = 3) -> Deviation:
        ob = self.outputs[k]
        v = np.asarray(cur.outputs[k])
        elements = []
        for p in np.flatnonzero(mask.reshape(mask.shape[0], -1).any(axis=1))[:limit]:
            j = tuple(int(t) for t in np.argwhere(mask[p])[0])
            c = float(ob.center[p][j])
            x = v[p][j].item()
            rb = None if ob.relaxed is None else float(ob.relaxed[p][j])
            elements.append((int(self._ids[p]), j, c, x, abs(float(x) - c), float(ob.spec[p][j]), rb))
        dev = Deviation(boundary, cur.name, prev.name, k, int(mask.sum()), elements)
        dev.derivation = self._derivation(k, mask)
        dev.relaxations = self._covering(k, cur, mask)
        return dev

    def _derivation(self, k: int, mask: np.ndarray) -> str:
        """How the spec's bound of the elements in `mask` was derived (the op whose latitude
        dominates it: a walk in explain mode, as `conformance.verdict.allowed.explain_disagreements`)."""
        from refsim import bounds

        try:
            res = bounds.evaluate(self.closed, self.flat_args, relaxations=(), explain=True)
            bv = res.outputs[k]
            if not isinstance(bv, bounds.BVal) or bv.dom is None:
                return ""
            dom = self._form(k, np.broadcast_to(bv.dom, np.shape(bv.center)))
        except Exception:  # noqa: BLE001 - the deviation stands without its derivation
            return ""
        ids = dom[mask].tolist()
        counts: dict = {}
        for i in ids:
            counts[int(i)] = counts.get(int(i), 0) + 1
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:3]
        names = [f"{res.ops[i] if 0 <= i < len(res.ops) else 'exact inputs'} ({n} element(s))" for i, n in top]
        if not names:
            return ""
        if (self.outputs[k].spec[mask] == 0).all():
            return ("exactly one allowed value (exact operands, each operation correctly rounded), made last by "
                    + "; ".join(names))
        return "the bound is dominated by " + "; ".join(names)

    def _covering(self, k: int, cur, mask: np.ndarray) -> tuple:
        """The declared relaxations (of those that widened some bound) under which every element of
        `mask` is inside: each alone where one suffices, else all of them together, else none."""
        from refsim import bounds

        ob = self.outputs[k]
        if ob.relaxed is None or not ob.inside(cur.outputs[k], ob.relaxed)[mask].all():
            return ()
        names = sorted(self.used)
        if len(names) <= 1:
            return tuple(names)
        alone = []
        for name in names:
            try:
                r = bounds.evaluate(self.closed, self.flat_args, relaxations=frozenset({name}))
                b = self._form(k, np.asarray(r.outputs[k].full_bound(), np.float64))
            except Exception:  # noqa: BLE001
                continue
            if ob.inside(cur.outputs[k], b)[mask].all():
                alone.append(name)
        return tuple(alone) if alone else tuple(names)

    def summary(self, stage: str) -> str:
        return summary_of(self.counts.get(stage))


def summary_of(c) -> str:
    """One stage's element counts as text ("5 allowed set, 5 only under a relaxation")."""
    if not c:
        return ""
    parts = [f"{c['allowed']} allowed set"]
    for key, text in (("heuristic", "heuristic"), ("undecidable", "undecidable"),
                      ("relaxed_only", "only under a relaxation"), ("outside", "outside")):
        if c[key]:
            parts.append(f"{c[key]} {text}")
    return ", ".join(parts)
