"""Oracle mode's hook: `jax.jit`, `jax.shard_map` and `jax.pmap` return checked callables.

While `install(session)` is active, the three entry points build the callable JAX would
build and wrap it in `Checked`. A call of a `Checked` with concrete arguments outside any
JAX trace (a top-level call) runs on XLA as usual and, when its program is distributed (a
shard_map, a collective, or sharded inputs/outputs), is also evaluated on refsim by the
session; its return value is XLA's, untouched. Calls under an outer trace (a jitted function
called inside another jit, the refsim/XLA machinery's own tracing) go straight to JAX.

Only callables built after `install` are wrapped: functions decorated in modules imported
before it (JAX's own `jax.numpy`, a library imported earlier) are not intercepted, which
is why the pytest plugin installs the hook before test modules and conftests are imported.
"""
from __future__ import annotations

import functools
import threading

_STATE = threading.local()
_ORIGINALS: dict = {}


def busy() -> bool:
    """True while this thread is inside a check (its own tracing must not be checked again)."""
    return getattr(_STATE, "busy", False)


class _Busy:
    def __enter__(self):
        self.prev = busy()
        _STATE.busy = True

    def __exit__(self, *exc):
        _STATE.busy = self.prev
        return False


def top_level(args, kwargs) -> bool:
    """True for concrete arguments with no JAX trace active."""
    import jax

    from refsim import _compat

    if not _compat.no_trace_active():
        return False
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs)))


class Checked:
    """A JAX callable (`inner`) whose top-level calls the oracle session also checks.

    Attribute access (``.lower``, ``.trace``, ``.eval_shape``, ...) goes to `inner`, so the
    object stands in for what `jax.jit` / `jax.shard_map` / `jax.pmap` returned.
    """

    def __init__(self, inner, entry: str, session, static=((), ())):
        functools.update_wrapper(self, inner)
        self._inner, self._entry, self._session, self._static = inner, entry, session, static

    def __call__(self, *args, **kwargs):
        s = self._session
        if s is None or not s.active or busy() or not top_level(args, kwargs):
            return self._inner(*args, **kwargs)
        with _Busy():
            return s.call(self._inner, self._entry, args, kwargs, static=self._static)

    def __getattr__(self, name):
        if name == "_inner":                  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __get__(self, obj, objtype=None):
        # As jax.jit objects do: a Checked stored on a class binds like a method.
        return self if obj is None else functools.partial(self, obj)

    def __repr__(self):
        return f"<oracle-checked {self._entry} of {self._inner!r}>"

    def __hash__(self):
        return hash(self._inner)

    def __eq__(self, other):
        return self is other or (isinstance(other, Checked) and other._inner is self._inner)


def _wrapping(entry: str, original, session):
    """`original` (jax.jit / jax.shard_map / jax.pmap), its result wrapped in `Checked`;
    also in its decorator form (called without the function)."""

    @functools.wraps(original)
    def build(*args, **kwargs):
        out = original(*args, **kwargs)
        if busy():
            return out
        has_fun = (bool(args) and callable(args[0])) or any(k in kwargs for k in ("fun", "f"))
        # jit's static arguments are closed over, not traced, when the oracle traces a call
        static = (kwargs.get("static_argnums", ()), kwargs.get("static_argnames", ())) if entry == "jit" else ((), ())
        if has_fun:
            return Checked(out, entry, session, static)

        @functools.wraps(out)
        def decorate(fun):
            return Checked(out(fun), entry, session, static)
        return decorate

    build._conformance_original = original
    return build


ENTRY_POINTS = ("jit", "shard_map", "pmap")


def install(session) -> None:
    """Wrap `jax.jit`, `jax.shard_map` and `jax.pmap` for `session` (idempotent)."""
    import jax

    for name in ENTRY_POINTS:
        current = getattr(jax, name)
        original = getattr(current, "_conformance_original", current)
        _ORIGINALS.setdefault(name, original)
        setattr(jax, name, _wrapping(name, original, session))


def uninstall() -> None:
    """Put JAX's own entry points back."""
    import jax

    for name, original in _ORIGINALS.items():
        setattr(jax, name, original)
    _ORIGINALS.clear()
