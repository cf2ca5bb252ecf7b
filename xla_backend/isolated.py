"""Compile and run a lowered program in a child process, so a fatal XLA CHECK cannot end ours.

`capture(lowered)` records what XLA would be asked to compile (the module, the compile options,
the device assignment) without compiling it. `run(record, args, out_shapes)` hands that record to
a worker process (``python -m xla_backend.isolated``, started once and reused), which compiles it,
reads back the compiled per-device HLO module and the shardings XLA chose, and runs it on the
arguments. The answer is a plain dict:

    {"phase": "done", "device_ids": [...], "hlo_proto": bytes, "hlo_text": str,
     "in_indices": [...], "out_indices": [...], "outputs": [(N, *shard) ndarray, ...]}

or, when a step fails, ``"phase"`` names it ("compile", "execute", or "inspect": reading the
compiled executable's module and shardings back) with ``"error"`` (XLA's
exception as text) and, when the worker died (a CHECK failure aborts it), ``"crashed": True``,
``"exit"`` (the signal or exit status) and ``"stderr"`` (the end of what it printed: XLA's
``Check failed`` line). The next `run` starts a fresh worker.
"""
from __future__ import annotations

import atexit
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import time

from refsim import compat

__all__ = ["PLANTED_CHECK", "capture", "run", "shutdown"]

_HEADER = struct.Struct("<Q")

#: A test seam: "compile" or "execute" (or (step, op name): only for a module that has that op)
#: makes the worker fail that step as a fatal XLA CHECK does (a ``Check failed`` line on stderr,
#: then abort). `conformance.faults.compiler.XLA_CHECK_IN_COMPILE` / `XLA_CHECK_IN_EXECUTE` /
#: `xla_check_on(op)` set it for a ``with faults.inject(...)`` block.
PLANTED_CHECK = None


def capture(lowered, edit_module=None) -> dict:
    """The compile XLA would do for `lowered` (a jax.stages.Lowered), as `compat.capture_compile`
    records it; `edit_module(text) -> text` rewrites the module first (a planted compiler fault)."""
    return compat.capture_compile(lowered, edit_module)


# -- framing --------------------------------------------------------------------------------------
def _send(fd: int, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None  # the other side closed: the worker died
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv(fd: int, deadline: float | None = None):
    head = _read_exact(fd, _HEADER.size, deadline)
    if head is None:
        return None
    body = _read_exact(fd, _HEADER.unpack(head)[0], deadline)
    return None if body is None else pickle.loads(body)


# -- the parent's side ----------------------------------------------------------------------------
class _Worker:
    def __init__(self):
        self.stderr = tempfile.TemporaryFile()
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env.setdefault("PYTHONFAULTHANDLER", "1")  # a crash prints where Python was
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self.proc = subprocess.Popen([sys.executable, "-m", "xla_backend.isolated"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, env=env)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self, limit: int = 4000) -> str:
        self.stderr.seek(0, os.SEEK_END)
        size = self.stderr.tell()
        self.stderr.seek(max(0, size - limit))
        return self.stderr.read().decode(errors="replace")

    def close(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        self.stderr.close()


_WORKER: _Worker | None = None


def shutdown() -> None:
    """Stop the worker process (started again by the next `run`)."""
    global _WORKER
    if _WORKER is not None:
        _WORKER.close()
        _WORKER = None


atexit.register(shutdown)


def _crash_text(tail: str) -> str:
    """XLA's fatal line from the worker's stderr (``Check failed: ...``), else its last line."""
    import re

    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    for ln in lines:
        if "Check failed" in ln or re.match(r"F\d{4} ", ln):
            return ln
    return lines[-1] if lines else "no message"


def run(record: dict, args, out_shapes, *, timeout: float = 600.0) -> dict:
    """Compile `record` (from `capture`) and run it on the global NumPy `args` (the arguments the
    module takes) in the worker process; see the module docstring for the answer."""
    global _WORKER
    if _WORKER is None or not _WORKER.alive():
        shutdown()
        _WORKER = _Worker()
    w = _WORKER
    phase = "start"
    compiled: dict = {}   # what the compile gave, kept for a crash while executing
    deadline = time.monotonic() + timeout
    try:
        _send(w.proc.stdin.fileno(), {"record": record, "args": list(args), "out_shapes": [tuple(s) for s in out_shapes],
                                      "planted_check": PLANTED_CHECK})
        while True:
            msg = _recv(w.proc.stdout.fileno(), deadline)
            if msg is None:
                break
            compiled.update(msg.pop("compiled", {}))
            if msg.get("phase") in ("compile", "execute", "inspect"):
                phase = msg["phase"]
                if "error" not in msg:
                    continue
            return {**compiled, **msg}
    except TimeoutError:
        tail = w.stderr_tail()
        shutdown()
        return {**compiled, "phase": phase, "crashed": True, "exit": "timeout",
                "error": f"XLA did not finish the {phase} in {timeout:g} s", "stderr": tail}
    except (BrokenPipeError, ConnectionResetError):
        pass
    w.proc.wait()
    tail = w.stderr_tail()
    code = w.proc.returncode
    shutdown()
    how = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
    return {**compiled, "phase": phase, "crashed": True, "exit": how, "stderr": tail,
            "error": f"the XLA worker died during the {phase} ({how}): {_crash_text(tail)}"}


# -- the worker's side ----------------------------------------------------------------------------
def _planted(req: dict, phase: str) -> None:
    plant = req.get("planted_check")
    if isinstance(plant, tuple):
        plant, needle = plant
        if needle not in compat.module_text(req["record"]["module"]):
            return
    if plant == phase:
        print(f"F0000 00:00:00.000000 planted.cc:1] Check failed: planted fatal CHECK in the {phase}", file=sys.stderr,
              flush=True)
        os.abort()


def _serve() -> None:
    out_fd = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())   # stray prints must not corrupt the frames
    in_fd = sys.stdin.fileno()
    import numpy as np

    while True:
        req = _recv(in_fd)
        if req is None:
            return
        rec = req["record"]
        _send(out_fd, {"phase": "compile"})
        _planted(req, "compile")
        try:
            exe = compat.compile_captured(rec["module"], rec["options"], rec["device_ids"])
        except Exception as e:  # noqa: BLE001 - XLA's failure is the answer
            _send(out_fd, {"phase": "compile", "error": f"{type(e).__name__}: {e}"})
            continue
        try:
            hlo = exe.hlo_modules()[0]
            kept_shapes = [np.shape(a) for a in req["args"]]
            layout = compat.executable_layout(exe, kept_shapes, req["out_shapes"])
            answer = {"device_ids": layout["device_ids"], "in_indices": layout["in_indices"],
                      "out_indices": layout["out_indices"], "hlo_proto": hlo.as_serialized_hlo_module_proto(),
                      "hlo_text": hlo.to_string()}
        except Exception as e:  # noqa: BLE001 - reading XLA's result failed: no stage of XLA's to blame
            _send(out_fd, {"phase": "inspect", "error": f"{type(e).__name__}: {e}"})
            continue
        _send(out_fd, {"phase": "execute", "compiled": answer})
        _planted(req, "execute")
        try:
            answer["outputs"] = compat.execute_captured(exe, req["args"], layout)
        except Exception as e:  # noqa: BLE001
            _send(out_fd, {"phase": "execute", "error": f"{type(e).__name__}: {e}", **answer})
            continue
        _send(out_fd, {"phase": "done", **answer})


if __name__ == "__main__":
    _serve()
