"""Dump every intermediate value of a refsim run: one `.npz` file per evaluated equation.

Like the StableHLO reference interpreter's probe and ONNX Runtime's intermediate outputs,
a `Recorder` is the interpreter's probe hook (`refsim.interpreter.core.apply_eqn`): after
each equation, including those inside sub-jaxprs (every loop iteration is its own file), it
writes `NNNNNN_<primitive>.npz` holding `out0`, `out1`, ... as refsim holds them: stacked,
the mesh dims first (size 1 where the value is invariant over that axis), then the value's
own shape; outside a manual region the value is global (no mesh dims). `meta` (JSON) names
the primitive, params, source line, output avals, mesh axes and device ids. `index.json`
lists the files in evaluation order. `load` and `device_value` read them back.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import numpy as np

_VERSION = 1


def _storable(a: np.ndarray) -> tuple[np.ndarray, str]:
    """(array NumPy can save without pickling, dtype name to restore); ml_dtypes go as raw bits."""
    a = np.asarray(a)
    if a.dtype.fields is None and a.dtype.type.__module__ != "numpy":
        return np.ascontiguousarray(a).view(np.dtype(f"u{a.dtype.itemsize}")), a.dtype.name
    return a, a.dtype.str if a.dtype.fields is None else "structured"


def _restore(a: np.ndarray, name: str) -> np.ndarray:
    if name in ("structured",) or name.startswith(("<", ">", "|")):
        return a
    import ml_dtypes

    return a.view(np.dtype(getattr(ml_dtypes, name)))


class Recorder:
    """A probe writing each equation's outputs to `directory` (created; must be new or empty).

    `mesh` (a refsim Mesh) is recorded as metadata so a file says which device each
    stacked position is. `inputs=True` also stores the equation's operands (`in0`, ...).
    """

    def __init__(self, directory=None, *, mesh=None, inputs: bool = False):
        if directory is None:
            directory = tempfile.mkdtemp(prefix="refsim-intermediates-")
        directory = os.fspath(directory)
        if os.path.exists(directory) and (not os.path.isdir(directory) or os.listdir(directory)):
            raise ValueError(
                f"intermediates={directory!r} exists and is not an empty directory; pass a new or empty "
                "directory (or intermediates=True for a fresh temporary one).")
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.mesh = mesh
        self.inputs = bool(inputs)
        self.files: list[str] = []

    def __call__(self, eqn, invals, outvals) -> None:
        from refsim import compat

        k = len(self.files)
        name = f"{k:06d}_{eqn.primitive.name}.npz"
        arrays: dict[str, np.ndarray] = {}
        outs_meta = []
        for i, (var, val) in enumerate(zip(eqn.outvars, outvals)):
            arr, dt = _storable(val)
            arrays[f"out{i}"] = arr
            shape = getattr(var.aval, "shape", ())
            outs_meta.append({"aval": str(var.aval), "dtype": dt, "mesh_dims": int(np.ndim(val) - len(shape))})
        if self.inputs:
            for i, val in enumerate(invals):
                arrays[f"in{i}"], _ = _storable(val)
        meta = {
            "version": _VERSION, "index": k, "primitive": eqn.primitive.name,
            "params": {p: _short_repr(v) for p, v in eqn.params.items()},
            "source": compat.eqn_source_line(eqn), "outputs": outs_meta,
        }
        if self.mesh is not None:
            meta["mesh"] = {"axis_names": list(self.mesh.axis_names), "axis_sizes": list(self.mesh.axis_sizes),
                            "device_ids": np.asarray(self.mesh.device_ids).tolist()}
        np.savez(os.path.join(self.directory, name), meta=np.array(json.dumps(meta)), **arrays)
        self.files.append(name)
        with open(os.path.join(self.directory, "index.json"), "w") as fh:
            json.dump({"version": _VERSION, "files": self.files}, fh)


def _short_repr(v: Any, limit: int = 2000) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + " ..."


def load(directory) -> list[dict]:
    """The records of a dump, in evaluation order: dicts with the `meta` keys plus `outputs`
    (the stacked arrays, dtypes restored) and, if recorded, `inputs`."""
    directory = os.fspath(directory)
    index = os.path.join(directory, "index.json")
    if not os.path.exists(index):
        raise ValueError(f"{directory!r} has no index.json; pass a directory written by refsim with "
                         "intermediates=... (see refsim.intermediates.Recorder).")
    with open(index) as fh:
        files = json.load(fh)["files"]
    records = []
    for name in files:
        with np.load(os.path.join(directory, name), allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            meta["file"] = name
            meta["outputs_data"] = [_restore(z[f"out{i}"], o["dtype"]) for i, o in enumerate(meta["outputs"])]
            ins = sorted((k for k in z.files if k.startswith("in")), key=lambda k: int(k[2:]))
            meta["inputs_data"] = [z[k] for k in ins]
        records.append(meta)
    return records


def device_value(record: dict, output: int, device_id: int) -> np.ndarray:
    """Device `device_id`'s own value of output `output` of a loaded record (global values are
    the same on every device)."""
    data = record["outputs_data"][output]
    nm = record["outputs"][output]["mesh_dims"]
    if nm == 0:
        return data
    mesh = record.get("mesh")
    if mesh is None:
        raise ValueError("this record has mesh dims but no mesh metadata; record with Recorder(mesh=...).")
    ids = np.asarray(mesh["device_ids"])
    where = np.argwhere(ids == device_id)
    if not len(where):
        raise ValueError(f"device_id={device_id} is not in the recorded mesh (ids {sorted(ids.ravel().tolist())}).")
    pos = tuple(int(p) if data.shape[d] != 1 else 0 for d, p in enumerate(where[0]))
    return data[pos]


def recorder_for(intermediates, mesh=None) -> Recorder | None:
    """The Recorder an entry point's `intermediates=` argument asks for: None/False: none; True: a
    fresh temporary directory; a path: that (new or empty) directory."""
    if intermediates is None or intermediates is False:
        return None
    if intermediates is True:
        return Recorder(None, mesh=mesh)
    if isinstance(intermediates, (str, os.PathLike)):
        return Recorder(intermediates, mesh=mesh)
    raise TypeError(f"intermediates={intermediates!r}; pass True (a temporary directory), a directory path, "
                    "or None.")
