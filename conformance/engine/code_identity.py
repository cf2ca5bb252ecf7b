"""The identity of the code that compiles and runs a program: what a stored executable is keyed on.

A version string does not identify a compiler: an editable JAX checkout, a patched or rebuilt
jaxlib, or a PJRT plugin under development all keep theirs while their code changes. So the
identity is the content of the files themselves: a sha256 over every file of the ``jax`` and
``jaxlib`` packages that Python would import now (wherever they live: site-packages, an editable
checkout, a copy earlier on ``sys.path``), of every PJRT plugin (the ``jax_plugins`` namespace,
top-level ``jax_cuda*`` / ``jax_rocm*`` / ``libtpu*`` packages, the libraries named in
``PJRT_NAMES_AND_LIBRARY_PATHS``), and of the code of this project that stages programs for XLA
and reads the cache back (``xla_backend/`` and the cache modules), with the project's version.

Hashing jaxlib's ~350 MB takes about a second, so each file's digest is remembered by its path,
size, modification and change times and inode (`FileDigests`, an in-process dict backed by a JSON
file beside the cache): a rerun only calls `stat`. Any write to a file changes its change time,
so an edited file is hashed again. Nothing here imports JAX.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pkgutil
import sys
import tempfile

__all__ = ["FileDigests", "code_files", "identity", "identity_digest", "project_version"]

# top-level packages that hold PJRT plugins or JAX's own compiled code
PLUGIN_PREFIXES = ("jax_cuda", "jax_rocm", "jax_tpu", "libtpu", "jax_plugins")
# this project's code whose edits change what is compiled or how a stored entry is read
PROJECT_PARTS = ("xla_backend", os.path.join("conformance", "engine", "compile_cache.py"),
                 os.path.join("conformance", "engine", "code_identity.py"))
_SKIP_DIRS = ("__pycache__",)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _package_dirs(name: str) -> list[str]:
    """Where Python would import package `name` from now (several folders for a namespace package)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return sorted(os.path.realpath(p) for p in spec.submodule_search_locations)
    return [os.path.realpath(spec.origin)] if spec.origin and os.path.exists(spec.origin) else []


def _walk(path: str) -> list[tuple[str, str]]:
    """(name, path) of every file under `path`, the name relative to `path`'s parent folder (so the
    identity does not depend on where the packages are installed)."""
    base = os.path.dirname(path)
    if os.path.isfile(path):
        return [(os.path.basename(path), path)]
    out = []
    for d, dirs, files in os.walk(path):
        dirs[:] = sorted(x for x in dirs if x not in _SKIP_DIRS)
        out += [(os.path.relpath(os.path.join(d, f), base), os.path.join(d, f))
                for f in sorted(files) if not f.endswith((".pyc", ".pyo"))]
    return out


def _plugin_roots() -> list[str]:
    names = sorted({m.name for m in pkgutil.iter_modules() if m.name.startswith(PLUGIN_PREFIXES)})
    roots = [p for n in names for p in _package_dirs(n)]
    for item in os.environ.get("PJRT_NAMES_AND_LIBRARY_PATHS", "").split(","):
        path = item.split(":", 1)[-1].strip()
        if path and os.path.exists(path):
            roots.append(os.path.realpath(path))
    for var in ("TPU_LIBRARY_PATH",):
        if os.environ.get(var) and os.path.exists(os.environ[var]):
            roots.append(os.path.realpath(os.environ[var]))
    return roots


def code_files() -> dict[str, list[tuple[str, str]]]:
    """The (name, path) of the files of each part of the identity: ``jax``, ``jaxlib``, ``plugins``,
    ``project``."""
    project = [f for part in PROJECT_PARTS for f in _walk(os.path.join(_ROOT, part)) if f[0].endswith(".py")]
    return {"jax": [f for d in _package_dirs("jax") for f in _walk(d)],
            "jaxlib": [f for d in _package_dirs("jaxlib") for f in _walk(d)],
            "plugins": [f for d in _plugin_roots() for f in _walk(d)],
            "project": project}


class FileDigests:
    """sha256 of files, remembered by (size, mtime_ns, ctime_ns, inode) in memory and in the JSON
    file `memo` (None: in memory only). An entry whose stat differs is hashed again."""

    def __init__(self, memo: str | None = None):
        self.memo = memo
        self._known: dict = {}
        self._changed = False
        if memo is not None:
            try:
                with open(memo, encoding="utf-8") as fh:
                    data = json.load(fh)
                if isinstance(data, dict) and data.get("format") == 1 and isinstance(data.get("files"), dict):
                    self._known = {k: v for k, v in data["files"].items()
                                   if isinstance(v, list) and len(v) == 5 and isinstance(v[4], str)}
            except (OSError, ValueError):
                self._known = {}   # missing or unreadable: hash afresh

    def digest(self, path: str) -> str:
        st = os.stat(path)
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        known = self._known.get(path)
        if known is not None and known[:4] == stamp:
            return known[4]
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
        self._known[path] = stamp + [h.hexdigest()]
        self._changed = True
        return h.hexdigest()

    def save(self) -> None:
        """Write the memo (whole or not at all); a memo that cannot be written is just not kept."""
        if self.memo is None or not self._changed:
            return
        try:
            os.makedirs(os.path.dirname(self.memo) or ".", exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.memo) or ".", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"format": 1, "files": self._known}, fh)
            os.replace(tmp, self.memo)
            self._changed = False
        except OSError:
            pass


def project_version() -> str:
    """The installed version of this project's distribution ("unknown" when run from a bare checkout)."""
    from importlib import metadata

    try:
        return metadata.version("jax-conformance")
    except metadata.PackageNotFoundError:
        return "unknown"


_IDENTITY: dict = {}


def identity(memo: str | None = None) -> dict:
    """{part: sha256 over its files' relative names and digests} for jax, jaxlib, plugins and the
    project, with the project's version and the Python version; computed once per process."""
    if "value" in _IDENTITY:
        return _IDENTITY["value"]
    digests = FileDigests(memo)
    out: dict = {}
    for part, files in code_files().items():
        h = hashlib.sha256()
        for name, path in files:
            h.update(name.encode() + b"\0" + digests.digest(path).encode() + b"\n")
        out[part] = f"{len(files)}:{h.hexdigest()}"
    digests.save()
    out["project_version"] = project_version()
    out["python"] = "%d.%d.%d" % sys.version_info[:3]
    _IDENTITY["value"] = out
    return out


def identity_digest(memo: str | None = None) -> str:
    """One sha256 hex digest of `identity`: the name of the cache folder its executables live in."""
    text = json.dumps(identity(memo), sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def reset() -> None:
    """Forget this process's identity (tests that change the installed code in between)."""
    _IDENTITY.clear()
