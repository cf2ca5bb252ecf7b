"""JAX's persistent compilation cache for conformance runs: a rerun on the same machine skips XLA compiles.

XLA compilation is most of a conformance run's time. JAX can keep every compiled executable
on disk, keyed by the lowered module (debug info stripped), the compile options, the
device assignment, the XLA flags and the jaxlib version, so a rerun with the same seed
(or any case whose program lowers to the same module) loads the executable instead of
compiling it. `python -m conformance run` turns it on by default in `default_dir()`
(``--compile-cache DIR`` elsewhere, ``--compile-cache off`` or ``CONFORMANCE_COMPILE_CACHE=off``
not at all); `runner.run` leaves JAX's configuration alone unless given ``compile_cache=``.

Injected faults (`conformance.faults`) turn the cache off while they are active, so no
wrong executable is ever written or read.
"""
from __future__ import annotations

import os

ENV = "CONFORMANCE_COMPILE_CACHE"


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
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"compile_cache={path!r} cannot be created ({e}); pass a writable folder, or "
                         "--compile-cache off.") from None
    settings = {"jax_compilation_cache_dir": path, "jax_persistent_cache_min_compile_time_secs": 0.0,
                "jax_persistent_cache_min_entry_size_bytes": -1}
    for name, value in settings.items():
        os.environ[name.upper()] = str(value)  # spawned workers read these when they import jax
    import jax  # not at the top: the CLI imports this module before the platform is configured

    for name, value in settings.items():
        jax.config.update(name, value)
    return path
