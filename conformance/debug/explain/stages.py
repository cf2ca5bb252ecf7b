"""The four stages of one program, each giving every device's output shards.

jaxpr     refsim interprets the traced jaxpr (the program's documented semantics).
lowered   refsim.stablehlo interprets the StableHLO module JAX lowered (global arguments).
compiled  refsim.stablehlo interprets XLA's compiled, SPMD-partitioned per-device module
          (each device's own argument shards, its own partition_id).
executed  the compiled executable runs on the platform.

Every stage's outputs are put in one form: per output, an array (N, *shard shape) whose
entry p is the shard of the device running partition p, so adjacent stages compare shard
by shard. Each stage also records a trace (op key -> first value it produced) that
`conformance.debug.explain` uses to name the first op that diverged.
"""
from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Callable

import numpy as np

import refsim.stablehlo as sh
from refsim import compat as _compat
from refsim.interpreter.registry import Context, load_rules
from refsim.stablehlo import UnsupportedOp
from xla_backend import convert

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.

STAGES = ("jaxpr", "lowered", "compiled", "executed")
# the boundary before each stage, named after who is at fault when it is the first to differ
BOUNDARY = {"lowered": "lowering", "compiled": "compiler", "executed": "backend"}


@dataclasses.dataclass
class Stage:
    """One stage's result: `outputs` (per output, (N, *shard) in partition order), `seconds`,
    `error` (text, when the stage could not run), `trace` ({key: (op or eqn description,
    (N, *shape) value)}), `program` (the interpreted module's plan, lowered / compiled).

    `status`: "evaluated", "not evaluated" (refsim has no rule for an op of the module, the
    module was lowered for another platform, the platform cannot compile it, or an earlier
    step failed) or "crashed" (XLA failed compiling or running it); `reason` says why.
    """

    name: str
    outputs: list | None = None
    seconds: float = 0.0
    error: str | None = None
    missing_ops: dict | None = None
    trace: dict = dataclasses.field(default_factory=dict)
    program: Any = None
    status: str = "evaluated"
    reason: str | None = None
    note: str | None = None
    rerun: Any = None  # rerun(probe) -> outputs: interpret the module again with a (substituting) probe


def _index_map(placement, shape) -> dict:
    """{device id: index} of a placement (`xla_side.Placement`) or a JAX sharding."""
    if hasattr(placement, "indices_by_id"):
        return placement.indices_by_id(tuple(shape))
    return {d.id: i for d, i in placement.devices_indices_map(tuple(shape)).items()}


def shards_by_index(value: np.ndarray, sharding, device_ids) -> np.ndarray:
    """(N, *shard) from a global value (leading dim N or 1: one global view per device): entry p
    is the block of `value` that `sharding` (a JAX sharding or an `xla_side.Placement`) gives
    device `device_ids[p]` (None: all of it)."""
    if sharding is None:
        return np.stack([np.asarray(value[p if value.shape[0] > 1 else 0]) for p in range(len(device_ids))])
    by_id = _index_map(sharding, value.shape[1:])
    return np.stack([np.asarray(value[p if value.shape[0] > 1 else 0][by_id[dev]])
                     for p, dev in enumerate(device_ids)])


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def unsupported_on_platform(text: str) -> bool:
    """True when XLA says the platform does not implement an op (not a crash)."""
    return "UNIMPLEMENTED" in text or "not supported by XLA" in text


def _timed(stage: Stage, fn: Callable[[], Any], *, xla: bool = False):
    t0 = time.perf_counter()
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a stage that cannot run is reported, not raised

        stage.error = f"{type(e).__name__}: {e}"
        if isinstance(e, UnsupportedOp):
            stage.missing_ops = dict(getattr(e, "missing", {e.op: ""}))
            stage.status, stage.reason = "not evaluated", "missing rule: " + ", ".join(sorted(stage.missing_ops))
        elif xla and not unsupported_on_platform(str(e)):
            stage.status, stage.reason = "crashed", "XLA failed to run it: " + _first_line(e)
        else:
            stage.status, stage.reason = "not evaluated", _first_line(e)
        return None
    finally:
        stage.seconds = time.perf_counter() - t0


# -- keys that pair an op with the equation (or op) it came from ------------------------------

def loc_key(loc) -> tuple | None:
    return loc.key if loc.name and loc.file else None


_SRC = re.compile(r"^(.*?):(\d+):\d+(?: \(.*\))?$")


def eqn_key(eqn) -> tuple | None:
    src = _compat.eqn_source_line(eqn)
    if not src:
        return None
    m = _SRC.match(src)  # "file:line:col (function)"; the file name may contain spaces
    return (eqn.primitive.name, m.group(1), int(m.group(2))) if m else None


# evaluations of one op / equation kept for pairing (loop bodies run many times)
MAX_RUNS = 64


class Runs(list):
    """The evaluations of one op or equation: [(global evaluation counter, value), ...]."""

    @property
    def value(self):
        return self[0][1]


class _OpTrace:
    """Every evaluation (up to MAX_RUNS) of every op with a source location, keyed two ways.

    By (name, file, line) and occurrence: consecutive ops of one key in a block form one group
    (a primitive's lowering); the comparison picks the group's last op whose type matches the
    partner's (the primitive's result). By (file, line): what that line computed (`by_line`).
    Each op keeps its evaluations in order, so a loop body's k-th iteration pairs with the
    equation's k-th evaluation.
    """

    def __init__(self):
        self.runs: dict = {}
        self.counter = 0

    def probe(self, op, outs):
        self.counter += 1
        if outs and isinstance(outs[0], np.ndarray):
            runs = self.runs.setdefault(op.index, Runs())
            if len(runs) < MAX_RUNS:
                runs.append((self.counter, outs[0]))

    def keyed(self, program) -> dict:
        """{(key, occurrence): [(op, its runs), ...]} of the evaluated ops, grouped as `static_groups`."""
        out: dict = {}
        for group, op in located_ops(program):
            if op.index in self.runs:
                out.setdefault(group, []).append((op, self.runs[op.index]))
        return out


def located_ops(program):
    """((key, occurrence), op) of every op with a source location, in program order (regions
    depth first): consecutive ops of one location key in a block are one occurrence of it."""
    counts: dict = {}

    def block(b):
        prev = None
        for op in b.ops:
            key = loc_key(op.loc)
            if key is not None:
                if key != prev:
                    counts[key] = counts.get(key, 0) + 1
                yield (key, counts[key] - 1), op
            prev = key
            for r in op.regions:
                yield from block(r)

    for fn in program.funcs.values():
        yield from block(fn.body)


def static_groups(program) -> dict:
    """{(key, occurrence): [op, ...]} of every op with a source location, grouped as
    `_OpTrace.keyed` groups their evaluations (consecutive ops of one key in a block)."""
    out: dict = {}
    for group, op in located_ops(program):
        out.setdefault(group, []).append(op)
    return out


def by_line(trace: dict) -> dict:
    """{(file, line): [(op or eqn, Runs), ...]} in program order: what each source line computed."""
    out: dict = {}
    for (key, _), entries in trace.items():
        out.setdefault(key[1:], []).extend(entries)
    for ents in out.values():
        ents.sort(key=lambda e: _order(e[0]))
    return out


def _order(x) -> int:
    return x.order if isinstance(x, _Eqn) else x.index


# -- the stages --------------------------------------------------------------------------------

def _norm(index, shape) -> tuple:
    return tuple(i.indices(n)[:2] if isinstance(i, slice) else (int(i), int(i) + 1) for i, n in zip(index, shape))


def per_partition(arr, sharding, device_ids) -> np.ndarray:
    """(N, *shard) of a refsim.Array: entry p is the block JAX sharding `sharding` gives device
    `device_ids[p]`, taken from that device's own shard where refsim laid it out the same way (so
    replicas that disagree stay visible), else cut from the global value.

    `sharding` None: each device's own shard where refsim placed the value on every device (a
    shard_map or pmap output), else the global value on every device, as `shards_by_index` gives
    an output whose placement JAX left to XLA when XLA did not compile it (refsim then puts the
    value on one device: found-bugs 23's pad, whose compile aborts)."""
    by_id = {int(s.device_id): s for s in arr.shards}
    device_ids = [int(d) for d in device_ids]
    if sharding is None:
        if all(d in by_id for d in device_ids):
            return np.stack([np.asarray(by_id[d].data) for d in device_ids])
        whole = np.asarray(arr)
        return np.stack([whole] * len(device_ids))
    shape = tuple(arr.shape)
    want = _index_map(sharding, shape)
    rows, whole = [], None
    for d in device_ids:
        s = by_id.get(d)
        if s is not None and _norm(s.index, shape) == _norm(want[d], shape):
            rows.append(np.asarray(s.data))
            continue
        if whole is None:
            whole = np.asarray(arr)
        rows.append(np.asarray(whole[want[d]]))
    return np.stack(rows)


def _refsim_sharding(s):
    """A refsim sharding for a JAX output sharding (None where refsim has no equivalent)."""
    s = getattr(s, "sharding", s)
    if s is None or hasattr(s, "indices_by_id"):
        return None

    try:
        return convert.from_jax_sharding(s)
    except (TypeError, ValueError):
        return None


def run_jaxpr(staged, device_ids, region=None, shardings=None) -> Stage:
    st = Stage("jaxpr")

    def go():
        outs = staged.refsim([_refsim_sharding(s) for s in shardings] if shardings is not None else None)
        shs = list(shardings) if shardings is not None and len(shardings) == len(outs) else [None] * len(outs)
        return [per_partition(a, s, device_ids) for a, s in zip(outs, shs)]

    st.outputs = _timed(st, go)
    if region is not None and st.error is None:
        st.trace = _jaxpr_trace(*region)
    return st


def _jaxpr_trace(region, args) -> dict:
    """refsim's first value of every equation of the shard_map / jit body, nested ones (scan, while
    and cond bodies) included, keyed like ops: (primitive, file, line) and occurrence in order of
    first evaluation."""
    from refsim.interpreter import core
    from refsim.interpreter.rules.sharding import split_by_spec

    load_rules()
    nm = region.mesh.ndim if region.kind == "shard_map" else 0
    n = region.mesh.size
    seen: dict = {}
    counter = [0]

    def probe(eqn, invals, outvals):
        counter[0] += 1
        if not outvals or not isinstance(outvals[0], np.ndarray):
            return
        runs = seen.setdefault(id(eqn), (eqn, Runs()))[1]
        if len(runs) >= MAX_RUNS:
            return
        val = np.asarray(outvals[0])
        if nm:
            full = tuple(region.mesh.axis_sizes) + val.shape[nm:]
            val = np.broadcast_to(val, full).reshape((n,) + val.shape[nm:])
        else:
            val = val.reshape((1,) + val.shape)
        runs.append((counter[0], val))

    extra = {"fallback": False, "strict": False, "replication": [], "probe": probe}
    try:
        if region.kind == "shard_map":
            vals = [split_by_spec(a.reshape((1,) * nm + a.shape), region.mesh, sp) for a, sp in zip(args, region.in_layouts)]
            ctx = Context(nm=nm, mesh=region.mesh, extra=extra)
        else:
            vals, ctx = list(args), Context(extra=extra)
        core.eval_jaxpr(region.jaxpr, [core.lift(c, nm) for c in region.consts], *vals, ctx=ctx)
    except Exception:  # noqa: BLE001 - the trace only helps name an op
        return {}
    out: dict = {}
    counts: dict = {}
    prev = None
    order = 0
    for eqn, runs in seen.values():  # insertion order: order of first evaluation
        if eqn.primitive.name in _NO_OPS:
            continue  # lowers to no op: it does not separate the ops of the equations around it
        key = eqn_key(eqn)
        if key is None:
            prev = None
            continue
        # consecutive equations of one primitive and line form one group, as their ops do in a module
        if key != prev:
            counts[key] = counts.get(key, 0) + 1
        out.setdefault((key, counts[key] - 1), []).append((_Eqn(eqn, order), runs))
        order += 1
        prev = key
    return out


# primitives whose lowering emits no op (a type-level annotation)
_NO_OPS = frozenset({"pvary"})


class _Eqn:
    """A jaxpr equation with its position (`order`) in the body, for reports."""

    def __init__(self, eqn, order: int):
        self.eqn, self.order = eqn, order
        self.name = eqn.primitive.name


def out_shardings(staged, compiled) -> list:
    """Flat output shardings: the executable's, or those JAX lowered with when it did not compile."""
    import jax

    if compiled is not None:
        return jax.tree_util.tree_leaves(compiled.output_shardings,
                                         is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    # an output JAX left to XLA (UnspecifiedValue) is compared as the global value on every device
    return [s if isinstance(s, jax.sharding.Sharding) else None for s in _compat.lowered_out_shardings(staged.lowered)]


_XLA_WHERE = re.compile(r"((?:xla|third_party)/[\w/.\-]+\.(?:cc|h):\d+)")
_PASS = re.compile(r"during context \[([^\]]+)\]|(?:in|after) pass[ :]+['\"]?([\w\-]+)")


def classify_compile_error(e: BaseException, platforms=None) -> dict:
    """What a failed compile means: {"status", "reason"} for the compiled stage.

    "not evaluated" when the module was lowered for another platform or XLA says this
    platform does not implement an op (UNIMPLEMENTED); otherwise "crashed": XLA rejected or
    failed on a module JAX lowered (a verifier message, a failing pass, a RET_CHECK), which is
    the compiler's fault. The reason keeps XLA's first line and the pass or source file it names.
    """
    text = str(e)
    if platforms is not None:
        return {"status": "not evaluated", "reason": f"lowered for {list(platforms)}, not this platform"}
    if unsupported_on_platform(text):
        return {"status": "not evaluated", "reason": "the platform cannot compile it: " + _first_line(e)}
    m = _PASS.search(text)
    where = [w for w in ((m.group(1) or m.group(2)) if m else None,
                         (_XLA_WHERE.search(text) or [None, None])[1] if _XLA_WHERE.search(text) else None) if w]
    line = _first_line(e)
    reason = "XLA failed to compile it" + (f" ({', '.join(where)})" if where else "") + ": " + (
        line if len(line) <= 300 else line[:300] + " ...")
    out = {"status": "crashed", "reason": reason, "error": f"{type(e).__name__}: {text}"}
    if "pipeline-start" in text:
        out["note"] = ("XLA's verifier rejected the module before any pass ran: the module XLA was given is "
                       "invalid (look at JAX's lowering, or at what edited the module).")
    return out


def not_compiled(failure: dict) -> list:
    """The compiled and executed stages of a program XLA did not compile (`classify_compile_error`)."""
    compiled = Stage("compiled", error=failure.get("error", failure["reason"]), status=failure["status"],
                     reason=failure["reason"], note=failure.get("note"))
    executed = Stage("executed", error=f"not compiled: {failure['reason']}", status="not evaluated",
                     reason="not compiled")
    return [compiled, executed]


def run_lowered(staged, shardings, device_ids) -> Stage:
    st = Stage("lowered")

    def go():
        module = staged.lowered.compiler_ir("stablehlo")
        st.program = sh.load(module)
        kept = _compat.lowered_kept_args(staged.lowered, len(staged.global_args))
        args = [staged.global_args[i] for i in kept]
        def form(outs):
            return [shards_by_index(np.asarray(o), s, device_ids) for o, s in zip(outs, shardings)]

        tr = _OpTrace()
        outs = sh.interpret(st.program, *args, probe=tr.probe)
        st.trace = tr.keyed(st.program)
        st.rerun = lambda probe: form(sh.interpret(st.program, *args, probe=probe))
        return form(outs)

    st.outputs = _timed(st, go)
    return st


def flat_in_shardings(compiled) -> list:
    """A compiled program's input shardings, one per flat argument it takes (jax.stages.Compiled
    gives them as an (args, kwargs) pytree)."""
    import jax

    ins = compiled.input_shardings
    ins = ins[0] if isinstance(ins, tuple) and len(ins) == 2 and isinstance(ins[1], dict) else ins
    return jax.tree_util.tree_leaves(ins, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))


def run_compiled(staged, xla, device_ids) -> Stage:
    """refsim.stablehlo on XLA's compiled per-device module (`xla`: an `xla_side.XlaRun`)."""
    st = Stage("compiled")
    if xla.compiled is not None:
        f = xla.compiled
        st.status, st.reason, st.note = f["status"], f["reason"], f.get("note")
        st.error = f.get("error", f["reason"])
        return st

    def go():
        if isinstance(xla.module, Exception):
            raise xla.module
        st.program = sh.load(xla.module)
        kept = _compat.lowered_kept_args(staged.lowered, len(staged.global_args))
        args = [staged.global_args[i] for i in kept]
        shards = [shards_by_index(np.asarray(a)[None], s, device_ids) for a, s in zip(args, xla.in_placements)]
        def run(probe):
            outs = sh.interpret(st.program, *shards, per_device=True, num_partitions=len(device_ids), probe=probe)
            return [np.broadcast_to(o, (len(device_ids),) + o.shape[1:]) for o in outs]

        tr = _OpTrace()
        outs = run(tr.probe)
        st.trace = tr.keyed(st.program)
        st.rerun = run
        return outs

    st.outputs = _timed(st, go)
    return st


def run_executed(xla) -> Stage:
    """The outputs of the compiled executable, run on the platform (in `xla`'s process)."""
    st = Stage("executed")
    if xla.compiled is not None:
        st.status, st.reason, st.error = "not evaluated", "not compiled", "not compiled: " + xla.compiled["reason"]
    elif xla.executed is not None:
        st.status, st.reason = xla.executed["status"], xla.executed["reason"]
        st.error = xla.executed.get("error", st.reason)
    else:
        st.outputs = list(xla.outputs)
    return st
