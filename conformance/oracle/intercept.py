"""Oracle mode's hook: `jax.jit`, `jax.shard_map` and `jax.pmap` return checked callables.

While `install(session)` is active, the three entry points and JAX's older public ones
(`jax.experimental.shard_map.shard_map`, `jax.experimental.pjit.pjit`: `WRAPPED` lists them
all) build the callable JAX would build and wrap it in `Checked`; the older ones are checked
as the `jax.shard_map` / `jax.jit` programs they build (the same jaxpr). A call of a `Checked` with concrete arguments outside any
JAX trace (a top-level call) runs on XLA as usual and, when its program is distributed (a
shard_map, a collective, or sharded inputs/outputs), is also evaluated on refsim by the
session; its return value is XLA's, untouched. Calls under an outer trace (a jitted function
called inside another jit, the refsim/XLA machinery's own tracing) go straight to JAX.

Only callables built after `install` are wrapped, and only through the module attributes it
replaces: functions decorated in modules imported before it (JAX's own `jax.numpy`, a library
imported earlier) and names bound before it (`from jax import jit`) are not intercepted, which
is why the pytest plugin installs the hook before test modules and conftests are imported.
"""
from __future__ import annotations

import functools
import inspect
import operator
import threading

from refsim import compat as _compat

_STATE = threading.local()
#: (module, attribute) -> (JAX's own value, whether it was a plain module attribute)
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

    if not _compat.no_trace_active():
        return False
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs)))


class Checked:
    """A JAX callable (`inner`) whose top-level calls the oracle session also checks.

    Attribute access (``.lower``, ``.trace``, ``.eval_shape``, ...) goes to `inner`, so the
    object stands in for what `jax.jit` / `jax.shard_map` / `jax.pmap` returned.
    """

    def __init__(self, inner, entry: str, session, static=((), ()), via: str | None = None):
        functools.update_wrapper(self, inner)
        self._inner, self._entry, self._session, self._static = inner, entry, session, static
        self._via = via or f"jax.{entry}"           # the entry point the user called

    def __call__(self, *args, **kwargs):
        s = self._session
        if s is None or not s.active or busy() or not top_level(args, kwargs):
            return self._inner(*args, **kwargs)
        with _Busy():
            return s.call(self._inner, self._entry, args, kwargs, static=self._static, via=self._via)

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


def _signature(fn):
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _static_of(sig, args, kwargs):
    """jit's (static_argnums, static_argnames) as given to a function of signature `sig`
    (pjit takes them positionally too); None where not given. `0` is a given argnum."""
    try:
        bound = sig.bind_partial(*args, **kwargs).arguments
    except (AttributeError, TypeError):              # no signature, or bad arguments JAX itself reports
        bound = kwargs
    return bound.get("static_argnums"), bound.get("static_argnames")


def _index_tuple(x) -> tuple:
    try:
        return (operator.index(x),)
    except TypeError:
        return tuple(map(operator.index, x))


def _str_tuple(x) -> tuple:
    return (x,) if isinstance(x, str) else tuple(x)


def infer_static(fun, argnums, argnames) -> tuple[tuple, tuple]:
    """(static_argnums, static_argnames) of ``jax.jit(fun, static_argnums=, static_argnames=)``
    completed as JAX completes them (jax._src.api_util.infer_argnums_and_argnames): given only
    numbers, the names of those positional-or-keyword parameters are static too, and given only
    names, their positions; given both, each is used as given. So a static argument passed by
    keyword, or a static_argnames argument passed by position, is static as it is for JAX."""
    if argnums is None and argnames is None:
        return (), ()
    nums = () if argnums is None else _index_tuple(argnums)
    names = () if argnames is None else _str_tuple(argnames)
    if argnums is not None and argnames is not None:
        return nums, names
    sig = _signature(fun)
    if sig is None:                                  # e.g. a builtin: JAX infers nothing either
        return nums, names
    params = [(k, p) for k, p in sig.parameters.items()]
    pos_or_kw = inspect.Parameter.POSITIONAL_OR_KEYWORD
    if argnums is None:
        nums = tuple(i for i, (k, p) in enumerate(params) if p.kind == pos_or_kw and k in names)
    else:
        names = tuple(k for i, (k, p) in enumerate(params) if p.kind == pos_or_kw and i in nums)
    return nums, names


def _wrapping(entry: str, original, session, via: str | None = None):
    """`original` (jax.jit / jax.shard_map / jax.pmap, or an older entry point building the
    same `entry` kind of program), its result wrapped in `Checked`; also in its decorator form
    (called without the function). The arguments reach `original` unchanged (`check_rep`,
    `auto`, pjit's positional shardings are JAX's to interpret)."""

    sig = _signature(original) if entry == "jit" else None

    @functools.wraps(original)
    def build(*args, **kwargs):
        out = original(*args, **kwargs)
        if busy():
            return out
        fun = args[0] if args and callable(args[0]) else kwargs.get("fun", kwargs.get("f"))
        # jit's static arguments are closed over, not traced, when the oracle traces a call
        given = _static_of(sig, args, kwargs) if entry == "jit" else (None, None)
        if fun is not None:
            return Checked(out, entry, session, infer_static(fun, *given), via)

        @functools.wraps(out)
        def decorate(fun):
            return Checked(out(fun), entry, session, infer_static(fun, *given), via)
        return decorate

    build._conformance_original = original
    return build


ENTRY_POINTS = ("jit", "shard_map", "pmap")


def _targets() -> list:
    """[(module, attribute, kind, current value)]: jax.jit / jax.shard_map / jax.pmap, then the
    older entry points this JAX has (refsim.compat.LEGACY_ENTRY_POINTS)."""
    import jax

    return [(jax, name, name, getattr(jax, name)) for name in ENTRY_POINTS] + _compat.legacy_entry_points()


#: Every entry point oracle mode wraps, as users spell them (the summary names them).
WRAPPED = tuple(f"jax.{n}" for n in ENTRY_POINTS) + tuple(f"{m}.{a}" for m, a, _ in _compat.LEGACY_ENTRY_POINTS)


def install(session) -> None:
    """Wrap every entry point of `WRAPPED` that this JAX has for `session` (idempotent).

    Each is replaced by a plain module attribute, so `from jax.experimental.shard_map import
    shard_map` run after this gets the wrapped one."""
    for mod, name, kind, current in _targets():
        original = getattr(current, "_conformance_original", current)
        key = (mod.__name__, name)
        if key not in _ORIGINALS:
            plain = name in vars(mod) and vars(mod)[name] is original
            _ORIGINALS[key] = (mod, original, plain)
        via = f"{mod.__name__}.{name}"
        setattr(mod, name, _wrapping(kind, original, session, via))


def uninstall() -> None:
    """Put JAX's own entry points back (a deprecated attribute goes back to its module's
    `__getattr__`, which serves it as before)."""
    for (_, name), (mod, original, plain) in _ORIGINALS.items():
        if plain:
            setattr(mod, name, original)
        else:
            vars(mod).pop(name, None)
    _ORIGINALS.clear()
