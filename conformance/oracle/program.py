"""One call of a user's JAX program, evaluated on XLA (as the user ran it) and on refsim.

`trace` records what refsim needs before the call runs on XLA (the jaxpr, and host copies
of the inputs, taken before XLA may donate them); `refsim_outputs` interprets that jaxpr
with `refsim.evaluate` (the step refsim's own entry points take) and lays each output out
the way the program states it:

* a program whose body is one `shard_map` (`jax.shard_map`, `jax.jit(jax.shard_map(...))`,
  `jax.pmap`, which JAX >= 0.10 builds from shard_map) keeps every device's own block, as
  `refsim.shard_map` does, so replicas that disagree stay visible;
* otherwise the global value is computed and placed by the jit's `out_shardings`, and where
  the program states none, by the sharding XLA chose (the values on each device are still
  checked; the placement itself is then XLA's, which `CheckResult` records per output).
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import numpy as np

import refsim
from refsim import compat
from refsim import array as refsim_array
from refsim.array import Array, Shard
from refsim.errors import UnsupportedPrimitive, UnsupportedUnreducedKind
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec
from xla_backend import convert

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.

#: Primitives whose presence makes a call "distributed" (oracle mode checks those calls).
COLLECTIVES = frozenset({
    "psum", "psum_invariant", "pmax", "pmin", "ppermute", "pbroadcast", "all_gather", "all_gather_invariant",
    "all_to_all", "ragged_all_to_all", "reduce_scatter", "axis_index", "shard_map", "pvary",
})
#: Primitives that call back into Python on the host: refsim cannot replay them faithfully.
CALLBACKS = frozenset({"pure_callback", "io_callback", "debug_callback", "debug_print", "buffer_callback"})


class NotCheckable(Exception):
    """This call cannot be checked; `reason` is a short, countable category."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


@dataclasses.dataclass
class Traced:
    """A call of `fn`: its closed jaxpr, flat host inputs and output tree."""

    fn: Any
    closed: Any
    flat_args: list          # the inputs; after take_host_copies: refsim.Array or ndarray
    out_tree: Any
    primitives: frozenset
    sharded_io: bool
    #: out_shardings of the jit being executed (refsim shardings, None where not stated), when
    #: `closed` is that jit's body (`from_execution`); None when `closed` came from `trace`
    stated_out: list | None = None
    #: per flat input, (shape, dtype, jax sharding or None) as placed when the call was made
    #: (`take_host_copies` records it): what a reproducer exports the program for
    in_avals: list | None = None
    #: per flat input, whether the execution donates it (the jit equation's `donated_invars`);
    #: None when unknown (`trace`): every input is then copied off its devices
    donated: tuple | None = None

    @property
    def distributed(self) -> bool:
        """True when the program has a shard_map or collective, or sharded inputs/outputs."""
        return self.sharded_io or bool(self.primitives & COLLECTIVES)


def _sub_jaxprs(params):
    from jax.extend import core as jcore

    for v in params.values():
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(x, jcore.ClosedJaxpr):
                yield x.jaxpr
            elif isinstance(x, jcore.Jaxpr):
                yield x


def states_multi_device_layout(jaxpr) -> bool:
    """True when a jit (`in_shardings` / `out_shardings`) or a sharding constraint in `jaxpr`
    states a layout over several devices: such a program is distributed even when it is called
    with NumPy arguments."""
    stack = [jaxpr]
    while stack:
        j = stack.pop()
        for eqn in j.eqns:
            p = eqn.params
            stated = [*p.get("in_shardings", ()), *p.get("out_shardings", ())] if eqn.primitive.name in (
                "jit", "pjit") else [p.get("sharding")] if eqn.primitive.name == "sharding_constraint" else []
            if any(_multi_device_sharding(sh) for sh in stated):
                return True
            stack.extend(_sub_jaxprs(p))
    return False


def primitive_names(jaxpr) -> frozenset:
    """Every primitive name in `jaxpr` and its sub-jaxprs (jit, shard_map, scan, cond, ...)."""
    seen: set = set()
    stack = [jaxpr]
    while stack:
        j = stack.pop()
        for eqn in j.eqns:
            seen.add(eqn.primitive.name)
            stack.extend(_sub_jaxprs(eqn.params))
    return frozenset(seen)


def host_array(x, *, copy: bool = True):
    """A fully addressable jax.Array copied off its devices as a refsim.Array, each device's own
    data, without running or caching anything in JAX: indices and replica ids come from refsim's
    equal sharding (not JAX's cached `devices_indices_map`), a key array's words from its base
    array (not `jax.random.key_data`, a jit), so the oracle leaves JAX's caches as it found them.
    `copy=False` reads each device's buffer where it is (`np.asarray` of a shard: a read-only
    view on XLA:CPU, a transfer elsewhere): for a value nothing can donate or delete while it is
    read (XLA's outputs during the comparison, inputs the call does not donate).
    TypeError for a sharding refsim has no equivalent of (a GSPMDSharding, a PmapSharding)."""
    if compat.has_logical_device_ids(x.sharding):
        raise TypeError(f"{x.sharding!r} renumbers its devices (logical device ids); refsim has no equivalent")
    shape = tuple(x.shape)
    # JAX's make_array_from_callback leaves an array a spec longer than its rank by trailing Nones
    sh = refsim_array.without_trailing_nones(convert.from_jax_sharding(x.sharding), len(shape))
    index, replica = sh.devices_indices_map(shape), sh.device_replica_id_map(shape)
    impl = compat.prng_impl_of(x.dtype)
    src = compat.key_base_array(x) if impl is not None else x
    dtype = compat.physical_dtype(x.dtype)
    by_dev = {}
    for s in src.addressable_shards:
        d = int(s.device.id)
        data = np.array(np.asarray(s.data), copy=True) if copy else np.asarray(s.data)
        if impl is not None:
            nd = len(tuple(impl.key_shape))
            data = np.ascontiguousarray(data).view(dtype).reshape(data.shape[:data.ndim - nd])
        ix = tuple(slice(i.start, i.stop) if isinstance(i, slice) else int(i) for i in index[d])
        by_dev[d] = Shard(d, ix, data, int(replica[d]))
    return Array(shape, dtype, sh, [by_dev[d] for d in index if d in by_dev])


def check_unreduced_kind(x) -> None:
    """NotCheckable for a jax.Array whose unreduced partial values combine by max or min (jax
    0.12's `unreduced_kind`), where the oracle compares per device what refsim lays out as
    partial sums (a `device_put`)."""
    spec = getattr(getattr(x, "sharding", None), "spec", None)
    if getattr(spec, "unreduced", None) and compat.unreduced_kind_of(spec) != "sum":
        raise NotCheckable("unreduced max/min", f"partial values combined by {compat.unreduced_kind_of(spec)} "
                           f"({spec}): refsim models partial sums only")


def _host_copy(x, copy: bool = True):
    """An input as refsim sees it: a jax.Array becomes a refsim.Array (each device's own data),
    copied off its devices unless `copy` is False (an input the call does not donate: read in place)."""
    import jax

    if isinstance(x, jax.core.Tracer):
        raise NotCheckable("traced argument", "called under an outer JAX trace")
    if isinstance(x, jax.Array):
        if not x.is_fully_addressable:
            raise NotCheckable("multi-process array", "an input spans devices of other processes")
        if compat.prng_impl_of(x.dtype) is not None:
            # refsim's structured key array (the key words, one field per impl), global
            try:
                return np.asarray(host_array(x))
            except TypeError:
                return compat.to_numpy(x)
        try:
            return host_array(x, copy=copy)
        except TypeError:                                   # e.g. a PmapSharding or GSPMDSharding
            return np.asarray(x)
    if isinstance(x, (np.ndarray, np.generic, int, float, complex, bool)):
        return np.asarray(x)
    raise NotCheckable("non-array argument", f"{type(x).__name__} (bind it with functools.partial)")


def _multi_device(x) -> bool:
    """True for a value laid out over several devices (an abstract-mesh sharding counts by its mesh size)."""
    return _multi_device_sharding(getattr(x, "sharding", None))


def _multi_device_sharding(sh) -> bool:
    if sh is None:
        return False
    try:
        # hasattr is not enough: over an AbstractMesh, `device_set` raises ValueError
        return len(sh.device_set) > 1
    except AttributeError:                                          # e.g. jit's UnspecifiedValue
        return False
    except (ValueError, NotImplementedError):                       # a sharding over an AbstractMesh
        mesh = getattr(sh, "mesh", None)
        return getattr(mesh, "size", 1) > 1


def _static_positions(args: tuple, kwargs: dict, static) -> tuple[set, set]:
    """The positional indices and keyword names that `jax.jit(static_argnums=, static_argnames=)` keeps static."""
    nums, names = static
    nums = (nums,) if isinstance(nums, int) else tuple(nums or ())
    names = (names,) if isinstance(names, str) else tuple(names or ())
    return {i % len(args) for i in nums if args and -len(args) <= i < len(args)}, set(names) & set(kwargs)


def trace(fn, args: tuple, kwargs: dict, static=((), ())) -> Traced:
    """Trace `fn(*args, **kwargs)` to a jaxpr (inputs kept as given until `take_host_copies`).

    `static`: (static_argnums, static_argnames) of a `jax.jit`; those arguments are closed over
    as Python values instead of traced.
    """
    import jax

    s_pos, s_names = _static_positions(args, kwargs, static)
    dyn = (tuple(None if i in s_pos else a for i, a in enumerate(args)),
           {k: v for k, v in kwargs.items() if k not in s_names})
    leaves, tree = jax.tree_util.tree_flatten(dyn)

    def flat_fn(*xs):
        a, k = jax.tree_util.tree_unflatten(tree, xs)
        a = tuple(args[i] if i in s_pos else x for i, x in enumerate(a))
        return fn(*a, **k, **{n: kwargs[n] for n in s_names})

    try:
        closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*leaves)
    except Exception as e:  # noqa: BLE001 - any tracing failure makes the call uncheckable
        raise NotCheckable("trace failed", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    prims = primitive_names(closed.jaxpr)
    out_leaves = jax.tree_util.tree_leaves(out_shape)
    sharded = (any(_multi_device(x) for x in leaves) or any(_multi_device(o) for o in out_leaves)
               or states_multi_device_layout(closed.jaxpr))
    return Traced(fn, closed, list(leaves), jax.tree_util.tree_structure(out_shape), prims, sharded)


_FACTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _facts(jaxpr) -> tuple[frozenset, bool]:
    """(primitive names, states a multi-device layout) of a jaxpr, computed once per jaxpr object
    (a jit executed many times is walked once)."""
    try:
        return _FACTS[jaxpr]
    except (KeyError, TypeError):
        pass
    facts = (primitive_names(jaxpr), states_multi_device_layout(jaxpr))
    try:
        _FACTS[jaxpr] = facts
    except TypeError:
        pass
    return facts


def from_execution(params: dict, args, fn=None) -> Traced:
    """A jit execution as JAX runs it, nothing traced: `params` are the jit equation's (its body
    `jaxpr`, `in_shardings`, `out_shardings`, ...), `args` its flat arguments (one per invar of
    the body). The body is what refsim evaluates; the stated out_shardings lay its outputs out."""
    closed = params["jaxpr"]
    n_in = len(closed.jaxpr.invars)
    if len(args) != n_in:
        raise NotCheckable("oracle error", f"the jit body takes {n_in} inputs, the execution passed {len(args)}")
    outs = tuple(params.get("out_shardings", ()))
    prims, states = _facts(closed.jaxpr)
    sharded = (any(_multi_device(x) for x in args) or states
               or any(_multi_device_sharding(s) for s in (*params.get("in_shardings", ()), *outs)))
    stated = [_refsim_sharding(s) for s in outs] if len(outs) == len(closed.jaxpr.outvars) else None
    donated = params.get("donated_invars")
    donated = tuple(bool(d) for d in donated) if donated is not None and len(donated) == n_in else None
    return Traced(fn, closed, list(args), None, prims, sharded, stated_out=stated, donated=donated)


def take_host_copies(traced: Traced) -> None:
    """Replace the traced inputs by host copies (refsim.Array per device-placed input), as
    refsim reads them; call it before XLA runs the call, which may donate its inputs. An input
    the execution does not donate (`Traced.donated`) is read in place, not copied: XLA leaves it
    as it is, and the oracle has finished with it before the call returns."""
    traced.in_avals = [(tuple(np.shape(x)), getattr(x, "dtype", None), getattr(x, "sharding", None))
                       for x in traced.flat_args]
    donated = traced.donated
    traced.flat_args = [_host_copy(x, copy=donated is None or k >= len(donated) or donated[k])
                        for k, x in enumerate(traced.flat_args)]


def is_shard_map_program(traced: Traced) -> bool:
    """True when the program (under top-level jits) is one shard_map producing every output."""
    from refsim.interpreter import api

    return api.ends_in_shard_map(_unwrap_jit(traced.closed, traced.stated_out)[0].jaxpr)


def check_replayable(traced: Traced) -> None:
    """Raise NotCheckable for programs refsim cannot replay: host callbacks, side effects."""
    cb = sorted(traced.primitives & CALLBACKS)
    if cb:
        raise NotCheckable("host callback", ", ".join(cb))
    effects = getattr(traced.closed.jaxpr, "effects", ())
    if effects:
        raise NotCheckable("side effects", ", ".join(sorted(type(e).__name__ for e in effects)))


# -- refsim's evaluation ----------------------------------------------------------------------
def _unwrap_jit(closed, stated=None):
    """(innermost closed jaxpr, stated out_shardings) through top-level jit equations that
    take the program's inputs in order and return its outputs (`stated`: those of the jit whose
    body `closed` is, if any)."""
    while True:
        j = closed.jaxpr
        if len(j.eqns) != 1 or closed.consts or j.constvars:
            return closed, stated
        eqn = j.eqns[0]
        if eqn.primitive.name not in ("jit", "pjit"):
            return closed, stated
        if list(eqn.invars) != list(j.invars) or list(eqn.outvars) != list(j.outvars):
            return closed, stated
        outs = eqn.params.get("out_shardings")
        if outs is not None:
            stated = [_refsim_sharding(s) for s in outs] if stated is None else [
                prev or _refsim_sharding(s) for s, prev in zip(outs, stated)]   # the outer jit's last word
        closed = eqn.params["jaxpr"]


def _refsim_sharding(s):
    """The refsim NamedSharding of a JAX sharding the program states (None if unspecified)."""
    import jax

    if isinstance(s, jax.sharding.NamedSharding) and isinstance(s.mesh, jax.sharding.Mesh):
        return convert.from_jax_sharding(s)
    return None


def _top_shard_map_mesh(closed, xla_outs):
    """The refsim Mesh of a program whose last equation is its shard_map producing every output."""
    import jax

    from refsim.interpreter import api

    if not api.ends_in_shard_map(closed.jaxpr):
        return None
    jm = closed.jaxpr.eqns[-1].params["mesh"]
    if isinstance(jm, jax.sharding.Mesh):
        return Mesh.from_jax(jm)
    for o in xla_outs:                                     # an abstract mesh: devices from XLA's outputs
        m = getattr(getattr(o, "sharding", None), "mesh", None)
        if isinstance(m, Mesh):
            return m
    return None


def _explicit_out_layout(var, mesh, manual: set):
    """The layout a partially manual shard_map's output type states over Explicit axes.

    out_specs name only the manual axes; an output split over an Explicit axis the shard_map
    leaves automatic (vmap of a shard_map over an Explicit-sharded batch dimension: the type
    reads ``i32[4@data,4@model]`` for ``out_specs=P(None, 'model')``) is laid out by its type,
    as JAX lays it out. None when the type names no automatic axis."""
    jspec = getattr(getattr(getattr(var, "aval", None), "sharding", None), "spec", None)
    if jspec is None:
        return None
    spec = PartitionSpec.from_jax(jspec)
    if spec.unreduced or spec.reduced or not (set(spec.used_axes()) - manual):
        return None
    return NamedSharding(mesh, spec)


def _any_auto_axis(jax_mesh) -> bool:
    """True when a shard_map equation's mesh (its axes typed as before the shard_map: the ones
    it makes manual keep their outer type) has an Auto axis.

    There JAX does not lay a partially manual shard_map's output out by its type: the lowering
    opens every dimension of the output's sharding to the partitioner and marks the Explicit
    axes its out_specs do not name replicated, and no enclosing jit constrains the result. A
    nested ``jax.smap`` over an Explicit axis inside one over an Auto axis types its output
    ``f32[8,2@x]`` (out_axes over 'x' inside), yet jax 0.10.2 returns it laid out ``P('y')``,
    eagerly and under jit alike (jax 0.12: ``P('y', 'x')``): its placement over the axes the
    shard_map leaves automatic is the partitioner's choice, compared by value where XLA's
    agrees with out_specs on the manual axes (`_compiler_placed`)."""
    types = getattr(jax_mesh, "axis_types", None) or ()
    if isinstance(types, dict):                              # older JAX: {AxisType: axis names}
        return any(getattr(t, "name", str(t)) == "Auto" and names for t, names in types.items())
    return any(getattr(t, "name", str(t)) == "Auto" for t in types)


def _entry_axes(entry) -> tuple:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _on_axes(spec, axes: set, ndim: int) -> tuple:
    """`spec`'s entries over `axes` only, one tuple per dimension (other axes dropped)."""
    ents = list(spec) + [None] * (ndim - len(spec))
    return tuple(tuple(a for a in _entry_axes(e) if a in axes) for e in ents[:ndim])


def _compiler_placed(xla_out, out_spec, mesh, manual: set):
    """XLA's sharding of a partially manual shard_map's output when it agrees with `out_spec` on
    the manual axes (it differs only over the automatic axes, which the program leaves to the
    partitioner), else None: the output is then laid out as stated and a misplaced block shows."""
    sh = getattr(xla_out, "sharding", None)
    if not isinstance(sh, NamedSharding) or sh.mesh != mesh or out_spec is None:
        return None
    spec = PartitionSpec.from_jax(out_spec) if not isinstance(out_spec, PartitionSpec) else out_spec
    if sh.spec.unreduced or sh.spec.reduced or spec.unreduced or spec.reduced:
        return None
    shape = getattr(xla_out, "shape", None)          # explain's stand-ins carry a layout only
    ndim = len(shape) if shape is not None else max(len(sh.spec), len(spec))
    if _on_axes(sh.spec, manual, ndim) != _on_axes(spec, manual, ndim):
        return None
    return sh


#: Equations that pass a sub-jaxpr's outputs on as their own (an Exported's call sits under them:
#: `Exported.call` wraps it in a custom_vjp_call, a jit of it in a jit equation).
_PASS_THROUGH = {"custom_vjp_call": "call_jaxpr", "custom_jvp_call": "call_jaxpr", "jit": "jaxpr", "pjit": "jaxpr",
                 "closed_call": "call_jaxpr", "core_call": "call_jaxpr"}


def _exported_spec(jaxpr, k: int, depth: int = 8):
    """The layout the Exported whose call makes output `k` of `jaxpr` states for it, or None."""
    for _ in range(depth):
        var = jaxpr.outvars[k]
        eqn = next((e for e in jaxpr.eqns if any(o is var for o in e.outvars)), None)
        if eqn is None:
            return None
        j = next(i for i, o in enumerate(eqn.outvars) if o is var)
        name = eqn.primitive.name
        if name == "call_exported":
            specs = compat.exported_out_specs(eqn.params["exported"])
            return specs[j] if j < len(specs) else None
        sub = eqn.params.get(_PASS_THROUGH.get(name, ""))
        if sub is None:
            return None
        jaxpr, k = getattr(sub, "jaxpr", sub), j
    return None


def _exported_layouts(jaxpr, traced: Traced, xla_outs: list) -> list:
    """Per output, the refsim NamedSharding a called `jax.export.Exported` states for it (its out
    shardings, over an abstract mesh), bound to the devices of a mesh of the call with the same
    axis names and sizes (XLA's result's, else an input's); None where none is stated or bound."""
    meshes = [getattr(getattr(x, "sharding", None), "mesh", None) for x in xla_outs]
    for _, _, sh in traced.in_avals or ():
        try:
            meshes.append(convert.from_jax_sharding(sh).mesh if _refsim_sharding(sh) is not None else None)
        except (TypeError, ValueError, NotImplementedError):
            continue
    meshes = [m for m in meshes if isinstance(m, Mesh)]
    out = []
    for k in range(len(jaxpr.outvars)):
        spec = _exported_spec(jaxpr, k)
        mesh = None if spec is None else next(
            (m for m in meshes if (tuple(m.axis_names), tuple(m.axis_sizes)) == spec[:2]), None)
        out.append(None if mesh is None else NamedSharding(mesh, PartitionSpec.from_jax(spec[2])))
    return out


def refsim_outputs(traced: Traced, xla_outs: list, probe=None) -> tuple[list, list[str]]:
    """refsim's outputs (refsim.Array each) and, per output, where its layout came from:
    "program" (stated by out_specs / out_shardings) or "xla" (unstated: XLA's choice).
    `probe(eqn, invals, outvals)` sees every equation refsim evaluates (`refsim.evaluate`)."""
    closed, stated = _unwrap_jit(traced.closed, traced.stated_out)
    n = len(closed.jaxpr.outvars)
    stated = [stated[k] if stated is not None and k < len(stated) else None for k in range(n)]
    try:
        mesh = _top_shard_map_mesh(closed, xla_outs)
        if mesh is not None:
            args = traced.flat_args
            manual = set(compat.shard_map_manual_axes(closed.jaxpr.eqns[-1].params))
            if manual != set(mesh.axis_names):
                # Partially manual: the body sees its inputs invariant over the automatic axes, so
                # refsim gets global values (per-device replicas along those axes would read as split).
                args = [np.asarray(a) for a in args]
            # laid out by out_specs; an enclosing jit's out_shardings (or an output type's
            # Explicit axes, where JAX lays results out by their types) lay a result out anew
            typed = not _any_auto_axis(closed.jaxpr.eqns[-1].params["mesh"])
            layouts = [s if s is not None else _explicit_out_layout(v, mesh, manual) if typed else None
                       for v, s in zip(closed.jaxpr.outvars, stated)]
            where = ["program"] * n
            if manual != set(mesh.axis_names):
                # over the automatic axes the placement is the partitioner's choice, not the
                # program's: such an output is compared by value on XLA's layout
                specs = closed.jaxpr.eqns[-1].params.get("out_specs", ())
                for k in range(n):
                    if layouts[k] is None and k < len(specs) and k < len(xla_outs):
                        placed = _compiler_placed(xla_outs[k], specs[k], mesh, manual)
                        if placed is not None:
                            layouts[k], where[k] = placed, "xla"
            return refsim.evaluate(closed, args, mesh=mesh, out_layouts=layouts, probe=probe), where
        from_exported = _exported_layouts(closed.jaxpr, traced, xla_outs)
        stated = [s if s is not None else e for s, e in zip(stated, from_exported)]
        layouts = [s if s is not None else x.sharding for s, x in zip(stated, xla_outs)]
        outs = refsim.evaluate(closed, traced.flat_args, out_layouts=layouts, probe=probe)
    except UnsupportedPrimitive as e:
        raise NotCheckable("unsupported primitive", e.primitive) from e
    except UnsupportedUnreducedKind as e:
        raise NotCheckable("unreduced max/min", str(e).splitlines()[0][:200]) from e
    return outs, ["program" if s is not None else "xla" for s in stated]


def sum_unreduced(traced: Traced, ref: list, xla: list, where: list, kinds=None) -> tuple[list, list, list]:
    """Outputs with unreduced axes compared by their value: each side's partial sums added up.

    Outside a shard_map's out_specs (which state each device's own partial value) JAX's
    semantics state only the sum of a global-view unreduced value; how XLA's partitioner
    splits it into per-device partial sums (a value computed replicated and then resharded
    to unreduced may sit on any device) is its choice. Both sides are all-reduced
    (`refsim.interpreter.unreduced.all_reduced`) and compared laid out by the spec's
    dimension entries; `where` says so. `kinds`: per output, how XLA's result says its partial
    values combine ("sum", or jax 0.12's "max" / "min")."""
    from refsim.interpreter.unreduced import all_reduced, unreduced_axes_of

    if is_shard_map_program(traced):
        return ref, xla, where
    ref, xla, where = list(ref), list(xla), list(where)
    for k, (r, x) in enumerate(zip(ref, xla)):
        if unreduced_axes_of(r) or unreduced_axes_of(x):
            kind = kinds[k] if kinds is not None and k < len(kinds) else "sum"
            ref[k], xla[k] = all_reduced(r, kind), all_reduced(x, kind)
            if k < len(where):
                where[k] += f" (unreduced: the {kind} of the partial values compared)"
    return ref, xla, where


def output_paths(out) -> list[str]:
    """Each output leaf's pytree path, as JAX prints it (``[0]['w1']``); "" for a single array."""
    import jax

    flat = jax.tree_util.tree_flatten_with_path(out)[0]
    if len(flat) == 1 and not flat[0][0]:
        return [""]
    return [jax.tree_util.keystr(p) for p, _ in flat]


def xla_outputs(out) -> list:
    """XLA's result (a pytree of jax.Arrays) as refsim.Arrays, copied off each device."""
    import jax

    res = []
    for x in jax.tree_util.tree_leaves(out):
        if not isinstance(x, jax.Array):
            x = jax.numpy.asarray(x)
        if not x.is_fully_addressable:
            raise NotCheckable("multi-process array", "an output spans devices of other processes")
        try:
            # read in place: the caller gets these arrays only after the comparison
            res.append(host_array(x, copy=False))
        except (TypeError, ValueError, NotImplementedError) as e:   # e.g. an unreduced output sharding
            raise NotCheckable("output layout not comparable", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    return res
