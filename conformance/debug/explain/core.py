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

from conformance.debug import diff
from conformance.debug.explain import program as _program
from conformance.debug.explain import stages as S


@dataclasses.dataclass
class Explanation:
    """The stages of one program and where they first disagree.

    diverged_in: "lowering", "compiler", "backend" or None. op / op_text / source: the first
    diverging op (StableHLO / HLO op name, its text, the user's file:line) when it could be
    named. output: index of the first differing output. devices: {device id: max ULP error}
    of the diverging value. stages: the `stages.Stage` of each stage, in order.
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

    def to_json(self) -> dict:
        """One JSON-able dict: diverged_in, op, op_text, source, output, devices, stages."""
        return {
            "diverged_in": self.diverged_in, "op": self.op, "op_text": self.op_text, "source": self.source,
            "output": self.output, "devices": {str(k): _num(v) for k, v in self.devices.items()},
            "elements": [{"device": d, "index": list(i), "before": _num(b), "after": _num(a)}
                         for d, i, b, a in self.elements],
            "stages": [{"name": s.name, "agrees_with_previous": self.agrees.get(s.name),
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

    def report(self) -> str:
        lines = []
        for s in self.stages:
            agree = self.agrees.get(s.name)
            mark = "-" if s.name == "jaxpr" else {True: "agrees", False: "DIFFERS", None: "n/a"}[agree]
            lines.append(f"  {s.name:<9} {s.seconds * 1e3:8.1f} ms  {mark}" + (f"  ({s.error})" if s.error else ""))
        head = (f"diverged in: {self.diverged_in}" if self.diverged_in else "all stages agree")
        out = [head, "stages:", *lines]
        if self.diverged_in:
            if self.op:
                out.append(f"first diverging op: {self.op}" + (f" at {self.source}" if self.source else ""))
                out.append(f"  {self.op_text}")
            if self.output is not None:
                out.append(f"first differing output: {self.output}")
            if self.devices:
                bad = sorted(d for d, v in self.devices.items() if v > 0)
                out.append(f"devices that differ: {bad}")
                names = {"lowering": ("jaxpr", "lowered"), "compiler": ("lowered", "compiled"),
                         "backend": ("compiled", "executed")}[self.diverged_in]
                for d, i, b, a in self.elements:
                    out.append(f"  device {d} element {list(i)}: {names[0]} {b!r}, {names[1]} {a!r}")

                pic = self.picture()
                if pic:
                    out.append(pic)
        out.extend(f"note: {n}" for n in self.notes)
        return "\n".join(out)


def _num(v):
    return None if v is None else (float(v) if np.isfinite(v) else str(v))


# relative tolerance of the comparison in progress (set by explain_staged); an element agrees
# within max_ulp ULPs or within rtol (both 0: bit-exact, NaN equal to NaN)
_TOL = {"max_ulp": 0.0, "rtol": 0.0}


def _first_elements(a, b, bad, device_ids, limit: int = 3) -> list:
    """(device id, local index, value before, value after) of the first differing element of the
    first `limit` differing devices."""
    out = []
    for p in np.flatnonzero(bad.any(axis=1))[:limit]:
        k = int(np.flatnonzero(bad[p])[0])
        idx = np.unravel_index(k, a.shape[1:]) if a.ndim > 1 else ()
        out.append((int(device_ids[p]), tuple(int(i) for i in idx), a[p][idx].item(), b[p][idx].item()))
    return out


def _per_device(a: np.ndarray, b: np.ndarray, device_ids, max_ulp: float) -> tuple[bool, dict, list]:
    """(all devices within tolerance, {device id: max ULP error of its shard}, first differing
    elements)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, {int(d): float("inf") for d in device_ids}, []
    ulp = diff.ulp_error(a, b).reshape(a.shape[0], -1)
    bad = ulp > max_ulp
    if _TOL["rtol"] and a.dtype.kind in "fc":
        with np.errstate(all="ignore"):
            # as np.allclose(rtol=atol=rtol), the corpus's own tolerance check
            rel = diff.abs_error(a, b).reshape(a.shape[0], -1) <= _TOL["rtol"] * (
                1 + np.abs(a.astype(np.float64)).reshape(a.shape[0], -1))
        bad &= ~rel
    worst = ulp.max(axis=1) if ulp.shape[1] else np.zeros(a.shape[0])
    elements = _first_elements(a, b, bad, device_ids) if bad.any() else []
    return not bool(bad.any()), {int(d): float(w) for d, w in zip(device_ids, worst)}, elements


def _compare(prev, cur, device_ids, max_ulp):
    """(agree, first differing output index, {device: max ulp}, first differing elements)."""
    if len(prev.outputs) != len(cur.outputs):
        return False, 0, {}, []
    for i, (a, b) in enumerate(zip(prev.outputs, cur.outputs)):
        ok, devs, elements = _per_device(a, b, device_ids, max_ulp)
        if not ok:
            return False, i, devs, elements
    return True, None, {}, []


def _differs(ref, val, device_ids, max_ulp):
    """None when the two traced values have different types (not comparable), else `_per_device`'s triple."""
    ref, val = np.asarray(ref), np.asarray(val)
    if ref.shape[1:] != val.shape[1:] or ref.dtype != val.dtype:
        return None
    n = len(device_ids)
    return _per_device(np.broadcast_to(ref, (n,) + ref.shape[1:]), np.broadcast_to(val, (n,) + val.shape[1:]),
                       device_ids, max_ulp)


def _pick(entries, ref):
    """The last of a group's (op, Runs) entries whose value has the type of `ref`."""
    ref = np.asarray(ref)
    fit = [e for e in entries
           if np.asarray(e[1].value).shape[1:] == ref.shape[1:] and np.asarray(e[1].value).dtype == ref.dtype]
    return fit[-1] if fit else None


def _first_differing_run(ref_runs, runs, device_ids, max_ulp):
    """(evaluation counter, comparison) of the first evaluation where the two differ, or None:
    the k-th evaluation of one side is paired with the k-th of the other."""
    for (_, r), (counter, v) in zip(ref_runs, runs):
        res = _differs(r, v, device_ids, max_ulp)
        if res is None:
            return None
        if not res[0]:
            return counter, res
    return None


def _first_diverging_op(earlier: dict, later: dict, device_ids, max_ulp):
    """The op of `later` whose value first differs (in evaluation order) from its partner's in
    `earlier`: paired by op name, source line and occurrence, else by what each source line
    computed last. Returns (op, `_per_device` triple) or (None, None)."""
    found = []
    for key, entries in later.items():
        if key not in earlier:
            continue
        partner = _pick(earlier[key], entries[-1][1].value)
        ent = None if partner is None else _pick(entries, partner[1].value)
        hit = None if ent is None else _first_differing_run(partner[1], ent[1], device_ids, max_ulp)
        if hit is not None:
            found.append((hit[0], ent[0], hit[1]))
    if found:
        _, op, res = min(found, key=lambda t: t[0])
        return op, res
    lines_e, lines_l = S.by_line(earlier), S.by_line(later)
    for line, ents in sorted(lines_l.items(), key=lambda kv: kv[1][-1][1][0][0]):
        if line not in lines_e:
            continue
        ref = lines_e[line][-1][1]
        ent = _pick(ents, ref.value)
        hit = None if ent is None else _first_differing_run(ref, ent[1], device_ids, max_ulp)
        if hit is not None:
            return ent[0], hit[1]
    return None, None


def _output_op(program, index: int):
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


def _check_tolerances(max_ulp, rtol) -> None:
    from conformance.validation import check

    check("max_ulp", max_ulp, low=0, what="0: bit-exact, NaN equals NaN")
    check("rtol", rtol, low=0, what="a relative error; 0: none")


def explain_staged(staged: "_program.Staged", *, region=None, mesh=None, edit_module: Callable | None = None,
                   max_ulp: float = 0, rtol: float = 0) -> Explanation:
    """Run every stage of an already lowered program and find where they first disagree."""
    _check_tolerances(max_ulp, rtol)
    _TOL["rtol"] = rtol
    try:
        return _explain_staged(staged, region, mesh, edit_module, max_ulp)
    finally:
        _TOL["rtol"] = 0.0


def _explain_staged(staged, region, mesh, edit_module, max_ulp) -> Explanation:
    from refsim import compat as _compat

    compiled, compile_error = None, None
    try:
        with staged.context():
            compiled = (_compat.compile_edited_module(staged.lowered, edit_module) if edit_module is not None
                        else staged.compiled())
    except Exception as e:  # noqa: BLE001 - e.g. an op XLA:CPU cannot run; the earlier stages still can
        compile_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    device_ids = _compat.partition_device_ids(compiled) if compiled is not None else list(staged.device_ids)
    stages = [S.run_jaxpr(staged, device_ids, region),
              S.run_lowered(staged, S.out_shardings(staged, compiled), device_ids)]
    if compiled is not None:
        stages += [S.run_compiled(staged, compiled, device_ids), S.run_executed(staged, compiled, device_ids)]
    else:
        stages += [S.not_compiled("compiled", compile_error), S.not_compiled("executed", compile_error)]
    agrees: dict = {}
    exp = Explanation(None, stages, agrees, mesh=mesh)
    prev = None
    skipped: list = []
    for st in stages:
        if st.outputs is None:
            agrees[st.name] = None
            if st.name != "executed":
                skipped.append(st.name)
            continue
        if prev is None:
            prev = st
            continue
        ok, out_idx, devs, elements = _compare(prev, st, device_ids, max_ulp)
        agrees[st.name] = ok
        if not ok and exp.diverged_in is None:
            exp.diverged_in = S.BOUNDARY[st.name]
            exp.output, exp.devices, exp.elements = out_idx, devs, elements
            if skipped:
                exp.notes.append(f"stage(s) {skipped} could not run, so the divergence lies between {prev.name} "
                                 f"and {st.name}.")
            _name_op(exp, prev, st, device_ids, max_ulp)
        prev = st
        skipped = []
    for st in stages:
        if st.missing_ops:
            exp.notes.append(f"{st.name}: refsim.stablehlo has no rule for {sorted(st.missing_ops)}")
    return exp


def _name_op(exp: Explanation, prev, st, device_ids, max_ulp):
    op, res = None, None
    if st.name in ("lowered", "compiled") and prev.trace and st.trace:
        op, res = _first_diverging_op(prev.trace, st.trace, device_ids, max_ulp)
    if op is None and exp.output is not None:
        program = prev.program if st.name == "executed" else st.program
        op = _output_op(program, exp.output) if program is not None else None
        if op is not None and st.name == "executed":
            exp.notes.append("execution differs from the compiled module's semantics (codegen or runtime); the "
                             f"op shown defines output {exp.output} in the compiled module.")
        elif op is not None:
            exp.notes.append(f"no op inside could be paired with a differing value; the op shown defines output "
                             f"{exp.output} in the {st.name} module.")
    if op is None:
        return
    exp.op, exp.op_text, exp.source = op.name, op.text, op.loc.source
    if res is not None:  # the op's own value: its per-device errors and first differing elements
        exp.devices, exp.elements = res[1], res[2]


def explain(fn, *args, mesh=None, in_specs=None, out_specs=None, check_vma: bool = True, axis_names=None,
            in_shardings=None, out_shardings=None, pmap_kwargs=None, edit_module: Callable | None = None,
            max_ulp: float = 0, rtol: float = 0, lowering_platforms=None) -> Explanation:
    """Evaluate `fn(*args)` at every stage and report where the results first diverge.

    Layout keywords as `conformance.debug.bisect`: `in_specs`/`out_specs` (a shard_map body,
    with `mesh` a refsim Mesh over JAX devices, e.g. `xla_backend.mesh`), `in_shardings` /
    `out_shardings` (a jit program), or `pmap_kwargs` (a pmap body). `edit_module(text) -> text`
    rewrites the lowered module before XLA compiles it (a planted compiler-stage fault: the
    lowered stage still interprets JAX's module). An element agrees within `max_ulp` ULPs or a
    relative error `rtol` (both 0 by default: bit-exact, NaN equal to NaN). `lowering_platforms`
    (e.g. ("cuda",)) lowers for another platform: then only jaxpr and lowered are compared.
    """
    from conformance.debug import region as R

    _check_tolerances(max_ulp, rtol)  # before any tracing: NaN would make every stage "agree"
    kw = dict(mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma, axis_names=axis_names,
              in_shardings=in_shardings, out_shardings=out_shardings, pmap_kwargs=pmap_kwargs)
    note = None
    try:
        staged = _program.build(fn, args, lowering_platforms=lowering_platforms, **kw)
    except NotImplementedError as e:
        # no lowering rule on this platform (pbroadcast on CPU): GPU's lowering still shows the
        # lowered stage; the compiled and executed stages then cannot run here
        if lowering_platforms or "not found for platform" not in str(e):
            raise
        staged = _program.build(fn, args, lowering_platforms=("cuda",), **kw)
        note = f"no lowering on this platform ({str(e).splitlines()[0]}); lowered for cuda instead."
    reg = None
    if pmap_kwargs is None and axis_names is None:
        try:
            reg = R.trace(fn, args, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma,
                          in_shardings=in_shardings, out_shardings=out_shardings)
        except (ValueError, TypeError):
            reg = None  # the op is then named from the stages' own traces only
    if mesh is None:
        from refsim.layouts.mesh import Mesh

        ids = np.asarray(staged.device_ids)
        mesh = Mesh((ids.size,), ((pmap_kwargs or {}).get("axis_name") or "i",), device_ids=ids)
    exp = explain_staged(staged, region=reg, mesh=mesh, edit_module=edit_module, max_ulp=max_ulp, rtol=rtol)
    if note:
        exp.notes.insert(0, note)
    return exp


def explain_case(case, **kw) -> Explanation:
    """`explain` for a conformance case (`conformance.cases.Program`: shard_map, jit or pmap entry)."""
    if case.entry == "shard_map":
        return explain(case.fn, *case.args, mesh=case.mesh, in_specs=case.in_specs, out_specs=case.out_specs,
                       axis_names=case.axis_names, **kw)
    if case.entry == "jit":
        return explain(case.fn, *case.args, mesh=case.mesh, in_shardings=case.in_shardings,
                       out_shardings=case.out_shardings, **kw)
    if case.entry == "pmap":
        ids = [int(i) for i in np.asarray(case.mesh.device_ids).ravel()]
        return explain(case.fn, *case.args, pmap_kwargs=dict(axis_name=case.mesh.axis_names[0], devices=ids), **kw)
    raise ValueError(f"case {case.case_id} has entry {case.entry!r}: a device_put has no program to lower; "
                     "use conformance.debug (bisect) for it.")
