"""One trace, many meshes: traced programs cached by abstract mesh and argument types.

refsim traces a program against an AbstractMesh (axis names, sizes, types; no device
ids), so the jaxpr it gets depends only on the function, that abstract mesh, the specs /
shardings' specs and memory kinds, the argument types and the JAX configuration. This
module keys the trace on exactly those, so the same program run on any concrete mesh
with the same axis names and sizes (any device order, any device ids) is traced once
and only interpreted again — as JAX's own tracing and lowering caches are keyed on the
abstract mesh and reused across meshes of one shape. Device ids enter only afterwards,
when results are laid out.
"""
from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any, Callable, Hashable

_MAXSIZE = 1024
_MISSING = object()


class TraceCache:
    """A bounded LRU map from a program key to its traced `(closed_jaxpr, out_shape)`."""

    def __init__(self, maxsize: int = _MAXSIZE):
        if maxsize < 1:
            raise ValueError(f"maxsize={maxsize}: the cache must hold at least one trace.")
        self.maxsize = maxsize
        self._store: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.uncacheable = 0

    def get(self, key: Hashable | None, build: Callable[[], Any]) -> Any:
        """The cached value for `key`, else `build()` stored under it (`key=None`: never cached)."""
        if key is None:
            self.uncacheable += 1
            return build()
        with self._lock:
            value = self._store.get(key, _MISSING)
            if value is not _MISSING:
                self._store.move_to_end(key)
                self.hits += 1
                return value
        value = build()  # outside the lock: tracing may re-enter refsim
        with self._lock:
            self.misses += 1
            self._store[key] = value
            while len(self._store) > self.maxsize:
                self._store.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._store.clear()
            self.hits = self.misses = self.uncacheable = 0

    def info(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "uncacheable": self.uncacheable,
                "size": len(self._store), "maxsize": self.maxsize}


CACHE = TraceCache()
_enabled = [True]
_MEMOS: list = []  # the bounded per-call memos below, emptied by `clear()` with the traces


def memo(maxsize: int = _MAXSIZE) -> TraceCache:
    """A bounded LRU map for work a call derives only from hashable inputs (specs converted to
    JAX, a pmap body, a function's signature): `get(key, build)`, key None never cached. Every
    key must hold all that the built value depends on; `clear()` empties these too."""
    m = TraceCache(maxsize)
    _MEMOS.append(m)
    return m


def lookup(key: Hashable | None, build: Callable[[], Any]) -> Any:
    """Trace through the shared cache (or directly while `disabled()` is active)."""
    if not _enabled[0]:
        return build()
    return CACHE.get(key, build)


def cache_info() -> dict:
    """Hits, misses, uncacheable calls and size of refsim's trace cache."""
    return CACHE.info()


def clear() -> None:
    CACHE.clear()
    for m in _MEMOS:
        m.clear()


@contextlib.contextmanager
def disabled():
    """Trace every call afresh inside this block (the benchmark's baseline)."""
    old, _enabled[0] = _enabled[0], False
    try:
        yield
    finally:
        _enabled[0] = old


def _hashable(x) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def key_or_none(key):
    """`key` when it can be hashed, else None (a memo then builds afresh)."""
    return key if _hashable(key) else None


def avals_key(flat_args) -> tuple:
    """(shape, dtype, weak_type) per flattened argument: what tracing sees of a value."""
    out = []
    for a in flat_args:
        out.append((tuple(a.shape), str(a.dtype), bool(getattr(a, "weak_type", False)),
                    getattr(a, "sharding", None)))
    return tuple(out)


def tree_key(tree, is_leaf=None) -> tuple:
    """A hashable (leaves, treedef) key of a pytree of specs / sharding descriptions."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_leaf)
    return (tuple(leaves), treedef)


def program_key(api: str, f, abstract_mesh, *parts) -> "_Key | None":
    """The cache key of one traced program, or None when some part cannot be hashed.

    Includes the JAX context that changes traces: x64, and the context abstract mesh
    (`jax.sharding.use_abstract_mesh` / `jax.set_mesh`), which programs may read.
    """
    import jax

    key = (api, f, abstract_mesh, parts, bool(jax.config.jax_enable_x64),
           jax.sharding.get_abstract_mesh())
    try:
        return _Key(key)
    except TypeError:
        return None


class _Key:
    """A program key with its hash computed once (a lookup hashes it more than once)."""

    __slots__ = ("key", "_hash")

    def __init__(self, key: tuple):
        self.key = key
        self._hash = hash(key)

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return self is other or (type(other) is _Key and self._hash == other._hash and self.key == other.key)

    def __repr__(self):
        return f"program key {self.key!r}"
