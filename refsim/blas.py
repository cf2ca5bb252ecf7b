"""How many threads refsim's BLAS products use: `set_blas_threads(n)`, REFSIM_BLAS_THREADS, or the load.

refsim's results never depend on the thread count (refsim.interpreter.rules._products makes its
products host-independent); only speed and CPU time do. The limit applies around each large
product (threadpoolctl), so the process's other NumPy / SciPy code keeps its own setting.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np

try:
    from threadpoolctl import ThreadpoolController
except ImportError:  # threadpoolctl missing: BLAS keeps its own setting
    ThreadpoolController = None

_BLAS_MIN_WORK = 1 << 18  # M*N*K*batch below which OpenBLAS runs one thread anyway: no limit applied

_blas_threads: int | None = None   # set_blas_threads's value (None: automatic from the load)
_libs = None                        # threadpoolctl's BLAS library controllers, found on first use
_auto: tuple[float, int] = (-1e9, 1)  # (time measured, automatic thread count)


def set_blas_threads(n: int | None) -> None:
    """Run refsim's BLAS products on `n` threads (None: the automatic choice, from the load).

    Results do not depend on it (see the module docstring); only speed and CPU time do. A
    process that runs alongside other workers on the same cores should pass 1: OpenBLAS's
    threads spin while they wait, so on a busy machine two threads can cost 100x the CPU of
    one. The environment variable REFSIM_BLAS_THREADS sets the same at import.
    """
    global _blas_threads
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"set_blas_threads: n={n!r} must be an int >= 1, or None for the automatic "
                             f"choice (one thread per worker when workers run in parallel).")
        n = int(n)
    _blas_threads = n


def blas_threads() -> int:
    """The thread count refsim's next large BLAS product runs on."""
    global _auto
    if _blas_threads is not None:
        return _blas_threads
    now = time.monotonic()
    if now - _auto[0] > 5.0:  # free cores: the CPUs this process may use less the others' load
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
        try:
            busy = os.getloadavg()[0] - 1.0   # this process counts in the load itself
        except OSError:
            busy = 0.0
        _auto = (now, max(1, min(cpus, int(cpus - max(busy, 0.0) + 0.5))))
    return _auto[1]


def _read_env() -> None:
    value = os.environ.get("REFSIM_BLAS_THREADS", "").strip()
    if value:
        try:
            set_blas_threads(int(value))
        except ValueError:
            raise ValueError(f"REFSIM_BLAS_THREADS={value!r} must be an int >= 1 (the number of BLAS "
                             f"threads refsim's products use); unset it for the automatic choice.") from None


_read_env()


def _blas_libs() -> list:
    global _libs
    if _libs is None:
        # made on first use, not at import: it lists the BLAS libraries loaded by then (NumPy's is)
        _libs = [] if ThreadpoolController is None else \
            [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]
    return _libs


def _batch(sa: tuple, sb: tuple) -> int:
    """The number of matrices in the broadcast of batch shapes `sa` and `sb` (np.broadcast_shapes,
    without its cost: the shapes are a matmul's, already compatible)."""
    if not sa and not sb:
        return 1
    if sa == sb:
        return math.prod(sa)
    return math.prod(np.broadcast_shapes(sa, sb))


_held: list = []   # `held()`'s thread count while it holds the library's setting


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b``, on `blas_threads()` threads when the product is large enough for BLAS to use several
    (the library's own setting is restored afterwards, or by `held`)."""
    work = a.shape[-2] * a.shape[-1] * b.shape[-1] * max(1, _batch(a.shape[:-2], b.shape[:-2]))
    if work < _BLAS_MIN_WORK or (_held and _held[-1] == blas_threads()):
        return np.matmul(a, b)
    n = blas_threads()
    changed = []
    for lib in _blas_libs():
        prev = lib.get_num_threads()
        if prev != n:
            lib.set_num_threads(n)
            changed.append((lib, prev))
    try:
        return np.matmul(a, b)
    finally:
        for lib, prev in changed:
            lib.set_num_threads(prev)


class held:
    """``with blas.held():`` sets the BLAS libraries to `blas_threads()` once for many large
    products (`matmul` then leaves the setting alone; the results are the same: each product runs
    on the thread count it would get alone) and restores the libraries' own setting at the end."""

    def __enter__(self):
        n = blas_threads()
        self._changed = []
        for lib in _blas_libs():
            prev = lib.get_num_threads()
            if prev != n:
                lib.set_num_threads(n)
                self._changed.append((lib, prev))
        _held.append(n)
        return self

    def __exit__(self, *exc):
        _held.pop()
        for lib, prev in self._changed:
            lib.set_num_threads(prev)
        return False
