"""Oracle mode's hook: every distributed program XLA runs through JAX's jit machinery is seen
where it executes, with the jaxpr JAX traced for it.

`install(session)` replaces no function a user holds (`jax.jit`, `jax.shard_map`, `jax.pmap`
and every jit object keep their identity, type, `.lower`, `.trace`, `.eval_shape` and caches).
It hooks the Python side of JAX's jit dispatch (`refsim.compat.JIT_EXECUTION_HOOKS`):

* each execution of a compiled jit program that spans several devices (or contains a
  collective) is handed to the session with the jaxpr, shardings and arguments JAX is running
  it with: before XLA runs (host copies of the inputs, which XLA may donate) and after (refsim
  evaluates the same jaxpr and the outputs are compared). That covers whatever built the jit:
  `jax.jit` and `pjit` under any import name, `jax.pmap` and eager `shard_map` (both run as
  jits in JAX >= 0.10), JAX's private entry points, test utilities, grad/vjp/jvp/vmap of a jit
  applied outside jit (`jit_p`'s impl), and eager operations on sharded arrays (each a one-op
  jit, `dispatch.apply_primitive`);
* C++'s fast path would run later calls of a compiled program without Python, so for programs
  on several devices the hook declines it (`_get_fastpath_data` returns None) and every call
  comes back through Python. Calls that JAX would have served from its fast path emit none of
  JAX's test events ("jit_cpp_cache_miss", "_array_shard_arg", ...): an execution's events are
  passed on only for a (program, argument signature) pair whose fast path was not declined;
* the oracle itself traces nothing (no extra trace, lowering or compile), and whatever refsim's
  own evaluation does in JAX runs with JAX's test events, compile logs and cache-miss
  explanations off for this thread, so JAX's counters and logs see only the user's work;
* under `jax.disable_jit()` no jit runs and nothing is checked twice: a program's Python runs
  exactly as often as without the oracle (eager operations on sharded arrays are still seen);
* `jax.device_put` onto or off several devices (`dispatch._batched_device_put_impl`) is a
  reshard: each device must hold its block of the value (exact); a runtime token an ordered
  effect's dispatch moves is passed through (no data);
* placements that assemble one multi-device jax.Array without device_put's dispatch
  (`make_array_from_callback`, `make_array_from_single_device_arrays`, `device_put_sharded`,
  `device_put_replicated`: `refsim.compat.placement_hooks`) are checked the same way;
* a program returning typed PRNG keys keeps C++'s fast path after its first call (JAX's Python
  path would lay the key words out differently, `KEY_FAST_PATH`), counted once per program;
* ahead-of-time compiled calls (`jit(f).lower(...).compile()(...)`) run their executable
  directly, past jit dispatch: `Traced.lower` and `Lowered.compile` carry the jit equation's
  parameters to the `Compiled`, whose every call is checked like a jit execution (path
  "ahead-of-time call"). One compiled before `install`, or of a program with high-level types,
  is counted as "not intercepted".
"""
from __future__ import annotations

import collections
import contextlib
import threading

from refsim import compat as _compat

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.

_STATE = threading.local()
#: what `install` replaced: [(object, attribute, original value)]
_PATCHES: list = []
_SESSION: list = [None]
#: (id(executable), argument signature) of the calls whose C++ fast path the hook declined, with
#: the executable kept alive so its id is not reused; bounded like JAX's own dispatch cache.
_DECLINED: "collections.OrderedDict" = collections.OrderedDict()
_DECLINED_MAX = 8192


#: The census reason for a program returning typed PRNG keys whose later calls stay on C++'s path.
KEY_FAST_PATH = "later calls of a program returning PRNG keys (C++ fast path; counted once per program)"


def unwrapped(fn, depth: int = 10):
    """`fn` with up to `depth` layers of ``__wrapped__`` (functools.wraps, jax.jit) taken off."""
    for _ in range(depth):
        nxt = getattr(fn, "__wrapped__", None)
        if nxt is None:
            break
        fn = nxt
    return fn


def busy() -> bool:
    """True while this thread is inside the oracle's own work (nothing it runs is checked)."""
    return getattr(_STATE, "busy", False)


@contextlib.contextmanager
def own_work():
    """The oracle's own work on this thread: not checked, no JAX test events, no compile logs."""
    prev_busy, prev_mode = busy(), getattr(_STATE, "events", None)
    _STATE.busy, _STATE.events = True, "drop"
    _listen()
    try:
        with _compat.quiet_jax_config():
            yield
    finally:
        _STATE.busy, _STATE.events = prev_busy, prev_mode


@contextlib.contextmanager
def unchecked():
    """Executions on this thread are not checked (`conformance.check` runs its own comparison)."""
    prev = busy()
    _STATE.busy = True
    try:
        yield
    finally:
        _STATE.busy = prev


# -- JAX's test events --------------------------------------------------------------------------------
class _Listener:
    """Stands in for `util.test_event_listener`: forwards every event, except on a thread that is
    doing the oracle's own work (dropped) or running an execution whose events wait to be told
    whether JAX would have emitted them (held)."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, name, *args):
        mode = getattr(_STATE, "events", None)
        if mode == "drop":
            return None
        if mode == "hold":
            _STATE.held.append((name, args))
            return None
        return self.inner(name, *args)


def _listen() -> bool:
    """Put `_Listener` in front of JAX's test-event listener (set by jax._src.test_util when it is
    imported, possibly after `install`); False when nobody listens."""
    util = _compat.test_event_module()
    cur = util.test_event_listener
    if cur is None:
        return False
    if not isinstance(cur, _Listener):
        util.test_event_listener = _Listener(cur)
    return True


def _signature(args) -> tuple:
    """What C++'s jit dispatch keys a call on, per argument: type, shape, dtype, weak type,
    sharding and commitment (static arguments are part of the program)."""
    sig = []
    for a in args:
        aval = getattr(a, "aval", None)
        sig.append((type(a), getattr(a, "shape", None), str(getattr(a, "dtype", "")),
                    getattr(aval, "weak_type", None), getattr(a, "sharding", None), getattr(a, "_committed", None)))
    return tuple(sig)


def _key(executable, args):
    try:
        return id(executable), hash(_signature(args))
    except TypeError:                                    # an unhashable sharding: never declined
        return None


# -- the hooks ------------------------------------------------------------------------------------
def _push(ctx):
    stack = getattr(_STATE, "calls", None)
    if stack is None:
        stack = _STATE.calls = []
    stack.append(ctx)


def _pop():
    _STATE.calls.pop()


def _top() -> dict:
    stack = getattr(_STATE, "calls", None)
    return stack[-1] if stack else {"via": "jit equation"}


def _via(fun) -> str:
    """How a jit object's program came to run: an eager operation (`apply_primitive`), one
    operation of an eager shard_map body, pmap, or a jit the user's code (or a library's) called."""
    if getattr(fun, "_apply_primitive", False):
        return "eager op"
    inner = getattr(fun, "func", None) or getattr(fun, "f", None)
    mod = getattr(inner, "__module__", "") or ""
    if mod.endswith("shard_map"):
        return "eager shard_map"
    if (getattr(unwrapped(fun), "__module__", "") or "").endswith("_src.pmap"):
        return "pmap"
    return "jit call"


def _hook_user_call(original):
    def _run_python_pjit(p, args_flat, fun, args, kwargs):
        if _SESSION[0] is None or busy():
            return original(p, args_flat, fun, args, kwargs)
        _push({"via": _via(fun), "fun": fun, "args": args, "kwargs": kwargs, "out_tree": p.out_tree,
               "jaxpr": p.params.get("jaxpr")})
        try:
            return original(p, args_flat, fun, args, kwargs)
        finally:
            _pop()
    return _run_python_pjit


def _hook_impl(original):
    def _pjit_call_impl(*args, **params):
        if _SESSION[0] is None or busy():
            return original(*args, **params)
        top = _top()
        if top.get("jaxpr") is not None and top["jaxpr"] is params.get("jaxpr"):
            # the jit object's own program, bound as an equation (inside an eager shard_map body
            # the axis environment is not empty, so JAX binds rather than calls it)
            return original(*args, **params)
        _push({"via": "transformation outside jit"})
        try:
            return original(*args, **params)
        finally:
            _pop()
    return _pjit_call_impl


def _hook_fastpath(original):
    def _get_fastpath_data(executable, out_tree, args_flat, *rest, **kw):
        data = original(executable, out_tree, args_flat, *rest, **kw)
        s = _SESSION[0]
        if data is None or s is None or not s.active or busy():
            return data
        if _compat.executable_device_count(executable) <= 1:
            return data
        if any(_compat.prng_impl_of(getattr(o, "dtype", None)) is not None for o in rest[0] if rest):
            # JAX's Python path lays a returned key array's words out with a trailing None in
            # their spec where its C++ path does not (jax 0.10 ... 0.12), which a test can see:
            # later calls of such a program keep the fast path (counted, per program)
            s.not_intercepted(KEY_FAST_PATH)
            return data
        key = _key(executable, args_flat)
        if key is None:
            return data
        _DECLINED[key] = executable
        _DECLINED.move_to_end(key)
        while len(_DECLINED) > _DECLINED_MAX:
            _DECLINED.popitem(last=False)
        return None                  # later calls come back through Python, where they are checked
    return _get_fastpath_data


def _hook_execute(original):
    def _pjit_call_impl_python(*args, **params):
        s = _SESSION[0]
        if s is None or not s.active or busy():
            return original(*args, **params)
        ctx = _top()
        with own_work():
            pending = s.before(args, params, ctx)
        listening = _listen()
        prev_mode, prev_held = getattr(_STATE, "events", None), getattr(_STATE, "held", None)
        _STATE.events, _STATE.held = ("hold" if listening else prev_mode), []
        held = _STATE.held
        try:
            result = original(*args, **params)
        except BaseException:
            _STATE.events, _STATE.held = prev_mode, prev_held
            _replay(held)                          # it raised: JAX ran it through Python anyway
            if pending is not None:
                s.abandon(pending)
            raise
        _STATE.events, _STATE.held = prev_mode, prev_held
        # JAX's C++ fast path would have run a call whose fast path the hook declined: no cache
        # miss, no Python-side argument handling, so none of its events
        if held and _key(result[1], args) not in _DECLINED:
            _replay(held)
        if pending is not None:
            with own_work():
                s.after(pending, result[0])
        return result
    return _pjit_call_impl_python


def _hook_device_put(original):
    def _batched_device_put_impl(*xs, devices, srcs, copy_semantics, dst_avals):
        s = _SESSION[0]
        if s is None or not s.active or busy():
            return original(*xs, devices=devices, srcs=srcs, copy_semantics=copy_semantics, dst_avals=dst_avals)
        with own_work():
            pending = s.before_device_put(xs, devices)
        prev, _STATE.putting = getattr(_STATE, "putting", False), True
        try:
            ys = original(*xs, devices=devices, srcs=srcs, copy_semantics=copy_semantics, dst_avals=dst_avals)
        except BaseException:
            if pending is not None:
                s.abandon_put(pending)        # the program's own error (a deleted array): it reaches the user
            raise
        finally:
            _STATE.putting = prev
        if pending is not None:
            with own_work():
                s.after_device_put(pending, ys)
        return ys
    return _batched_device_put_impl


def _placing(s) -> str | None:
    """The placement API (`refsim.compat.PLACEMENT_CALLERS`) whose JAX code called the running
    hook, when the session checks it; else None."""
    if s is None or not s.active or busy() or getattr(_STATE, "putting", False):
        return None        # (a placement inside a device_put is that put's own work, checked with it)
    api = _compat.placement_caller()
    if api == _compat.RUNTIME_TOKEN_PLACEMENT:      # JAX's ordered-effect tokens: no data
        s.passed[s.RUNTIME_TOKEN] += 1
        return None
    return api


def _checked_placement(s, api, sharding, values, devices, aval, place, held):
    """`place()` checked as placement `api`: the census entry is opened before it, dropped if it
    raises (the program's own error reaches the user) and closed on `held(result)` (what each
    device holds) after it; returns place()'s result."""
    with own_work():
        pending = s.before_placement(api, sharding, values, devices)
    try:
        result = place()
    except BaseException:
        if pending is not None:
            s.abandon_put(pending)
        raise
    if pending is not None:
        with own_work():
            s.after_placement(pending, aval.shape, aval.dtype, held(result))
    return result


def _hook_batched_device_put(original):
    def batched_device_put(aval, sharding, xs, devices, *rest, **kw):
        s = _SESSION[0]
        api = _placing(s)
        if api is None or api == "make_array_from_single_device_arrays":
            return original(aval, sharding, xs, devices, *rest, **kw)
        return _checked_placement(s, api, sharding, xs, devices, aval,
                                  lambda: original(aval, sharding, xs, devices, *rest, **kw), lambda y: y)
    return batched_device_put


def _hook_rearrange(original):
    """`ArrayImpl._check_and_rearrange(arrays, sharding, aval)` (after `self` in jax 0.10): the
    single-device arrays of `make_array_from_single_device_arrays` put in the order of the
    sharding's device assignment, which the new jax.Array holds."""
    def _check_and_rearrange(*args):
        s = _SESSION[0]
        api = _placing(s)
        if api is None:
            return original(*args)
        arrays, sharding, aval = args[-3:]
        return _checked_placement(
            s, api, sharding, arrays, [_device_of(a) for a in arrays], aval, lambda: original(*args),
            lambda ordered: [(int(d.id), b) for d, b in zip(_compat.sharding_device_order(sharding), ordered)])
    return _check_and_rearrange


def _device_of(a):
    return next(iter(a.devices()))


def _replay(held) -> None:
    util = _compat.test_event_module()
    for name, ev_args in held:
        util.test_event(name, *ev_args)


#: the attribute of a `Lowered` / `Compiled` holding the jit equation's parameters (`_hook_lower`)
_AOT_PARAMS = "_conformance_jit_params"


def _hook_lower(original):
    def lower(self, *args, **kwargs):
        lowered = original(self, *args, **kwargs)
        if _SESSION[0] is not None:
            try:
                params = _compat.aot_jit_params(self)
                if params is not None:
                    setattr(lowered, _AOT_PARAMS, params)
            except Exception:  # noqa: BLE001 - a program the hook cannot read is counted at its call
                pass
        return lowered
    return lower


def _hook_compile(original):
    def compile(self, *args, **kwargs):
        compiled = original(self, *args, **kwargs)
        params = getattr(self, _AOT_PARAMS, None)
        if params is not None:
            setattr(compiled, _AOT_PARAMS, params)
        return compiled
    return compile


def _aot_flat_args(compiled, params, args, kwargs):
    """The flat arguments a compiled call hands its executable, or None (not checkable by the hook:
    no parameters recorded, high-level types, or a call whose pytree JAX will reject)."""
    import jax

    if params is None or not _compat.aot_call_is_plain(compiled):
        return None
    flat, tree = jax.tree_util.tree_flatten((args, kwargs))
    return flat if tree == compiled._params.in_tree and len(flat) == len(params["jaxpr"].in_avals) else None


def _hook_aot(original):
    def __call__(self, *args, **kwargs):
        s = _SESSION[0]
        if s is None or not s.active or busy():
            return original(self, *args, **kwargs)
        pending, flat = None, None
        try:
            flat = _aot_flat_args(self, getattr(self, _AOT_PARAMS, None), args, kwargs)
            if flat is None and _compat.aot_compiled_device_count(self) > 1:
                s.not_intercepted("ahead-of-time compiled call")
        except Exception:  # noqa: BLE001 - counting must never break the call
            flat = None
        if flat is not None:
            with own_work():
                pending = s.before(flat, getattr(self, _AOT_PARAMS),
                                   {"via": "ahead-of-time call", "out_tree": self.out_tree})
        try:
            outs = original(self, *args, **kwargs)
        except BaseException:
            if pending is not None:
                s.abandon(pending)
            raise
        if pending is not None:
            import jax

            with own_work():
                s.after(pending, jax.tree_util.tree_leaves(outs))
        return outs
    return __call__


def _patch(obj, name, make):
    original = getattr(obj, name)
    _PATCHES.append((obj, name, original))
    setattr(obj, name, make(original))


def _import_check_machinery() -> None:
    """Import now what a check will use: some JAX modules (jax.extend pulls in pallas) register
    config options that are part of JAX's tracing-cache key, and importing them at the first
    check would make every jit traced before it trace again on its next call."""
    import jax.extend  # noqa: F401

    import refsim.interpreter  # noqa: F401
    from conformance.verdict import compare  # noqa: F401
    from xla_backend import convert  # noqa: F401
    # conformance.oracle.check is loaded already: a session (conformance.oracle.session) imports it


def install(session) -> None:
    """Start checking executions for `session` (idempotent: a second call switches the session).

    C++'s dispatch entries made before are dropped, so programs compiled earlier are seen too."""
    _SESSION[0] = session
    if _PATCHES:
        return
    _import_check_machinery()
    pjit = _compat.pjit_module()
    _patch(pjit, "_pjit_call_impl_python", _hook_execute)
    _patch(pjit, "_get_fastpath_data", _hook_fastpath)
    _patch(pjit, "_run_python_pjit", _hook_user_call)
    _patch(_compat.jit_primitive(), "impl", _hook_impl)
    _patch(_compat.aot_traced_class(), "lower", _hook_lower)
    _patch(_compat.aot_lowered_class(), "compile", _hook_compile)
    _patch(_compat.aot_compiled_class(), "__call__", _hook_aot)
    _patch(_compat.dispatch_module(), "_batched_device_put_impl", _hook_device_put)
    (mod, name), (cls, method, static) = _compat.placement_hooks()
    _patch(mod, name, _hook_batched_device_put)
    descriptor = cls.__dict__[method]           # a staticmethod in jax 0.12: restored as it was
    _PATCHES.append((cls, method, descriptor))
    hook = _hook_rearrange(descriptor.__func__ if static else descriptor)
    setattr(cls, method, staticmethod(hook) if static else hook)
    _compat.clear_jit_dispatch_caches()


def uninstall() -> None:
    """Put JAX's own functions back; calls compiled with the hook come back to C++'s fast path
    after their next dispatch-cache miss (the entries are dropped here)."""
    _SESSION[0] = None
    while _PATCHES:
        obj, name, original = _PATCHES.pop()
        setattr(obj, name, original)
    _DECLINED.clear()
    util = _compat.test_event_module()
    if isinstance(util.test_event_listener, _Listener):
        util.test_event_listener = util.test_event_listener.inner
    _compat.clear_jit_dispatch_caches()


def module_level_jit(fun):
    """The jit object bound to a module-level name whose function is `fun` (``step =
    jax.jit(_step)``, ``step = jax.jit(jax.shard_map(_step, ...))`` or a decorated ``@jax.jit def
    step``), looked up in the module of `fun` and of what it wraps; else None. A reproducer
    imports it and calls it as the user did."""
    chain, obj = [fun], fun
    for _ in range(10):
        obj = getattr(obj, "__wrapped__", None)
        if obj is None:
            break
        chain.append(obj)
    for c in reversed(chain):                    # innermost first: the user's own module
        g = getattr(c, "__globals__", None) or {}
        found = next((v for k, v in g.items() if not k.startswith("__") and getattr(v, "_fun", None) is fun), None)
        if found is not None:
            return found
    return None
