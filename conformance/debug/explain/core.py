"""`conformance.debug.explain`: which compiler stage first changed a program's result, and at which op.

The program is evaluated at four stages (see `stages`): jaxpr (refsim), lowered StableHLO
and compiled per-device HLO (both interpreted by `refsim.stablehlo`), and executed on the
platform. The first stage whose per-device shards differ from the stage before names who
is at fault: ``"lowering"`` (JAX's lowering), ``"compiler"`` (XLA's passes, e.g. the SPMD
partitioner), ``"backend"`` (codegen or runtime), or None when all agree. Within a
lowering or compiler divergence, ops are paired with the equation (or op) they came from by
their name and source line, and the first whose value differs is named, with per-device
errors.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

import numpy as np

from conformance.debug import region as R
from conformance.debug.explain import judge as J
from conformance.debug.explain import program as _program
from conformance.debug.explain import stages as S
from conformance.debug.explain import values as V
from conformance.debug.explain import xla_side
from conformance.validation import check
from refsim.layouts.mesh import Mesh


@dataclasses.dataclass
class Explanation:
    """The stages of one program and where they first disagree.

    diverged_in: "lowering", "compiler" or "backend" (the boundary before the first stage that
    differs from the stage before it, or that crashed), "undetermined" (a difference was seen,
    or nothing could be compared, but a stage in between could not be evaluated: `candidates`
    lists the boundaries it may lie at, `not_evaluated` says why), or None (no difference
    seen; `complete` says whether every stage was compared). crash: XLA's message when a stage
    crashed (a compile failure is a `compiler` crash). op / op_text / source: the first
    diverging op (StableHLO / HLO op name, its text, the user's file:line) when it could be
    named. output: index of the first differing output. devices: {device id: max ULP error}
    of the diverging value. compared: the two stages whose values `elements` shows, in order.
    stages: the `stages.Stage` of each stage, in order.
    """

    diverged_in: str | None
    stages: list
    agrees: dict
    output: int | None = None
    op: str | None = None
    op_text: str = ""
    source: str = ""
    devices: dict = dataclasses.field(default_factory=dict)
    mesh: Any = None
    notes: list = dataclasses.field(default_factory=list)
    elements: list = dataclasses.field(default_factory=list)  # (device, index, before, after), a few
    candidates: list = dataclasses.field(default_factory=list)
    not_evaluated: dict = dataclasses.field(default_factory=dict)  # stage -> why it was not evaluated
    crash: str | None = None
    compared: tuple = ()
    complete: bool = True
    tolerance: str = ""  # the rule values were held to
    op_index: int | None = None  # the op's position in its module (pre-order), as `refsim.stablehlo` numbers it
    #: where a value first left the spec's allowed set (`judge.Deviation`): the boundary, the elements, the
    #: bound broken, the op and the declared relaxations that cover it (None: every stage stayed inside)
    deviation: Any = None
    policy: str = "auto"   # "auto" (allowed set under the platform's relaxations), "spec", "heuristic"
    allowed_set: dict = dataclasses.field(default_factory=dict)  # stage -> its elements by rule (counts)
    _op: Any = dataclasses.field(default=None, repr=False)   # the named op itself (a refsim.stablehlo plan Op)

    @property
    def relaxed(self) -> tuple:
        """The declared relaxations some stage agrees only under (a deviation they cover, not a
        failure under the default policy); () when none."""
        d = self.deviation
        if d is None or not d.covered or self.policy == "spec" or self.diverged_in is not None:
            return ()
        return tuple(d.relaxations)

    def to_json(self) -> dict:
        """One JSON-able dict: diverged_in, candidates, crash, complete, op, op_text, source, output,
        devices, elements, stages, notes."""
        return {
            "diverged_in": self.diverged_in, "candidates": list(self.candidates), "crash": self.crash,
            "complete": self.complete, "not_evaluated": dict(self.not_evaluated),
            "op": self.op, "op_index": self.op_index, "op_text": self.op_text, "source": self.source,
            "output": self.output, "devices": {str(k): _num(v) for k, v in self.devices.items()},
            "compared": list(self.compared), "tolerance": self.tolerance,
            "elements": [{"device": d, "index": list(i), "before": _num(b), "after": _num(a)}
                         for d, i, b, a in self.elements],
            "policy": self.policy, "relaxed": list(self.relaxed),
            "deviation": None if self.deviation is None else self.deviation.to_json(),
            "allowed_set": {k: dict(v) for k, v in self.allowed_set.items()},
            "stages": [{"name": s.name, "status": s.status, "reason": s.reason,
                        "agrees_with_previous": self.agrees.get(s.name),
                        "seconds": round(s.seconds, 4), "error": s.error,
                        "missing_ops": s.missing_ops} for s in self.stages],
            "notes": list(self.notes),
        }

    def json(self) -> str:
        return json.dumps(self.to_json())

    def picture(self, format: str = "text") -> str:
        """The mesh as a grid of devices coloured by the diverging value's max ULP error."""
        from conformance.debug import picture

        if not self.devices or self.mesh is None:
            return ""
        return picture.render(self.mesh, self.devices, format=format, title=f"max ULP at {self.op or 'output'}")

    def headline(self) -> str:
        """One line: the verdict, as the report's first line."""
        why = "; ".join(f"{k} not evaluated ({v})" for k, v in self.not_evaluated.items())
        if self.diverged_in == "undetermined":
            if self.candidates:
                c = self.candidates
                between = c[0] if len(c) == 1 else ", ".join(c[:-1]) + " and " + c[-1]
                return f"diverged in: undetermined between {between} ({why})"
            return f"diverged in: undetermined ({why or 'no stage could be compared'})"
        if self.diverged_in and self.crash:
            return f"diverged in: {self.diverged_in} (crash: {self.crash})"
        if self.diverged_in:
            return f"diverged in: {self.diverged_in}"
        if self.relaxed:
            d = self.deviation
            return (f"all stages agree; the {d.stage} stage agrees only under relaxation {', '.join(self.relaxed)} "
                    f"({d.boundary} boundary" + (f", {d.op}" if d.op else "") + ")")
        if self.complete:
            return "all stages agree"
        return f"no divergence found, but not every stage was compared: {why}"

    def report(self) -> str:
        lines = []
        for s in self.stages:
            agree = self.agrees.get(s.name)
            if s.name == "jaxpr" and s.status == "evaluated":
                mark = "-"
            elif s.status != "evaluated":
                mark = f"{s.status} ({s.reason})"
            else:
                mark = {True: "agrees", False: "DIFFERS", None: "not compared"}[agree]
                if agree and self.relaxed and self.deviation.stage == s.name:
                    mark = f"agrees only under relaxation {', '.join(self.relaxed)}"
            counts = self.allowed_set.get(s.name)
            if counts and s.status == "evaluated" and agree is not None:
                mark += f"  [elements: {J.summary_of(counts)}]"
            lines.append(f"  {s.name:<9} {s.seconds * 1e3:8.1f} ms  {mark}")
        out = [self.headline(), "stages:", *lines]
        if self.diverged_in:
            if self.op:
                out.append(f"first diverging op: {self.op}" + (f" at {self.source}" if self.source else ""))
                out.append(f"  {self.op_text}")
            if self.output is not None:
                out.append(f"first differing output: {self.output}")
            if self.devices:
                bad = sorted(d for d, v in self.devices.items() if v > 0)
                out.append(f"devices that differ: {bad}")
                before, after = self.compared or ("before", "after")
                for d, i, b, a in self.elements:
                    out.append(f"  device {d} element {list(i)}: {before} {b!r}, {after} {a!r}")

                pic = self.picture()
                if pic:
                    out.append(pic)
        if self.deviation is not None:
            out.extend(self.deviation.lines(self.policy))
        out.extend(f"note: {n}" for n in self.notes)
        return "\n".join(out)


def _num(v):
    """A value as JSON: a bool or an integer as itself, a finite float as a number, NaN / inf as the
    string Python writes, a complex as {"real": ..., "imag": ...} of those."""
    if v is None or isinstance(v, (bool, np.bool_)):
        return None if v is None else bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (complex, np.complexfloating)):
        return {"real": _num(float(v.real)), "imag": _num(float(v.imag))}
    return float(v) if np.isfinite(v) else str(float(v))


def _check_tolerances(max_ulp, rtol) -> None:
    check("max_ulp", max_ulp, low=0, what="0: bit-exact, NaN equals NaN")
    check("rtol", rtol, low=0, what="a relative error; 0: none")


def explain_staged(staged: "_program.Staged", *, region=None, mesh=None, edit_module: Callable | None = None,
                   max_ulp: float = 0, rtol: float = 0, isolate: bool = True, tolerance: str = "auto",
                   policy: str = "auto") -> Explanation:
    """Run every stage of an already lowered program and find where they first disagree.

    isolate=True compiles and runs XLA in a worker process (`xla_side.isolated`): a fatal XLA
    CHECK ends the worker and is reported as a crash of the step that was running. `policy`
    (with tolerance "auto"): "auto" judges float outputs by the program's allowed set under the
    platform's declared relaxations, "spec" without them, "heuristic" by the 256-ulp rule alone."""
    _check_tolerances(max_ulp, rtol)  # NaN would make every stage "agree"
    _check_policy(policy)
    edit_module = xla_side.with_planted(edit_module)   # and compiler faults planted by conformance.faults.inject
    xla = xla_side.isolated(staged, edit_module) if isolate else xla_side.in_process(staged, edit_module)
    ids = xla.device_ids
    stages = [S.run_jaxpr(staged, ids, region, xla.out_placements),
              S.run_lowered(staged, xla.out_placements, ids),
              S.run_compiled(staged, xla, ids), S.run_executed(xla)]
    rule = V.rule_for(stages, max_ulp=max_ulp, rtol=rtol, tolerance=tolerance)
    judge, exp_note = None, None
    if rule.mode == "auto" and policy != "heuristic" and staged.platforms is None:
        judge = J.Judge.build(staged, stages[0] if stages[0].status == "evaluated" else None, xla.out_placements,
                              ids, policy=policy)
    if judge is None and rule.mode == "auto" and policy != "heuristic":
        why = ("the module was lowered for another platform" if staged.platforms else
               "the jaxpr stage was not evaluated" if stages[0].status != "evaluated" else "no jaxpr to walk")
        exp_note = f"allowed set not used: {why}; float outputs compared between stages by the heuristic"
    if judge is not None:
        rule = dataclasses.replace(rule, judge=judge)
    exp = localise(stages, ids, mesh=mesh, rule=rule)
    exp.policy = policy if judge is not None else ("heuristic" if rule.mode == "auto" else rule.mode)
    if exp_note:
        exp.notes.append(exp_note)
    if judge is not None:
        exp.notes.extend(judge.notes)
        if judge.refsim_outside:
            exp.notes.append(f"refsim's own value (jaxpr stage) of output(s) {judge.refsim_outside} lies outside the "
                             "spec's allowed set in some element (a bug in refsim or in the bound walk): those "
                             "elements are compared between stages by the heuristic")
    return exp


def _check_policy(policy) -> None:
    if policy not in J.POLICIES:
        raise ValueError(f"policy={policy!r}; use 'auto' (the allowed set under the platform's declared "
                         "relaxations), 'spec' (the allowed set without them) or 'heuristic' (256 ulps of max|value|).")


def localise(stages: list, device_ids, max_ulp: float = 0, *, mesh=None, rule: "V.Rule | None" = None) -> Explanation:
    """The verdict over evaluated `stages` (jaxpr, lowered, compiled, executed, in order).

    Adjacent *evaluated* stages are compared. The first pair that differs names the boundary
    between them when they are neighbours; when a stage between them could not be evaluated,
    the difference lies at one of several boundaries and the verdict is "undetermined"
    between them. A crashed stage (XLA failed to compile or run) is the fault of the boundary
    before it. Without a difference, "all stages agree" only when every stage was compared.
    `rule` (default: `values.rule_for(stages, max_ulp=max_ulp)`) says when two values agree.
    """
    rule = rule or V.rule_for(stages, max_ulp=max_ulp)
    agrees: dict = {}
    exp = Explanation(None, stages, agrees, mesh=mesh)
    exp.not_evaluated = {s.name: s.reason for s in stages if s.status != "evaluated"}
    judge = rule.judge
    if judge is not None:
        exp.policy = judge.policy
    prev = None
    for st in stages:
        if st.status != "evaluated":
            agrees[st.name] = None
            if st.status == "crashed" and exp.diverged_in is None:
                exp.diverged_in, exp.crash = S.BOUNDARY[st.name], st.reason
                exp.not_evaluated.pop(st.name, None)
                if st.note:
                    exp.notes.append(st.note)
            continue
        if prev is None:
            prev = st
            continue
        left: list = []
        ok, out_idx, devs, elements = V.compare_stages(prev, st, device_ids, rule, left)
        agrees[st.name] = ok
        neighbours = stages.index(st) == stages.index(prev) + 1
        named = None
        if not ok and exp.diverged_in is None:
            between = [s for s in stages[stages.index(prev) + 1:stages.index(st)]]
            exp.output, exp.devices, exp.elements = out_idx, devs, elements
            exp.compared = (prev.name, st.name)
            if between:
                exp.diverged_in = "undetermined"
                exp.candidates = [S.BOUNDARY[s.name] for s in between + [st]]
                exp.notes.append(f"{st.name} differs from {prev.name}; the stage(s) between them "
                                 f"({', '.join(s.name for s in between)}) could not be evaluated, so the "
                                 f"difference was introduced at one of: {', '.join(exp.candidates)}.")
            else:
                exp.diverged_in = S.BOUNDARY[st.name]
                named = _name_op(exp, prev, st, device_ids, rule)
        if left and judge is not None and exp.deviation is None:
            k, mask = left[0]
            exp.deviation = judge.deviation_at(prev, st, k, mask, S.BOUNDARY[st.name] if neighbours else "undetermined")
            if neighbours:
                _name_deviation_op(exp, prev, st, device_ids, judge, k, mask, named)
        prev = st
    if judge is not None:
        exp.allowed_set = {k: dict(v) for k, v in judge.counts.items()}
    exp.tolerance = rule.describe()
    evaluated = [s for s in stages if s.status == "evaluated"]
    exp.complete = len(evaluated) == len(stages)
    if exp.diverged_in is None and len(evaluated) < 2:
        exp.diverged_in = "undetermined"
    if exp.diverged_in == "undetermined":
        exp.op, exp.op_text, exp.source, exp.op_index = None, "", "", None
    for st in stages:
        if st.missing_ops:
            exp.notes.append(f"{st.name}: refsim.stablehlo has no rule for {sorted(st.missing_ops)}")
    return exp


def _name_deviation_op(exp: Explanation, prev, st, device_ids, judge, k: int, mask, named: str | None):
    """The op of stage `st` responsible for the deviation (`exp.deviation`): the divergence's own op where
    the comparison of paired values found one (a difference the heuristic sees), else `values.deviation_op`
    (a difference within the heuristic: paired values compared bit for bit, verified against the allowed
    set, or the modules' ops diffed per source line), which then names the divergence's op too."""
    d = exp.deviation
    if named == "anchored" and exp.output == k:
        op = exp._op
        how = (f"the first op whose own value differs from the {prev.name} stage's when every paired op computes "
               "from that stage's values")
    else:
        op, how = V.deviation_op(prev, st, device_ids, judge, k, mask)
        if op is None and st.name == "executed" and prev.program is not None:
            op = V.output_op(prev.program, k)
            how = ("execution leaves the set where the compiled module's semantics stay inside (codegen or "
                   "runtime); the op shown defines the output in the compiled module") if op is not None else ""
        if op is not None and exp.diverged_in == S.BOUNDARY.get(st.name) and exp.output == k \
                and named in (None, "output") and st.name != "executed":
            exp.op, exp.op_text, exp.source, exp.op_index = op.name, op.text, op.loc.source, getattr(op, "index", None)
            exp.notes = [n for n in exp.notes if not n.startswith("no op inside could be paired")]
    if op is None:
        return
    d.op, d.op_text, d.source, d.op_index, d.how = op.name, op.text, op.loc.source, getattr(op, "index", None), how
    try:
        d.change = V.line_change(prev, st, op)
    except Exception:  # noqa: BLE001 - only a description
        d.change = ""


def _name_op(exp: Explanation, prev, st, device_ids, rule) -> str | None:
    """Name the divergence's op; returns how it was found: "anchored" (its own value differs), "output"
    (the op defining the differing output), or None."""
    op, res = None, None
    how = None
    if st.name in ("lowered", "compiled"):
        op, res, verified = V.anchored_op(prev, st, device_ids, rule)
        how = "anchored" if op is not None else None
        if op is not None and not verified:
            exp.notes.append(f"{op.name} is the first op whose own value differs when every paired op computes from "
                             f"the {prev.name} stage's values; putting right the ops of its name alone did not make "
                             "the outputs agree, so another op may share the blame.")
    if op is None and exp.output is not None:
        program = prev.program if st.name == "executed" else st.program
        op = V.output_op(program, exp.output) if program is not None else None
        how = "output" if op is not None else None
        if op is not None and st.name == "executed":
            exp.notes.append("execution differs from the compiled module's semantics (codegen or runtime); the "
                             f"op shown defines output {exp.output} in the compiled module.")
        elif op is not None:
            exp.notes.append(f"no op inside could be paired with a differing value; the op shown defines output "
                             f"{exp.output} in the {st.name} module.")
    if op is None:
        return None
    exp.op, exp.op_text, exp.source = op.name, op.text, op.loc.source
    exp.op_index = getattr(op, "index", None)
    exp._op = op
    if res is not None:  # the op's own value: its per-device errors and first differing elements
        exp.devices, exp.elements = res[1], res[2]
    return how


def explain(fn, *args, mesh=None, in_specs=None, out_specs=None, check_vma: bool = True, axis_names=None,
            in_shardings=None, out_shardings=None, pmap_kwargs=None, edit_module: Callable | None = None,
            max_ulp: float = 0, rtol: float = 0, lowering_platforms=None, isolate: bool = True,
            tolerance: str = "auto", policy: str = "auto") -> Explanation:
    """Evaluate `fn(*args)` at every stage and report where the results first diverge.

    It takes what `conformance.check` takes. Without layout keywords `fn` runs as given: under
    its own `jax.jit` / `jax.shard_map` / `jax.pmap` (a plain function is put under `jax.jit`),
    its jax.Array arguments where they are placed. Layout keywords wrap a plain function:
    `in_specs`/`out_specs` (a shard_map body over `mesh`, a jax.sharding.Mesh or a refsim
    Mesh, e.g. `xla_backend.mesh`), `in_shardings` / `out_shardings` (a jit program), or
    `pmap_kwargs` (a pmap body). `edit_module(text) -> text` rewrites the lowered module before
    XLA compiles it (a planted compiler-stage fault: the lowered stage still interprets JAX's
    module). Values agree by `tolerance`: "auto" (default; `conformance.debug.explain.tolerance`: exact
    where the program is exact, else within 256 units of roundoff of each value's largest
    magnitude) or "exact" (bit for bit, NaN equal to NaN); `max_ulp` / `rtol` instead accept any
    element within that many ULPs or that relative error. Within a lowering or compiler
    divergence the op named is the first whose own output differs when every paired op computes
    from the earlier stage's values (`values.anchored_op`). `lowering_platforms` (e.g. ("cuda",)) lowers for
    another platform: then only jaxpr and lowered are compared. XLA compiles and runs the
    program in a worker process (`isolate=True`), so a fatal XLA CHECK is reported as a crash of
    the stage that was running instead of ending this process.
    """
    _check_tolerances(max_ulp, rtol)  # before any tracing: NaN would make every stage "agree"
    _check_policy(policy)
    called = all(v is None for v in (mesh, in_specs, out_specs, in_shardings, out_shardings, pmap_kwargs))
    if mesh is not None:
        mesh = _program.refsim_mesh(mesh)
    kw = dict(mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma, axis_names=axis_names,
              in_shardings=in_shardings, out_shardings=out_shardings, pmap_kwargs=pmap_kwargs)
    note = None

    def build(platforms):
        if called:
            return _program.build_called(fn, args, lowering_platforms=platforms)
        return _program.build(fn, args, lowering_platforms=platforms, **kw)

    try:
        staged = build(lowering_platforms)
    except NotImplementedError as e:
        # no lowering rule on this platform (pbroadcast on CPU): GPU's lowering still shows the
        # lowered stage; the compiled and executed stages then cannot run here
        if lowering_platforms or "not found for platform" not in str(e):
            raise
        staged = build(("cuda",))
        note = f"no lowering on this platform ({str(e).splitlines()[0]}); lowered for cuda instead."
    reg = None
    if called:
        try:
            region, flat = R.trace_called(fn, args)
            reg = (region, flat)
            mesh = region.mesh if region.kind == "shard_map" else None
        except (ValueError, TypeError):
            reg = None
    elif pmap_kwargs is None and axis_names is None:
        try:
            reg = R.trace(fn, args, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma,
                          in_shardings=in_shardings, out_shardings=out_shardings)
        except (ValueError, TypeError):
            reg = None  # the op is then named from the stages' own traces only
    if mesh is None:
        ids = np.asarray(staged.device_ids)
        mesh = Mesh((ids.size,), ((pmap_kwargs or {}).get("axis_name") or "i",), device_ids=ids)
    exp = explain_staged(staged, region=reg, mesh=mesh, edit_module=edit_module, max_ulp=max_ulp, rtol=rtol,
                         isolate=isolate, tolerance=tolerance, policy=policy)
    if note:
        exp.notes.insert(0, note)
    return exp


def explain_case(case, **kw) -> Explanation:
    """`explain` for a conformance case (`conformance.cases.Program`: shard_map, jit or pmap entry)."""
    return explain(case.fn, *case.args, **_program.case_kwargs(case), **kw)
