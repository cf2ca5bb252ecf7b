"""Compiled-executable cache and compile/run time counters.

Keys are (entry point, function, mesh or devices, specs/shardings, input avals and
shardings), so cases that differ only in data reuse one executable, as the
conformance suite relies on.

A persistent store (`set_store`; `conformance.engine.compile_cache.ExecutableStore`) may back
the in-memory cache: on a miss it is asked for the executable under a stable key of the same
parts, so a rerun in a fresh process skips tracing, lowering and compiling.
"""
from __future__ import annotations

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
    store_hits: int = 0


_STATS = Stats()
_CACHE: "OrderedDict[object, object]" = OrderedDict()
_STORE: list = [None]  # load(key) -> executable | None; compile(key, compile_fn) -> executable, kept


def set_store(store) -> None:
    """Back the cache with a persistent `store` (None: none): ``store.load(key)`` gives the
    executable for a key of `compiled` or None; on a miss ``store.compile(key, compile_fn)``
    compiles it and keeps it."""
    _STORE[0] = store


def compiled(key, compile_fn):
    """(executable, hit): the cached executable for `key`, compiling with `compile_fn` on a miss."""
    try:
        exe = _CACHE[key]
    except KeyError:
        store = _STORE[0]
        exe = store.load(key) if store is not None else None
        if exe is not None:   # not traced, lowered or compiled in this process
            _STATS.store_hits += 1
            _CACHE[key] = exe
            if len(_CACHE) > MAX_ENTRIES:
                _CACHE.popitem(last=False)
            return exe, True
        t0 = time.perf_counter()
        exe = compile_fn() if store is None else store.compile(key, compile_fn)
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
