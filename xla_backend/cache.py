"""Compiled-executable cache and compile/run time counters.

Keys are (entry point, function, mesh or devices, specs/shardings, input avals and
shardings), so cases that differ only in data reuse one executable, as the
conformance suite relies on.

Across processes, JAX's persistent compilation cache (keyed by the lowered module) may hand back an
executable instead of compiling it; a check installed with `set_hit_check`
(`conformance.engine.compile_cache.HitVerifier`) sees each such executable with the `scope` it was
compiled in and may replace it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import OrderedDict

MAX_ENTRIES = 1024


@dataclasses.dataclass
class Stats:
    """Counters since the last `reset_stats`: compiles, cache hits, runs and their seconds."""

    compiles: int = 0
    cache_hits: int = 0
    runs: int = 0
    compile_seconds: float = 0.0
    run_seconds: float = 0.0
    persistent_hits: int = 0   # compiles JAX answered from its persistent cache


_STATS = Stats()
_CACHE: "OrderedDict[object, object]" = OrderedDict()
_HIT_CHECK: list = [None]   # check(scope, executable, compile_fn) -> executable, for persistent-cache hits
_SCOPE: list = ["default"]
_PERSISTENT_HITS = [0]       # JAX's "/jax/compilation_cache/cache_hits" events in this process
_LISTENING = [False]


def set_hit_check(check) -> None:
    """Call ``check(scope, executable, recompile_fn)`` on every executable JAX's persistent cache hands
    back (None: no check); the executable it returns is used. `recompile_fn()` lowers and compiles
    the program anew, past every in-memory cache."""
    _HIT_CHECK[0] = check
    if check is not None and not _LISTENING[0]:
        import jax

        def listen(event, **_):
            if event == "/jax/compilation_cache/cache_hits":
                _PERSISTENT_HITS[0] += 1

        jax.monitoring.register_event_listener(listen)
        _LISTENING[0] = True


@contextlib.contextmanager
def scope(name: str):
    """Name what is compiled inside (a case family), for the hit check."""
    before = _SCOPE[0]
    _SCOPE[0] = name
    try:
        yield
    finally:
        _SCOPE[0] = before


def compiled(key, compile_fn, recompile_fn=None):
    """(executable, hit): the cached executable for `key`, compiling with `compile_fn` on a miss.
    `recompile_fn` (default `compile_fn`) lowers and compiles anew for the hit check."""
    try:
        exe = _CACHE[key]
    except KeyError:
        t0 = time.perf_counter()
        hits = _PERSISTENT_HITS[0]
        exe = compile_fn()
        if _PERSISTENT_HITS[0] != hits:
            _STATS.persistent_hits += 1
            if _HIT_CHECK[0] is not None:
                exe = _HIT_CHECK[0](_SCOPE[0], exe, recompile_fn or compile_fn)
        _STATS.compile_seconds += time.perf_counter() - t0
        _STATS.compiles += 1
        _CACHE[key] = exe
        if len(_CACHE) > MAX_ENTRIES:
            _CACHE.popitem(last=False)
        return exe, False
    _CACHE.move_to_end(key)
    _STATS.cache_hits += 1
    return exe, True


def timed_run(fn, *args):
    """Run `fn(*args)`, wait for the devices, and add the wall time to the run counter."""
    import jax

    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    _STATS.run_seconds += time.perf_counter() - t0
    _STATS.runs += 1
    return out


def stats() -> dict:
    """A snapshot of the counters plus the number of cached executables."""
    return {**dataclasses.asdict(_STATS), "cached_executables": len(_CACHE)}


def reset_stats() -> None:
    global _STATS
    _STATS = Stats()


def clear_cache() -> None:
    _CACHE.clear()
