"""JAX's persistent compilation cache for conformance runs: a rerun on the same machine skips XLA compiles.

XLA compilation is most of a conformance run's time. JAX can keep every compiled executable
on disk, keyed by the lowered module (debug info stripped), the compile options, the
device assignment, the XLA flags and the jaxlib version, so a rerun with the same seed
(or any case whose program lowers to the same module) loads the executable instead of
compiling it. `python -m conformance run` turns it on by default in `default_dir()`
(``--compile-cache DIR`` elsewhere, ``--compile-cache off`` or ``CONFORMANCE_COMPILE_CACHE=off``
not at all); `runner.run` leaves JAX's configuration alone unless given ``compile_cache=``.

Beside it, in ``DIR/executables``, an `ExecutableStore` keeps each program case's serialized
executable under a key computed **before** tracing (`stable_key`: the case's source, the mesh with
its device order, specs or shardings, input avals, JAX/jaxlib versions, platform and devices,
``XLA_FLAGS`` and JAX's config), so a rerun loads it without tracing, lowering or compiling.

Injected faults (`conformance.faults`) turn both off while they are active, so no
wrong executable is ever written or read.
"""
from __future__ import annotations

import os

ENV = "CONFORMANCE_COMPILE_CACHE"
STORE_ENV = "CONFORMANCE_EXECUTABLE_STORE"


OFF = ("off", "none", "no", "0")


def default_dir() -> str | None:
    """``$CONFORMANCE_COMPILE_CACHE`` (None if it says "off"), else
    ``$XDG_CACHE_HOME/refsim-conformance/xla`` (~/.cache by default)."""
    if os.environ.get(ENV):
        value = os.environ[ENV]
        return None if value.strip().lower() in OFF else value
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "refsim-conformance", "xla")


def enable(path: str) -> str:
    """Cache every compiled executable in `path` (created if missing), in this process and in
    worker processes started after this call (through JAX's environment variables).

    Every entry is kept, however fast it compiled: the suite's programs compile in tens of
    milliseconds each, below JAX's default threshold of one second. Returns the absolute path.
    """
    path, settings, env = _settings(path)
    os.environ.update(env)   # spawned workers read these when they import jax, and in `install_from_env`
    import jax  # not at the top: the CLI imports this module before the platform is configured

    for name, value in settings.items():
        jax.config.update(name, value)
    install_from_env()
    return path


def worker_environment(path: str) -> dict:
    """The environment variables `enable(path)` sets for the worker processes it starts (JAX's
    cache settings, read when they import jax; the executable store, read by `install_from_env`),
    without changing anything in this process: for workers started before it enables the cache
    (`conformance.engine.workers.start(env=...)`). Creates the folder."""
    return _settings(path)[2]


def _settings(path: str) -> tuple[str, dict, dict]:
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"compile_cache={path!r} cannot be created ({e}); pass a writable folder, or "
                         "--compile-cache off.") from None
    settings = {"jax_compilation_cache_dir": path, "jax_persistent_cache_min_compile_time_secs": 0.0,
                "jax_persistent_cache_min_entry_size_bytes": -1}
    env = {name.upper(): str(value) for name, value in settings.items()}
    env[STORE_ENV] = os.path.join(path, EXECUTABLES)
    return path, settings, env


def install_from_env() -> bool:
    """Back `xla_backend.cache` with the `ExecutableStore` that `enable` named in
    ``$CONFORMANCE_EXECUTABLE_STORE`` (this process or a worker it started); whether one is now."""
    from xla_backend import cache

    folder = os.environ.get(STORE_ENV)
    if not folder:
        return False
    cache.set_store(ExecutableStore(folder))
    return True


# -- executables, keyed before tracing ---------------------------------------------------------------
EXECUTABLES = "executables"   # the store's subfolder of the compile-cache folder


class Unstable(Exception):
    """A part of a cache key that has no stable text (a closure, an object named by its address)."""


def _case_source(fn) -> str | None:
    """The source a case function was compiled from (`conformance.cases.program.compile_source`)."""
    from conformance.cases import program

    for source, f in program._NAMESPACE_CACHE.items():
        if f is fn:
            return source
    return None


CASE_MODULES = ("conformance.cases.",)   # modules whose top-level functions are case programs (the corpus)


def _module_function(fn) -> str:
    """A top-level function (or lambda) of a case module (`CASE_MODULES`, the corpus's programs) by its
    module, name, line and code, and the sha256 of its module's file, which holds it and every helper of
    that module it calls."""
    import hashlib
    import sys

    mod = sys.modules.get(fn.__module__ or "")
    path = getattr(mod, "__file__", None)
    if (fn.__closure__ is not None or mod is None or path is None or "<locals>" in fn.__qualname__
            or not fn.__module__.startswith(CASE_MODULES)):
        raise Unstable(f"function {fn.__qualname__} is neither a case's source nor a case module's function")
    digest = _FILE_DIGESTS.get(path)
    if digest is None:
        with open(path, "rb") as fh:
            digest = _FILE_DIGESTS[path] = hashlib.sha256(fh.read()).hexdigest()
    code = fn.__code__   # which function of the file (a lambda has no name of its own)
    where = hashlib.sha256(code.co_code + repr(code.co_names).encode()).hexdigest()[:16]
    return f"function:{fn.__module__}.{fn.__qualname__}@{code.co_firstlineno}:{where}:{digest}"


_FILE_DIGESTS: dict = {}


def _mesh_text(axis_names, device_ids, axis_types=None) -> str:
    import numpy as np

    # the ids as the mesh holds them: their shape is the axis sizes (a 1x3 and a 3x1 mesh of the same
    # devices and names are different programs)
    ids = np.asarray(device_ids)
    return (f"mesh({tuple(axis_names)!r},{tuple(int(n) for n in ids.shape)!r},{[int(i) for i in ids.ravel()]!r},"
            f"{tuple(str(t) for t in axis_types or ())!r})")


def _spec_text(spec) -> str:
    """A PartitionSpec (refsim's or JAX's) by its entries and its unreduced / reduced axes."""
    # JAX's refuses `tuple()` when it has unreduced / reduced axes; `.partitions` are its entries
    parts = spec.partitions if isinstance(getattr(type(spec), "partitions", None), property) else tuple(spec)
    text = f"P{encode(tuple(parts))}"
    for field in ("unreduced", "reduced"):
        axes = getattr(spec, field, None)
        if axes:
            text += f"{field}{encode(frozenset(axes))}"
    return text


def encode(part) -> str:
    """Stable text of one part of an `xla_backend.cache` key, the same in every process: a case
    function as the hash of its source, a mesh by its axis names, axis sizes, device ids in order and
    axis types, a spec by its entries and unreduced / reduced axes, a sharding by its mesh, spec and
    memory kind, arrays by dtype, shape and bytes.
    `Unstable` for what has no such text (any other function, an object whose text is its
    address): that key is not stored."""
    import hashlib
    import types

    import numpy as np

    if part is None or isinstance(part, (bool, int, float, str, bytes)):
        return repr(part)
    if type(part).__qualname__ in ("PartitionSpec", "P"):   # before tuples: refsim's is a tuple subclass
        return _spec_text(part)
    if isinstance(part, (tuple, list)):
        return ("(" if isinstance(part, tuple) else "[") + ",".join(encode(p) for p in part) + ")"
    if isinstance(part, (set, frozenset)):
        return "{" + ",".join(sorted(encode(p) for p in part)) + "}"
    if isinstance(part, dict):
        return "{" + ",".join(sorted(f"{encode(k)}:{encode(v)}" for k, v in part.items())) + "}"
    if isinstance(part, types.FunctionType):
        source = _case_source(part)
        if source is not None:
            return "source:" + hashlib.sha256(source.encode("utf-8")).hexdigest()
        return _module_function(part)
    if isinstance(part, np.ndarray):
        return f"array({part.dtype.str},{part.shape},{hashlib.sha256(part.tobytes()).hexdigest()})"
    if isinstance(part, (np.dtype, np.generic)):
        return f"{type(part).__name__}({part!r})"
    name = f"{type(part).__module__}.{type(part).__qualname__}"
    if name == "refsim.layouts.mesh.Mesh":
        return _mesh_text(part.axis_names, part.device_ids, part.axis_types)
    if name.startswith("jax") and name.endswith(".Mesh"):
        devices = np.asarray(part.devices)
        return _mesh_text(part.axis_names, np.vectorize(lambda d: d.id, otypes=[np.int64])(devices),
                          getattr(part, "axis_types", None))
    if type(part).__qualname__ == "NamedSharding":
        kind = getattr(part, "memory_kind", None)
        return f"sharding({encode(part.mesh)},{_spec_text(part.spec)},{kind!r})"
    if type(part).__qualname__ == "PyTreeDef":
        return f"tree({part})"
    if type(part).__qualname__ in ("_Unconstrained", "UnconstrainedSingleton", "AxisType") or \
            type(part).__qualname__.startswith("_UNCONSTRAINED"):
        return f"{type(part).__qualname__}({part})"
    if type(part).__qualname__ in ("CpuDevice", "Device") or hasattr(part, "device_kind"):
        return f"device({part.platform},{part.id})"
    raise Unstable(f"{name} has no stable text")


_SKIP_CONFIG = ("cache", "compil", "log", "explain", "debug", "traceback", "profile", "dump")


def environment() -> str:
    """What else decides an executable: JAX and jaxlib versions, the platform, its device kinds
    and count, ``XLA_FLAGS`` and every JAX config value in force now (the partitioner, x64, ...),
    except the caches' and logging's own."""
    import jax
    import jaxlib

    devs = jax.devices()
    config = []
    for name in sorted(jax.config.values):
        if any(s in name for s in _SKIP_CONFIG):
            continue
        try:
            config.append(f"{name}={getattr(jax.config, name)!r}")
        except Exception:  # noqa: BLE001 - a flag without a reader
            config.append(f"{name}={jax.config.values[name]!r}")
    return "|".join([jax.__version__, getattr(jaxlib, "__version__", "?"), devs[0].platform,
                     ",".join(sorted({d.device_kind for d in devs})), str(len(devs)),
                     os.environ.get("XLA_FLAGS", ""), *config])


# What the store's names are made of; a new format names every entry anew, so no entry a store wrote under
# an older, ambiguous text is read again (format 1 wrote a mesh without its axis sizes, and a spec without
# its unreduced / reduced axes: a 3x1 mesh loaded a 1x3 mesh's executable).
KEY_FORMAT = "executable-key-2"


def stable_key(key) -> str | None:
    """The store's name for an `xla_backend.cache` key (a sha256 of its parts and `environment`),
    None when a part is `Unstable`."""
    import hashlib

    try:
        text = encode(key)
    except Unstable:
        return None
    return hashlib.sha256((f"{KEY_FORMAT}\n" + environment() + "\n" + text).encode("utf-8")).hexdigest()


class ExecutableStore:
    """Compiled executables on disk (`jax.experimental.serialize_executable`), keyed before tracing
    by `stable_key`: a rerun in a fresh process loads a case's executable without tracing,
    lowering or compiling it. Installed by `enable` as `xla_backend.cache`'s store. Nothing is
    read or written while JAX's compilation cache is off (an injected fault turns it off)."""

    def __init__(self, folder: str):
        self.folder = folder
        self._last: tuple = (None, None)   # (key, path) of the last load: its save follows at once

    def _path(self, key, *, again: bool = False) -> str | None:
        import jax

        if not jax.config.jax_enable_compilation_cache:
            return None
        if again and self._last[0] is key:
            return self._last[1]
        name = stable_key(key)
        path = None if name is None else os.path.join(self.folder, name[:2], name + ".exe")
        self._last = (key, path)
        return path

    def load(self, key):
        import pickle

        import jax

        path = self._path(key)
        if path is None or not os.path.exists(path):
            return None
        try:
            from jax.experimental import serialize_executable

            with open(path, "rb") as fh:
                ids, (payload, in_tree, out_tree) = pickle.load(fh)
            by_id = {d.id: d for d in jax.devices()}
            return serialize_executable.deserialize_and_load(payload, in_tree, out_tree,
                                                             execution_devices=[by_id[i] for i in ids])
        except Exception:  # noqa: BLE001 - a torn or foreign entry is a miss
            return None

    def compile(self, key, compile_fn):
        """`compile_fn()`, kept under `key`'s stable name. A stable key's program is compiled by XLA
        here, not read from JAX's persistent cache: an executable JAX loaded from its cache does not
        serialize whole again (jaxlib's CPU client drops its kernels: "Function ... not found")."""
        import jax

        if self._path(key, again=True) is None:
            return compile_fn()
        jax.config.update("jax_enable_compilation_cache", False)
        try:
            executable = compile_fn()
        finally:
            jax.config.update("jax_enable_compilation_cache", True)
        self.save(key, executable)
        return executable

    def save(self, key, executable) -> None:
        import pickle
        import tempfile

        path = self._path(key, again=True)
        if path is None:
            return
        try:
            from jax.experimental import serialize_executable

            # the devices it runs on, in the order of its device assignment (a mesh may use some of them)
            ids = [d.id for d in executable._executable.xla_executable.local_devices()]
            blob = pickle.dumps((ids, serialize_executable.serialize(executable)))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
            os.replace(tmp, path)   # whole or absent: a reader never sees half an entry
        except Exception:  # noqa: BLE001 - an executable that cannot be serialized is just not kept
            pass
