"""The export bundle on disk: a folder one JAX writes and another reads, data only.

    DIR/manifest.json          the programs, the exporter's versions, a sha256 per file
    DIR/pNNN/exported.bin      `jax.export.Exported.serialize()` (StableHLO + shardings)
    DIR/pNNN/module.mlir       the exported StableHLO as text (for people; never parsed)
    DIR/pNNN/inputs.npz        the program's arguments, ``arg0``, ``arg1``, ...
    DIR/pNNN/expected.npz      refsim's global outputs, ``out0``, ``out1``, ... (from the exporter's jaxpr)

Nothing read back is unpickled or executed: arrays load with ``allow_pickle=False``, the manifest
is JSON, and a program's source text in the manifest is there for people and reproducers only.
Every file's sha256 is in the manifest and is checked before the file is used (`load_program`):
a file that does not match raises `IntegrityError` and the program is reported, never run.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile

import ml_dtypes
import numpy as np

__all__ = ["FILES", "FORMAT", "MANIFEST", "POLICIES", "Bundle", "BundleWriter", "IntegrityError", "LoadedProgram",
           "load_program", "read_bundle", "sha256_file", "spec_from_data", "spec_to_data", "update_programs"]

FORMAT = "conformance-export-bundle-1"
MANIFEST = "manifest.json"
#: The files of one program: name in the manifest -> file name in its folder.
FILES = {"exported": "exported.bin", "module": "module.mlir", "inputs": "inputs.npz", "expected": "expected.npz"}
#: The comparison policy kinds of an output (`conformance.strategies.sharded.ShardedProgram.policies`).
POLICIES = ("exact", "abs", "rel")
_PROGRAM_ID = re.compile(r"^p\d{3,6}$")
_SHA = re.compile(r"^[0-9a-f]{64}$")


class IntegrityError(ValueError):
    """A bundle file whose content is not what the manifest's sha256 says (or that is missing)."""


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def spec_to_data(spec) -> list:
    """A PartitionSpec (refsim's or JAX's) as JSON: per dimension null, an axis name or a list of them."""
    out = []
    for p in spec:
        if p is None or isinstance(p, str):
            out.append(p)
        elif isinstance(p, tuple) and all(isinstance(a, str) for a in p):
            out.append(list(p))
        else:
            raise ValueError(f"{spec!r}: entry {p!r} is not None, an axis name or a tuple of them; a bundle "
                             "stores plain partition specs only.")
    return out


def spec_from_data(entries) -> tuple:
    """The PartitionSpec entries of `spec_to_data`'s JSON (a tuple: pass it to ``PartitionSpec(*...)``)."""
    if not isinstance(entries, list) or not all(
            e is None or isinstance(e, str) or isinstance(e, list) and all(isinstance(a, str) for a in e)
            for e in entries):
        raise ValueError(f"a spec is a list of null, axis names or lists of them, got {entries!r}")
    return tuple(tuple(e) if isinstance(e, list) else e for e in entries)


def _dtype(name: str) -> np.dtype:
    """The dtype named `name`: NumPy's, else ml_dtypes' (bfloat16, float8_*)."""
    try:
        return np.dtype(name)
    except TypeError:
        t = getattr(ml_dtypes, name, None)
        if t is None:
            raise ValueError(f"unknown dtype {name!r} in the manifest") from None
        return np.dtype(t)


def _save_npz(path: str, prefix: str, arrays) -> list:
    """Write `arrays` as ``prefix0``, ``prefix1``, ... and return their (dtype, shape) records."""
    arrays = [np.asarray(a) for a in arrays]
    for i, a in enumerate(arrays):
        if a.dtype.hasobject:
            raise ValueError(f"{prefix}{i} has dtype {a.dtype}: a bundle holds plain arrays only (no objects, "
                             "which would need pickle to read back).")
    # ml_dtypes arrays are saved as raw bytes of their width ('V2'); the manifest keeps their dtype
    np.savez(path, **{f"{prefix}{i}": a for i, a in enumerate(arrays)})
    return [{"dtype": str(a.dtype), "shape": [int(d) for d in a.shape]} for a in arrays]


def _load_npz(path: str, prefix: str, records: list) -> list:
    with np.load(path, allow_pickle=False) as z:
        names = sorted(z.files)
        want = sorted(f"{prefix}{i}" for i in range(len(records)))
        if names != want:
            raise ValueError(f"{path} holds {names}, the manifest names {want}")
        out = []
        for i, rec in enumerate(records):
            a = z[f"{prefix}{i}"]
            dt = _dtype(rec["dtype"])
            if a.dtype != dt:
                if a.dtype.kind != "V" or a.dtype.itemsize != dt.itemsize:
                    raise ValueError(f"{path}: {prefix}{i} has dtype {a.dtype}, the manifest says {dt}")
                a = a.view(dt)
            if list(a.shape) != list(rec["shape"]):
                raise ValueError(f"{path}: {prefix}{i} has shape {list(a.shape)}, the manifest says {rec['shape']}")
            out.append(a)
        return out


@dataclasses.dataclass
class Bundle:
    """A bundle folder read back: its path, the manifest's exporter record, its programs (dicts, in
    order) and the programs the exporter drew but could not export (`skipped`)."""

    path: str
    exporter: dict
    programs: list
    skipped: list
    seed: int | None = None


@dataclasses.dataclass
class LoadedProgram:
    """One program's checked files: the serialized Exported, the inputs, refsim's expected outputs."""

    entry: dict
    exported: bytes
    inputs: list
    expected: list


class BundleWriter:
    """Writes a bundle folder: `add` one program at a time, then `finish` writes the manifest (last,
    atomically: a folder without a manifest is no bundle)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if os.path.exists(os.path.join(self.path, MANIFEST)):
            raise ValueError(f"--out {self.path!r} already holds a bundle ({MANIFEST}); pass an empty or new folder.")
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ValueError(f"--out {self.path!r} is a file; pass a folder (it is created if missing).")
        os.makedirs(self.path, exist_ok=True)
        self.programs: list = []

    def add(self, meta: dict, *, exported: bytes, module_text: str, inputs, expected) -> dict:
        """Write one program's files and keep its manifest entry (`meta` plus files and array records)."""
        pid = f"p{len(self.programs):03d}"
        folder = os.path.join(self.path, pid)
        os.makedirs(folder, exist_ok=True)
        paths = {k: os.path.join(folder, name) for k, name in FILES.items()}
        with open(paths["exported"], "wb") as fh:
            fh.write(bytes(exported))
        with open(paths["module"], "w", encoding="utf-8") as fh:
            fh.write(module_text)
        entry = dict(meta, id=pid, inputs=_save_npz(paths["inputs"], "arg", inputs),
                     outputs=_save_npz(paths["expected"], "out", expected))
        entry["files"] = {k: {"path": f"{pid}/{FILES[k]}", "sha256": sha256_file(p)} for k, p in paths.items()}
        self.programs.append(entry)
        return entry

    def finish(self, *, exporter: dict, seed: int | None, skipped: list) -> str:
        doc = {"format": FORMAT, "exporter": exporter, "seed": seed, "programs": self.programs, "skipped": skipped}
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".manifest-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
        os.replace(tmp, os.path.join(self.path, MANIFEST))
        return os.path.join(self.path, MANIFEST)


def update_programs(path, fields: dict) -> None:
    """Add `fields` ({program id: {key: value}}) to the programs of the bundle manifest at `path`
    (rewritten atomically; the program files and their digests are not touched)."""
    where = os.path.join(os.fspath(path), MANIFEST)
    with open(where, encoding="utf-8") as fh:
        doc = json.load(fh)
    for e in doc["programs"]:
        e.update(fields.get(e["id"], {}))
    fd, tmp = tempfile.mkstemp(dir=os.fspath(path), prefix=".manifest-")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, where)


def _check_entry(e, n: int) -> None:
    if not isinstance(e, dict):
        raise ValueError(f"programs[{n}] is not an object")
    if not isinstance(e.get("id"), str) or not _PROGRAM_ID.match(e["id"]):
        raise ValueError(f"programs[{n}] has no id like 'p000'")
    files = e.get("files")
    if not isinstance(files, dict) or set(files) != set(FILES):
        raise ValueError(f"program {e['id']}: 'files' must name {sorted(FILES)}")
    for k, f in files.items():
        if not (isinstance(f, dict) and f.get("path") == f"{e['id']}/{FILES[k]}"
                and isinstance(f.get("sha256"), str) and _SHA.match(f["sha256"])):
            raise ValueError(f"program {e['id']}: files.{k} must be {{'path': '{e['id']}/{FILES[k]}', "
                             "'sha256': <64 hex digits>}")
    for key in ("inputs", "outputs"):
        recs = e.get(key)
        if not isinstance(recs, list) or not all(
                isinstance(r, dict) and isinstance(r.get("dtype"), str) and isinstance(r.get("shape"), list)
                and all(isinstance(d, int) and d >= 0 for d in r["shape"]) for r in recs):
            raise ValueError(f"program {e['id']}: '{key}' must be a list of {{'dtype', 'shape'}} records")
    mesh = e.get("mesh")
    if not (isinstance(mesh, dict) and isinstance(mesh.get("shape"), list) and isinstance(mesh.get("names"), list)
            and isinstance(mesh.get("device_ids"), list)):
        raise ValueError(f"program {e['id']}: 'mesh' must hold shape, names and device_ids")
    for key in ("in_specs", "out_specs"):
        if not isinstance(e.get(key), list):
            raise ValueError(f"program {e['id']}: '{key}' must be a list of specs")
        for s in e[key]:
            spec_from_data(s)
    if len(e["in_specs"]) != len(e["inputs"]) or len(e["out_specs"]) != len(e["outputs"]):
        raise ValueError(f"program {e['id']}: one spec per input and per output")
    pol = e.get("policies")
    if not (isinstance(pol, list) and len(pol) == len(e["outputs"]) and all(
            isinstance(p, list) and len(p) == 2 and p[0] in POLICIES and isinstance(p[1], (int, float))
            and not isinstance(p[1], bool) for p in pol)):
        raise ValueError(f"program {e['id']}: 'policies' must hold one [kind, value] per output, kind one of "
                         f"{', '.join(POLICIES)}")


def read_bundle(path) -> Bundle:
    """The bundle in folder `path` (its manifest checked for shape, not yet its files' digests);
    ValueError naming the folder and what is wrong otherwise."""
    path = os.fspath(path)
    where = os.path.join(path, MANIFEST)
    try:
        with open(where, encoding="utf-8") as fh:
            doc = json.load(fh)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"its format is not {FORMAT!r}")
        if not isinstance(doc.get("exporter"), dict) or not isinstance(doc.get("programs"), list):
            raise ValueError("it lacks 'exporter' or 'programs'")
        for n, e in enumerate(doc["programs"]):
            _check_entry(e, n)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{where}: not an export bundle manifest ({e}); pass a folder written by "
                         "`python -m conformance export-bundle --out DIR`.") from None
    return Bundle(path, doc["exporter"], doc["programs"], list(doc.get("skipped") or []), doc.get("seed"))


def load_program(bundle: Bundle, entry: dict) -> LoadedProgram:
    """`entry`'s files, each checked against its sha256 first: `IntegrityError` for a file that is
    missing or changed (nothing of it is loaded then), ValueError for arrays unlike the manifest's."""
    paths = {}
    for k, f in entry["files"].items():
        p = os.path.join(bundle.path, f["path"])
        try:
            got = sha256_file(p)
        except OSError as e:
            raise IntegrityError(f"{f['path']}: cannot be read ({e.strerror or e}); not run") from None
        if got != f["sha256"]:
            raise IntegrityError(f"{f['path']}: sha256 {got[:16]}... differs from the manifest's "
                                 f"{f['sha256'][:16]}...: the file changed after it was exported; not run")
        paths[k] = p
    with open(paths["exported"], "rb") as fh:
        exported = fh.read()
    return LoadedProgram(entry, exported, _load_npz(paths["inputs"], "arg", entry["inputs"]),
                         _load_npz(paths["expected"], "out", entry["outputs"]))
