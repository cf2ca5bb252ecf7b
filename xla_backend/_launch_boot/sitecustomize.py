"""Run at start-up by every Python child of `python -m xla_backend launch` (this folder is first
on its PYTHONPATH). At exit it leaves the launcher a note when the process joined JAX's
distributed runtime, so a plain JAX script that calls `jax.distributed.initialize` itself is
recognised as joined. It then loads the `sitecustomize` it shadows, if there is one.
Self-contained on purpose: it must not import JAX or xla_backend.
"""
import atexit
import json
import os
import sys


def _leave_note():
    folder = os.environ.get("XLA_BACKEND_HANDSHAKE")
    dist = sys.modules.get("jax._src.distributed")
    if not folder or dist is None:
        return
    state = dist.global_state
    # coordinator_address is set by initialize and survives jax.distributed.shutdown()
    if getattr(state, "coordinator_address", None) is None:
        return
    expected = os.environ.get("XLA_BACKEND_NUM_PROCESSES")
    note = {"process_id": int(os.environ.get("XLA_BACKEND_PROCESS_ID", "-1")), "pid": os.getpid(),
            "jax_process_id": state.process_id, "num_processes": state.num_processes,
            "joined": expected is None or str(state.num_processes) == expected, "by": "jax.distributed.initialize"}
    path = os.path.join(folder, f"joined-{note['process_id']}-{os.getpid()}.json")
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(note, fh)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def _load_shadowed():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


atexit.register(_leave_note)
_load_shadowed()
