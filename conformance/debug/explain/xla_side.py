"""XLA's side of a staged program: the compiled per-device module, the shardings XLA chose and
the executed outputs, from one compile.

`isolated(staged)` compiles and runs the program in a worker process (`xla_backend.isolated`), so
a fatal XLA CHECK ends the worker, not the caller, and is reported as a crash of the step that was
running. `in_process(staged)` does the same in this process (`explain(..., isolate=False)`).
Either way the result is an `XlaRun`, which the stages read.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import refsim.stablehlo as sh
from conformance.debug.explain import stages as S
from refsim import compat
from xla_backend import isolated as iso

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.

# Edits of the lowered module planted by `conformance.faults.inject` (compiler-stage faults): explain
# applies them, in order, after its own `edit_module`, to every module it compiles.
PLANTED_EDITS: list = []


def with_planted(edit_module=None):
    """`edit_module` followed by the planted edits (`PLANTED_EDITS`), or `edit_module` when none is planted."""
    edits = [e for e in (edit_module, *PLANTED_EDITS) if e is not None]
    if len(edits) <= 1:
        return edits[0] if edits else None

    def edit(text: str) -> str:
        for e in edits:
            text = e(text)
        return text

    return edit


@dataclasses.dataclass
class Placement:
    """Where each partition's block of one value lives: {device id: index tuple} for a shape."""

    by_id: dict

    def indices_by_id(self, shape) -> dict:
        return self.by_id


class _JaxPlacement:
    def __init__(self, sharding):
        self.sharding = sharding

    def indices_by_id(self, shape) -> dict:
        return {d.id: i for d, i in self.sharding.devices_indices_map(tuple(shape)).items()}


@dataclasses.dataclass
class XlaRun:
    """One compile and run: `device_ids` (partition order), `out_placements` / `in_placements`
    (per output / module argument), `module` (the compiled module as StableHLO, or None),
    `outputs` ((N, *shard) per output, or None), and `compiled` / `executed`: None when the step
    worked, else {"status", "reason", ...} (`stages.classify_compile_error`'s form)."""

    device_ids: list
    out_placements: list
    in_placements: list = dataclasses.field(default_factory=list)
    module: Any = None
    outputs: list | None = None
    compiled: dict | None = None
    executed: dict | None = None


def _lowered_placements(staged) -> list:
    return [None if s is None else _JaxPlacement(s) for s in S.out_shardings(staged, None)]


def _failed(staged, failure: dict) -> XlaRun:
    return XlaRun(list(staged.device_ids), _lowered_placements(staged), compiled=failure,
                  executed={"status": "not evaluated", "reason": "not compiled"})


def in_process(staged, edit_module=None) -> XlaRun:
    """Compile and run in this process (a fatal XLA CHECK ends it)."""
    import jax

    try:
        with staged.context():
            compiled = (compat.compile_edited_module(staged.lowered, edit_module) if edit_module is not None
                        else staged.compiled())
    except Exception as e:  # noqa: BLE001 - classified: XLA crashed, or cannot compile it here
        return _failed(staged, S.classify_compile_error(e, staged.platforms))
    ids = compat.partition_device_ids(compiled)
    outs = [_JaxPlacement(s) for s in S.out_shardings(staged, compiled)]
    ins = [_JaxPlacement(s) for s in S.flat_in_shardings(compiled)]
    run = XlaRun(ids, outs, ins)
    try:
        run.module = sh.hlo_module_to_stablehlo(compiled)
    except Exception as e:  # noqa: BLE001 - the compiled stage then reports it
        run.module = e
    try:
        with staged.context():
            res = compiled(*staged.jargs)
        values = []
        for a in jax.tree_util.tree_leaves(res):
            by_id = {s.device.id: np.asarray(s.data) for s in a.addressable_shards}
            values.append(np.stack([by_id[d] for d in ids]))
        run.outputs = values
    except Exception as e:  # noqa: BLE001
        run.executed = _execute_failure(f"{type(e).__name__}: {e}")
    return run


def _execute_failure(text: str) -> dict:
    line = text.strip().splitlines()[0] if text.strip() else text
    if S.unsupported_on_platform(text):
        return {"status": "not evaluated", "reason": "the platform cannot run it: " + line}
    return {"status": "crashed", "reason": "XLA failed to run it: " + line, "error": text}


def isolated(staged, edit_module=None, *, timeout: float = 600.0) -> XlaRun:
    """Compile and run in `xla_backend.isolated`'s worker process."""
    import jax

    if staged.platforms is not None:
        return _failed(staged, S.classify_compile_error(RuntimeError("lowered elsewhere"), staged.platforms))
    with staged.context():
        record = iso.capture(staged.lowered, edit_module)
    if record.get("host_callbacks"):
        return in_process(staged, edit_module)  # a host callback runs Python of this process
    kept = compat.lowered_kept_args(staged.lowered, len(staged.global_args))
    args = [staged.global_args[i] for i in kept]
    out_shapes = [tuple(o.shape) for o in jax.tree_util.tree_leaves(staged.lowered.out_info)]
    ans = iso.run(record, args, out_shapes, timeout=timeout)
    if ans.get("phase") == "inspect":
        return _failed(staged, {"status": "not evaluated",
                                "reason": "XLA compiled it, but its module could not be read back: " + ans["error"]})
    if ans.get("phase") in ("start", "compile"):
        text = ans.get("error", "")
        if ans.get("crashed"):
            failure = {"status": "crashed", "reason": "XLA crashed compiling it: " + text,
                       "error": text + "\n" + ans.get("stderr", "")}
        else:
            failure = S.classify_compile_error(RuntimeError(text.split(": ", 1)[-1]), None)
            failure["reason"] = failure["reason"].replace("RuntimeError: ", "", 1)
        return _failed(staged, failure)
    ids = list(ans["device_ids"])

    def placements(indices):
        return [Placement({d: idx for d, idx in zip(ids, per)}) for per in indices]

    run = XlaRun(ids, placements(ans["out_indices"]), placements(ans["in_indices"]))
    try:
        run.module = sh.hlo_module_to_stablehlo(compat.hlo_module_from_proto(ans["hlo_proto"]))
    except Exception as e:  # noqa: BLE001 - the compiled stage then reports it
        run.module = e
    if ans["phase"] == "execute":
        text = ans.get("error", "")
        if ans.get("crashed"):
            run.executed = {"status": "crashed", "reason": "XLA crashed running it: " + text,
                            "error": text + "\n" + ans.get("stderr", "")}
        else:
            run.executed = _execute_failure(text)
    else:
        run.outputs = ans["outputs"]
    return run
