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

from refsim import compat as _compat

STAGES = ("jaxpr", "lowered", "compiled", "executed")
# the boundary before each stage, named after who is at fault when it is the first to differ
BOUNDARY = {"lowered": "lowering", "compiled": "compiler", "executed": "backend"}


@dataclasses.dataclass
class Stage:
    """One stage's result: `outputs` (per output, (N, *shard) in partition order), `seconds`,
    `error` (text, when the stage could not run), `trace` ({key: (op or eqn description,
    (N, *shape) value)}), `program` (the interpreted module's plan, lowered / compiled)."""

    name: str
    outputs: list | None = None
    seconds: float = 0.0
    error: str | None = None
    missing_ops: dict | None = None
    trace: dict = dataclasses.field(default_factory=dict)
    program: Any = None


def shards_by_index(value: np.ndarray, sharding, device_ids) -> np.ndarray:
    """(N, *shard) from a global value (leading dim N or 1: one global view per device): entry p
    is the block of `value` that JAX sharding `sharding` gives device `device_ids[p]`."""
    idx = sharding.devices_indices_map(tuple(value.shape[1:]))
    by_id = {d.id: i for d, i in idx.items()}
    return np.stack([np.asarray(value[p if value.shape[0] > 1 else 0][by_id[dev]])
                     for p, dev in enumerate(device_ids)])


def _timed(stage: Stage, fn: Callable[[], Any]):
    t0 = time.perf_counter()
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a stage that cannot run is reported, not raised
        from refsim.stablehlo import UnsupportedOp

        if isinstance(e, UnsupportedOp):
            stage.missing_ops = dict(getattr(e, "missing", {e.op: ""}))
        stage.error = f"{type(e).__name__}: {e}"
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
        out: dict = {}
        counts: dict = {}

        def block(b):
            prev = None
            for op in b.ops:
                key = loc_key(op.loc)
                if key is not None and op.index in self.runs:
                    if key != prev:
                        counts[key] = counts.get(key, 0) + 1
                    out.setdefault((key, counts[key] - 1), []).append((op, self.runs[op.index]))
                prev = key
                for r in op.regions:
                    block(r)

        for fn in program.funcs.values():
            block(fn.body)
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

def run_jaxpr(staged, device_ids, region=None) -> Stage:
    st = Stage("jaxpr")

    def go():
        outs = staged.refsim()
        res = []
        for a in outs:
            by_id = {int(s.device_id): np.asarray(s.data) for s in a.shards}
            res.append(np.stack([by_id[d] for d in device_ids]))
        return res

    st.outputs = _timed(st, go)
    if region is not None and st.error is None:
        st.trace = _jaxpr_trace(*region)
    return st


def _jaxpr_trace(region, args) -> dict:
    """refsim's first value of every equation of the shard_map / jit body, nested ones (scan, while
    and cond bodies) included, keyed like ops: (primitive, file, line) and occurrence in order of
    first evaluation."""
    from refsim.interpreter import core
    from refsim.interpreter.registry import Context, load_rules
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
    for eqn, runs in seen.values():  # insertion order: order of first evaluation
        key = eqn_key(eqn)
        if key is None:
            continue
        counts[key] = counts.get(key, 0) + 1
        out[(key, counts[key] - 1)] = [(_Eqn(eqn, len(out)), runs)]
    return out


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
    return _compat.lowered_out_shardings(staged.lowered)


def not_compiled(name: str, error: str) -> Stage:
    return Stage(name, error=f"not compiled: {error}")


def run_lowered(staged, shardings, device_ids) -> Stage:
    import refsim.stablehlo as sh

    st = Stage("lowered")

    def go():
        module = staged.lowered.compiler_ir("stablehlo")
        st.program = sh.load(module)
        kept = _compat.lowered_kept_args(staged.lowered, len(staged.global_args))
        tr = _OpTrace()
        outs = sh.interpret(st.program, *[staged.global_args[i] for i in kept], probe=tr.probe)
        st.trace = tr.keyed(st.program)
        return [shards_by_index(np.asarray(o), s, device_ids) for o, s in zip(outs, shardings)]

    st.outputs = _timed(st, go)
    return st


def flat_in_shardings(compiled) -> list:
    """A compiled program's input shardings, one per flat argument it takes (jax.stages.Compiled
    gives them as an (args, kwargs) pytree)."""
    import jax

    ins = compiled.input_shardings
    ins = ins[0] if isinstance(ins, tuple) and len(ins) == 2 and isinstance(ins[1], dict) else ins
    return jax.tree_util.tree_leaves(ins, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))


def run_compiled(staged, compiled, device_ids) -> Stage:
    import refsim.stablehlo as sh

    st = Stage("compiled")

    def go():
        st.program = sh.load(sh.hlo_module_to_stablehlo(compiled))
        kept = _compat.lowered_kept_args(staged.lowered, len(staged.global_args))
        args = [staged.global_args[i] for i in kept]
        shards = [shards_by_index(np.asarray(a)[None], s, device_ids) for a, s in zip(args, flat_in_shardings(compiled))]
        tr = _OpTrace()
        outs = sh.interpret(st.program, *shards, per_device=True, num_partitions=len(device_ids), probe=tr.probe)
        st.trace = tr.keyed(st.program)
        return [np.broadcast_to(o, (len(device_ids),) + o.shape[1:]) for o in outs]

    st.outputs = _timed(st, go)
    return st


def run_executed(staged, compiled, device_ids) -> Stage:
    import jax

    st = Stage("executed")

    def go():
        with staged.context():
            outs = compiled(*staged.jargs)  # a Compiled drops the arguments the module does not take
        res = []
        for a in jax.tree_util.tree_leaves(outs):
            by_id = {s.device.id: np.asarray(s.data) for s in a.addressable_shards}
            res.append(np.stack([by_id[d] for d in device_ids]))
        return res

    st.outputs = _timed(st, go)
    return st

