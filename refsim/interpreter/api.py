"""Program entry points: `refsim.shard_map`, `refsim.pmap`, `refsim.jit`, `refsim.eval_jaxpr`,
and `refsim.evaluate`, the one step they share.

Each traces the unmodified JAX function with JAX against an AbstractMesh (no
devices needed, so any mesh size traces), then hands the closed jaxpr to `evaluate`,
which interprets it with the NumPy rules and places the results: `refsim.Array`
values laid out by out_specs / out_shardings; a manual region's outputs keep every
device's own value, so a device-by-device comparison with XLA is possible and
replication claims are checked against what devices actually hold. Code that traces
a program itself (conformance's oracle mode) calls `evaluate` the same way.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Callable

import numpy as np
from jax.extend.core import Literal

from refsim import compat
from refsim.array import Array, Shard, put
from refsim.values import as_jax_array
from refsim import device_assignment as DA
from refsim.interpreter import core, trace_cache
from refsim.interpreter.registry import Context, load_rules
from refsim.interpreter.rules import sharding as S
from refsim.interpreter.unreduced import Partials, from_array, kind_of, to_unreduced, unreduced_axes_of
from refsim.layouts.mesh import AbstractMesh, AxisType, Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec, check_no_duplicate_axes
from refsim.layouts.single_device import SingleDeviceSharding

_PMAP_DEFAULT_AXIS = "_internal_pmap_axis_name"  # the name jax.pmap gives an unnamed axis


# --- small conversions ---------------------------------------------------------------------

def _is_spec(x) -> bool:
    return x is None or isinstance(x, PartitionSpec) or compat.is_jax_partition_spec(x)


def _specs_to_jax(tree):
    import jax

    return jax.tree_util.tree_map(
        lambda s: s if s is None or not isinstance(s, PartitionSpec) else s.to_jax(), tree, is_leaf=_is_spec
    )


def _as_mesh(mesh, api: str) -> Mesh:
    if mesh is None:  # as jax.shard_map: the mesh of the enclosing `jax.set_mesh`
        import jax

        ctx = jax.sharding.get_mesh()
        if getattr(ctx, "empty", True):
            raise ValueError(f"{api}: mesh=None and the context mesh is empty; pass mesh=... or call it "
                             "under `jax.set_mesh(mesh)` to enter into a mesh context.")
        mesh = ctx
    if getattr(mesh, "empty", False) or not getattr(mesh, "axis_names", ()) or 0 in tuple(
            getattr(mesh, "axis_sizes", None) or getattr(mesh, "shape", {}).values() or (0,)):
        raise ValueError(f"{api} requires a non-empty mesh. Got {mesh!r}; pass a mesh with at least one "
                         "axis of size >= 1, e.g. refsim.Mesh((2,), ('x',)).")
    if isinstance(mesh, Mesh):
        return mesh
    if isinstance(mesh, AbstractMesh):
        raise TypeError(
            f"{api}: mesh={mesh!r} is an AbstractMesh; results need device ids, so pass a refsim.Mesh "
            "(e.g. refsim.Mesh(mesh.axis_sizes, mesh.axis_names))."
        )
    if hasattr(mesh, "devices") and hasattr(mesh, "axis_names"):
        return Mesh.from_jax(mesh)
    raise TypeError(f"{api}: mesh must be a refsim.Mesh or jax.sharding.Mesh, got {type(mesh).__name__}.")


def _tracing_mesh(mesh: AbstractMesh, types=None):
    """The jax AbstractMesh a program is traced against (Auto axes unless `types` says otherwise).

    Under a `jax.set_mesh` / `use_abstract_mesh` context over the same axis names and sizes,
    the context's own abstract mesh (its axis types and device kind): `jax.shard_map` requires
    the mesh it is given to equal the context mesh, so a program written for the context runs.
    """
    import jax

    ctx = jax.sharding.get_abstract_mesh()
    if not ctx.empty and (tuple(ctx.axis_names), tuple(ctx.axis_sizes)) == (mesh.axis_names, mesh.axis_sizes):
        return ctx
    types = types if types is not None else (AxisType.Auto,) * mesh.ndim
    return compat.make_abstract_mesh(mesh.axis_sizes, mesh.axis_names, types)


def _canonical(x) -> np.ndarray:
    """A NumPy argument with JAX's canonical dtype (float64 -> float32 unless x64 is on); a JAX key
    array becomes refsim's structured keys; a float0 argument (a data-less tangent) is taken as it
    is; any other non-numeric argument is a TypeError, as in JAX."""
    try:
        return as_jax_array(x, arg="a program argument", api="refsim", float0=True)
    except (TypeError, ValueError, OverflowError) as e:  # name the value only when it is bad (no repr on the hot path)
        import reprlib

        raise type(e)(f"{e} The argument: {reprlib.repr(x)}.") from None


def _abstract(x, sharding=None):
    import jax

    if compat.prng_impl_of(getattr(x, "dtype", None)) is not None:  # a JAX key array
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
    if isinstance(x, Array):
        dt = compat.jax_key_dtype(x.dtype) or jax.dtypes.canonicalize_dtype(x.dtype)
        return jax.ShapeDtypeStruct(x.shape, dt, sharding=sharding)
    arr = _canonical(x)
    dt = compat.jax_key_dtype(arr.dtype) or arr.dtype
    return jax.ShapeDtypeStruct(arr.shape, dt, sharding=sharding)


_JAX_SHARD_MAPS = trace_cache.memo()
_JIT_KW = trace_cache.memo()
_AVALS = trace_cache.memo()


def _abstract_key(mesh) -> tuple:
    """What identifies `mesh.abstract_mesh` (refsim's AbstractMesh compares exactly this)."""
    return ("AbstractMesh", mesh.axis_sizes, mesh.axis_names, mesh.axis_types)


def _abstract_flat(flat, tmesh) -> tuple[list, tuple]:
    """`_abstract(x, _explicit_sharding(x, tmesh))` per flat argument, and their
    `trace_cache.avals_key`."""
    avals, keys = [], []
    for x in flat:
        aval, k = _aval_and_key(x, None if type(x) is np.ndarray else _explicit_sharding(x, tmesh))
        avals.append(aval)
        keys.append(k)
    return avals, tuple(keys)


def _aval_and_key(x, sharding) -> tuple:
    """`_abstract(x, sharding)` and its `trace_cache.avals_key` entry. Without a sharding, a
    plain numeric ndarray's aval depends only on its shape, dtype and x64: it is built once per
    those (bounded); a bad argument raises as `_abstract` raises it (nothing is remembered)."""
    if sharding is None and type(x) is np.ndarray and x.dtype.names is None:
        import jax

        return _AVALS.get((x.shape, x.dtype, bool(jax.config.jax_enable_x64)), lambda: _aval_and_key_of(x, None))
    return _aval_and_key_of(x, sharding)


def _aval_and_key_of(x, sharding) -> tuple:
    aval = _abstract(x, sharding)
    return aval, trace_cache.avals_key([aval])[0]


def _explicit_sharding(x, tmesh):
    """The sharding type a laid-out argument has under an Explicit tracing mesh (None otherwise):
    a refsim.Array's or jax.Array's NamedSharding spec on `tmesh`, as `jax.shard_map` reads it."""
    import jax

    if AxisType.Explicit.name not in {getattr(t, "name", str(t)) for t in tmesh.axis_types}:
        return None
    sharding = getattr(x, "sharding", None)
    spec = getattr(sharding, "spec", None)
    if spec is None or not isinstance(sharding, (NamedSharding, jax.sharding.NamedSharding)):
        return None
    spec = spec.to_jax() if isinstance(spec, PartitionSpec) else spec
    return jax.sharding.NamedSharding(tmesh, spec)


def _global(x, aval=None) -> np.ndarray:
    """A program input in the global view; an unreduced Array as its devices' partial values,
    combined as its type (`aval`: jax 0.12's unreduced_kind) says."""
    if isinstance(x, Partials):  # an unreduced value keeps its partial sums
        return x
    if isinstance(x, Array) and isinstance(x.sharding, NamedSharding) and unreduced_axes_of(x):
        return from_array(x, kind_of(aval) if aval is not None else "sum")  # each device's own partial
    return np.asarray(x) if isinstance(x, Array) else _canonical(x)


def _partials_array(blocks: np.ndarray, mesh: Mesh, spec, info) -> Array:
    """An Array unreduced over `spec.unreduced`: device p holds `blocks[p]`, its own partial sum
    of its block (as `jax.Array` shards of an unreduced sharding hold them)."""
    sharding = NamedSharding(mesh, spec)
    blocks = np.broadcast_to(blocks, mesh.axis_sizes + blocks.shape[mesh.ndim:])
    counts = sharding.num_shards(blocks.ndim - mesh.ndim)
    shape = tuple(n * c for n, c in zip(blocks.shape[mesh.ndim:], counts))
    index_map = sharding.devices_indices_map(shape)
    shards = [Shard(int(mesh.device_ids[pos]), index_map[int(mesh.device_ids[pos])], blocks[pos])
              for pos in np.ndindex(*mesh.axis_sizes)]
    return Array(shape, blocks.dtype, sharding, shards, info=info)


def _info(extra: dict) -> dict:
    fb = dict(extra.get("fallback_log", {}))
    info = {"backend": "refsim", "jax_version": ".".join(map(str, compat.jax_version())), "independent": not fb}
    if fb:
        info["fallback"] = fb
    if extra.get("replication"):
        info["replication"] = list(extra["replication"])
    if extra.get("intermediates"):
        info["intermediates"] = extra["intermediates"]
    return info


def _new_extra(fallback: bool, strict: bool, probe=None) -> dict:
    extra = {"fallback": bool(fallback), "strict": bool(strict), "replication": []}
    if probe is not None:
        extra["probe"] = probe
    return extra


def _with_intermediates(extra: dict, intermediates, mesh) -> dict:
    """Install a `refsim.intermediates.Recorder` as the probe when `intermediates=` asks for one."""
    from refsim.intermediates import recorder_for

    rec = recorder_for(intermediates, mesh)
    if rec is not None:
        extra["probe"], extra["intermediates"] = rec, rec.directory
    return extra


# --- shard_map -------------------------------------------------------------------------------

def _stacked_input(x, mesh: Mesh, spec) -> np.ndarray:
    """A shard_map operand as stacked blocks; an Array already laid out by `spec` keeps its per-device data."""
    spec = S.as_refsim_spec(spec)
    if isinstance(x, Partials) or spec.unreduced:
        return S.enter_global(_global(x), mesh, spec)
    if isinstance(x, Array) and isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh:
        if x.sharding.spec.padded(x.ndim) == spec.padded(x.ndim):
            stacked = x.to_stacked(mesh)
            # Replicas keep their own data along axes the spec leaves unnamed (mesh dims full size).
            if not stacked.dtype.names:  # JAX's canonical dtype, as tracing assumed
                import jax

                stacked = stacked.astype(jax.dtypes.canonicalize_dtype(stacked.dtype), copy=False)
            return stacked
    g = _global(x)
    return S.split_by_spec(g.reshape((1,) * mesh.ndim + g.shape), mesh, spec)


def _run_top_shard_map(closed, flat_args, mesh: Mesh, extra: dict):
    """Evaluate a traced program whose last equation is the shard_map; keep outputs stacked."""
    jaxpr = closed.jaxpr
    env: dict = {}
    ctx = Context(nm=0, mesh=None, extra=extra)
    for v, c in zip(jaxpr.constvars, closed.consts):
        env[v] = compat.to_numpy(c)
    for v, a in zip(jaxpr.invars, flat_args):
        env[v] = a

    def read(v, keep_array=False):
        if hasattr(v, "val") and not hasattr(v, "count"):  # a Literal
            return core.literal_value(v, 0)
        val = env[v]
        return val if keep_array else _global(val, v.aval)

    for eqn in jaxpr.eqns[:-1]:
        for var, val in zip(eqn.outvars, core.apply_eqn(ctx, eqn, [read(v) for v in eqn.invars])):
            env[var] = val
    eqn = jaxpr.eqns[-1]
    p = eqn.params
    top = _top_plan(jaxpr)
    manual = compat.shard_map_manual_axes(p) if top.manual is None else top.manual
    inner = Context(nm=mesh.ndim, mesh=mesh, extra=extra)
    in_specs = p["in_specs"] if top.in_specs is None else top.in_specs
    stacked = [_stacked_input(read(v, keep_array=True), mesh, s) for v, s in zip(eqn.invars, in_specs)]
    outs = core.eval_jaxpr(p["jaxpr"], (), *stacked, ctx=inner)
    by_var = {}
    out_specs = map(_out_spec_facts, p["out_specs"]) if top.out_specs is None else top.out_specs
    for var, y, (spec, what, used) in zip(eqn.outvars, outs, out_specs):
        agree = S.check_replicated(y, mesh, spec, manual - spec.unreduced, what,
                                   extra["replication"], extra["strict"])
        # The Array need not check its replicas again on np.asarray when every axis the spec
        # leaves unnamed was checked just now or is invariant (size 1, read as a broadcast).
        checked = agree and all(a in manual or y.shape[k] == 1
                                for k, a in enumerate(mesh.axis_names) if a not in used)
        by_var[var] = (y, spec, checked)
    return by_var


class _TopPlan:
    """What `evaluate` reads of a traced program's structure, once per Jaxpr object: whether it
    ends in a shard_map (`ends_in_shard_map`) and, if so, that equation's manual axes, its
    in_specs as refsim specs, and per out_spec (refsim spec, the name check_replicated reports,
    the axes it uses)."""

    __slots__ = ("ends", "manual", "in_specs", "out_specs")

    def __init__(self, jaxpr):
        self.ends = ends_in_shard_map(jaxpr)
        self.manual = self.in_specs = self.out_specs = None
        if not self.ends:
            return
        p = jaxpr.eqns[-1].params
        # Each part left None if reading it raises: the call reads it where it did, raising there.
        try:
            self.manual = compat.shard_map_manual_axes(p)
        except Exception:  # noqa: BLE001
            pass
        try:
            self.in_specs = [S.as_refsim_spec(s) for s in p["in_specs"]]
        except Exception:  # noqa: BLE001
            pass
        try:
            self.out_specs = [_out_spec_facts(spec) for spec in p["out_specs"]]
        except Exception:  # noqa: BLE001
            pass


def _out_spec_facts(spec) -> tuple:
    spec = S.as_refsim_spec(spec)
    return spec, f"shard_map out_specs {spec!r}", spec.used_axes()


_TOP_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _top_plan(jaxpr) -> _TopPlan:
    return core.per_jaxpr(_TOP_PLANS, jaxpr, _TopPlan)


def ends_in_shard_map(jaxpr) -> bool:
    """True when `jaxpr` (a Jaxpr, not a ClosedJaxpr) is what `jax.shard_map` traces to: its last
    equation is a shard_map that produces every output and that no other equation reads. Such a
    program is evaluated per device by `evaluate(..., mesh=...)`."""
    if not jaxpr.eqns or jaxpr.eqns[-1].primitive.name != "shard_map":
        return False
    last = jaxpr.eqns[-1]
    produced = set(last.outvars)
    # Literals (a constant operand such as grad's seed `reshard 1.0`) are unhashable and never
    # produced by the shard_map: test only Vars for membership.
    return all(_is_var(v) and v in produced for v in jaxpr.outvars) and not any(
        _is_var(v) and v in produced for e in jaxpr.eqns[:-1] for v in e.invars
    )


def _is_var(v) -> bool:
    return not isinstance(v, Literal)


def shard_map(f: Callable, *, mesh=None, in_specs, out_specs, check_vma: bool = True, axis_names=None,
              strict: bool = False, fallback: bool = False, intermediates=None) -> Callable:
    """`jax.shard_map` run by refsim: the same arguments, results as `refsim.Array` pytrees.

    Arguments are NumPy arrays (global values, split by in_specs) or refsim.Arrays. Each
    output is laid out by its out_spec with every device's own block kept; devices that
    out_specs claims hold replicas are checked, and a disagreement raises ReplicationError
    when `strict=True` (otherwise it is recorded in `result.info["replication"]` and raised
    by `np.asarray(result)`). `fallback=True` evaluates primitives without a refsim rule with
    JAX on CPU and marks the result `info["independent"] = False`. `intermediates=True` (or a
    directory) dumps every equation's value as .npz (`refsim.intermediates`), path in `info`.
    """
    import jax

    fixed = None if mesh is None else _as_mesh(mesh, "refsim.shard_map")
    # JAX raises DuplicateSpecError when it builds the operands' NamedShardings; tracing
    # against an AbstractMesh does not, so check the specs here.
    for arg, tree in (("in_specs", in_specs), ("out_specs", out_specs)):
        for spec in jax.tree_util.tree_leaves(tree, is_leaf=_is_spec):
            if spec is not None and _is_spec(spec):
                check_no_duplicate_axes(spec, where=f"refsim.shard_map {arg}")

    def wrapped(*args):
        load_rules()
        rmesh = fixed if fixed is not None else _as_mesh(None, "refsim.shard_map")
        flat, tree = jax.tree_util.tree_flatten(args)
        tmesh = _tracing_mesh(rmesh)
        in_key, out_key = trace_cache.tree_key(in_specs, _is_spec), trace_cache.tree_key(out_specs, _is_spec)
        names_key = None if axis_names is None else frozenset(axis_names)

        def jax_shard_map():
            kw = dict(mesh=tmesh, in_specs=_specs_to_jax(in_specs),
                      out_specs=_specs_to_jax(out_specs), check_vma=check_vma)
            if axis_names is not None:
                kw["axis_names"] = set(axis_names)
            return jax.shard_map(f, **kw)

        # jax.shard_map of equal inputs is built once (its errors, if any, raise here every call)
        traced = _JAX_SHARD_MAPS.get(trace_cache.key_or_none(
            (f, tmesh, in_key, out_key, check_vma, names_key)), jax_shard_map)
        avals, avals_key = _abstract_flat(flat, tmesh)
        DA.check_call(f, args, flat, uses=[DA.Use("inside", DA.assignment(rmesh), eqn="shard_map")],
                      treedef=tree)
        key = trace_cache.program_key(
            "shard_map", f, _abstract_key(rmesh), tmesh, tree, avals_key, in_key, out_key,
            check_vma, names_key)
        try:
            closed, out_shape = trace_cache.lookup(key, lambda: jax.make_jaxpr(traced, return_shape=True)(
                *jax.tree_util.tree_unflatten(tree, avals)))
        except jax.errors.ConcretizationTypeError as e:  # TracerBoolConversionError included
            if compat.no_trace_active():
                # As eager jax.shard_map: run the body op by op (refsim's rules), so Python may
                # branch on values the type says are the same on every device.
                return _run_eager(f, args, rmesh, tmesh, in_specs, out_specs, check_vma, axis_names,
                                  _with_intermediates(_new_extra(fallback, strict), intermediates, rmesh))
            e.add_note(
                "refsim.shard_map was called inside a JAX trace, where it cannot fall back to eager "
                "op-by-op evaluation, so Python control flow on a traced value (`if psum(...) > 0`) "
                "cannot run; use jax.lax.cond / jnp.where (docs/interpreter.md, 'Eager shard_map').")
            raise
        outs = evaluate(closed, flat, mesh=rmesh, strict=strict, fallback=fallback, intermediates=intermediates)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)

    wrapped.__name__ = getattr(f, "__name__", "shard_map")
    wrapped.__wrapped__ = f
    return wrapped


def _spec_leaves(specs, tree, what: str) -> list:
    """`specs` (a spec or a pytree prefix of specs) broadcast over the leaves of `tree`."""
    import jax

    out: list = []
    jax.tree_util.tree_map(lambda sp, sub: out.extend([sp] * len(jax.tree_util.tree_leaves(sub))),
                           specs, tree, is_leaf=_is_spec)
    return out


def _run_eager(f, args, rmesh: Mesh, tmesh, in_specs, out_specs, check_vma, axis_names, extra):
    """`refsim.shard_map` evaluated op by op (refsim/interpreter/eager.py); Arrays as the traced path."""
    import jax

    from refsim.interpreter import eager

    manual = frozenset(rmesh.axis_names if axis_names is None else axis_names)
    flat, tree = jax.tree_util.tree_flatten(args)
    specs = [S.as_refsim_spec(s) for s in _spec_leaves(
        tuple(in_specs) if isinstance(in_specs, list) else in_specs, tuple(args), "in_specs")]
    manual_mesh = tmesh.update_axis_types({n: jax.sharding.AxisType.Manual for n in manual})
    stacked = [_stacked_input(x, rmesh, sp) for x, sp in zip(flat, specs)]
    avals = [eager.local_aval(x, rmesh.ndim, sp, manual_mesh, check_vma) for x, sp in zip(stacked, specs)]
    outs, out_tree = eager.run(lambda *xs: f(*jax.tree_util.tree_unflatten(tree, xs)), stacked, avals,
                               mesh=rmesh, tracing_mesh=tmesh, manual_axes=manual, check=check_vma, extra=extra)
    out_specs_flat = [S.as_refsim_spec(s) for s in _spec_leaves(out_specs, jax.tree_util.tree_unflatten(
        out_tree, outs), "out_specs")]
    info = _info(extra)
    res = []
    for y, spec in zip(outs, out_specs_flat):
        S.check_replicated(y, rmesh, spec, manual - spec.unreduced, f"shard_map out_specs {spec!r}",
                           extra["replication"], extra["strict"])
        res.append(_partials_array(y, rmesh, spec, info) if spec.unreduced
                   else Array.from_stacked(y, rmesh, spec, info=info))
    return jax.tree_util.tree_unflatten(out_tree, res)


def evaluate(closed_jaxpr, flat_args, *, mesh=None, out_layouts=None, strict: bool = False,
             fallback: bool = False, intermediates=None, probe=None) -> list:
    """Evaluate a traced program with refsim's rules; one `refsim.Array` per output, placed.

    `closed_jaxpr` is a program as `jax.make_jaxpr` traces it (global view) and `flat_args` its
    flat inputs, one per jaxpr input: NumPy arrays (global values) or `refsim.Array`s. This is
    the step `refsim.shard_map`, `refsim.pmap` and `refsim.jit` take after tracing.

    * With a `mesh` (refsim.Mesh or jax.sharding.Mesh) and a program that ends in a shard_map
      (`ends_in_shard_map`: what `jax.shard_map` traces to), the region runs on stacked
      per-device values: an input Array laid out by its in_spec keeps each device's own data,
      and each output keeps every device's own block, laid out by its out_spec (unreduced
      out_specs keep each device's partial sum). Replicas the out_specs claim are checked:
      a disagreement raises ReplicationError with `strict=True`, else it is recorded in
      `info["replication"]` and raised by `np.asarray(result)`.
    * Otherwise the global value of every output is computed and placed by its layout.

    `out_layouts`: one refsim sharding (NamedSharding, SingleDeviceSharding) or None per
    output. A global-view output is placed by it (None: replicated over `mesh`, or on device 0
    without one); a shard_map output whose out_spec lays it out differently is laid out anew by
    it, as an enclosing `jax.jit`'s out_shardings do. `fallback=True` evaluates primitives
    without a refsim rule with JAX on CPU (`info["independent"] = False`); `intermediates=`
    dumps every equation's value (`refsim.intermediates`); `probe(eqn, invals, outvals)` is called
    after every equation (as `eval_jaxpr`'s; not together with `intermediates`).
    """
    load_rules()
    jaxpr = closed_jaxpr.jaxpr
    flat_args = list(flat_args)
    if len(flat_args) != len(jaxpr.invars):
        raise TypeError(f"refsim.evaluate: the program takes {len(jaxpr.invars)} flat arguments, got "
                        f"{len(flat_args)}; pass one per jaxpr input (jax.tree_util.tree_leaves of the call's args).")
    n = len(jaxpr.outvars)
    layouts = [None] * n if out_layouts is None else list(out_layouts)
    if len(layouts) != n:
        raise ValueError(f"refsim.evaluate: out_layouts has {len(layouts)} entries for a program with {n} "
                         "outputs; pass one sharding (or None) per output.")
    if mesh is not None:
        mesh = _as_mesh(mesh, "refsim.evaluate")
    extra = _with_intermediates(_new_extra(fallback, strict, probe), intermediates, mesh)
    if mesh is not None and _top_plan(jaxpr).ends:
        by_var = _run_top_shard_map(closed_jaxpr, flat_args, mesh, extra)
        info = _info(extra)
        outs = []
        for v, layout in zip(jaxpr.outvars, layouts):
            y, spec, checked = by_var[v]
            arr = (_partials_array(y, mesh, spec, info) if spec.unreduced
                   else Array.from_stacked(y, mesh, spec, info=info, replicas_checked=checked))
            if layout is not None and not _same_layout(layout, arr.sharding, arr.ndim):
                # laid out anew (an unreduced out_spec's partial sums are summed or moved)
                arr = _place(from_array(arr) if spec.unreduced else np.asarray(arr), layout, info, spec)
            outs.append(arr)
        return outs
    inputs = [_global(a, v.aval) for a, v in zip(flat_args, jaxpr.invars)]
    values = core.eval_closed_jaxpr(closed_jaxpr, *inputs, ctx=Context(extra=extra))
    info = _info(extra)
    default = NamedSharding(mesh, PartitionSpec()) if mesh is not None else SingleDeviceSharding(0)
    # memory a result must not be a view of: the inputs (but a global value refsim assembled
    # from an Array's shards into a buffer of its own), the constants
    held = [g for a, g in zip(flat_args, inputs) if isinstance(g, np.ndarray) and not _fresh_global(a, g)]
    held += [c for c in getattr(closed_jaxpr, "consts", ()) if isinstance(c, np.ndarray)]
    return [_place(v, s if s is not None else default, info, _type_spec(var), copy=not _own_result(v, held))
            for v, s, var in zip(values, layouts, jaxpr.outvars)]


def _fresh_global(arg, value) -> bool:
    """True when `value` is the global value of the refsim.Array `arg` assembled into new memory
    (not a view of its shards: a fully replicated or stacked Array may give one)."""
    if not isinstance(arg, Array) or not value.flags.owndata:
        return False
    return not any(np.may_share_memory(value, s.data) for s in arg.shards)


def _own_result(value, held: list) -> bool:
    """True when `value` is memory refsim allocated while evaluating (not a view of an input, a
    constant or a buffer NumPy does not own, e.g. a device's): placing it needs no copy."""
    if not isinstance(value, np.ndarray):
        return False
    root = value
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root.base is not None or not root.flags.owndata:
        return False
    return not any(np.may_share_memory(value, h) for h in held)


def _type_spec(var):
    """The spec a value's type states (its layout under an Explicit mesh), or None."""
    return getattr(getattr(getattr(var, "aval", None), "sharding", None), "spec", None)


def _same_layout(a, b, ndim: int) -> bool:
    if isinstance(a, NamedSharding) and isinstance(b, NamedSharding):
        return a.mesh == b.mesh and a.spec.padded(ndim) == b.spec.padded(ndim)
    return a == b


def _place(value, sharding, info, src_spec=None, copy: bool = True) -> Array:
    """`value` laid out by `sharding`; into unreduced axes as JAX's reshard puts it there
    (`to_unreduced`: a plain value laid out by `src_spec` keeps on each device what it holds).
    `copy=False`: `value` is refsim's own result, placed as read-only views of it."""
    spec = sharding.spec if isinstance(sharding, NamedSharding) else PartitionSpec()
    if spec.unreduced and isinstance(sharding, NamedSharding):
        value = to_unreduced(value, src_spec, sharding.mesh, spec.unreduced, spec,
                             value.kind if isinstance(value, Partials) else "sum")
        return _partials_array(S.split_by_spec(value.parts, value.mesh, spec), sharding.mesh, spec, info)
    if isinstance(value, Partials):
        value = value.total()  # an unreduced value placed without its axes is all-reduced
    arr = put(np.asarray(value), sharding, copy=copy)
    arr.info = dict(info)
    return arr


# --- pmap --------------------------------------------------------------------------------------

_PMAP_BODIES = trace_cache.memo()


def _axes_spec(axis_name, ax):
    return PartitionSpec() if ax is None else PartitionSpec(*([None] * ax), axis_name)


def pmap(f: Callable, axis_name=None, *, in_axes=0, out_axes=0, axis_size=None, devices=None,
         strict: bool = False, fallback: bool = False) -> Callable:
    """`jax.pmap` run by refsim, with JAX's own reading of pmap as shard_map.

    As `jax.pmap` (jax >= 0.10 builds it from `shard_map` over a 1-D mesh named `axis_name`
    with `check_vma=False`): each mapped argument is split along its `in_axes` dim, one slice
    per device; `out_axes=k` stacks results along dim k, `out_axes=None` claims every device
    returns the same value, which refsim checks. `devices` are device ids (or JAX devices) in
    mapped order; default 0..n-1.
    """
    import jax

    name = _PMAP_DEFAULT_AXIS if axis_name is None else axis_name
    for what, tree in (("in_axes", in_axes), ("out_axes", out_axes)):
        if not all(type(l) is int for l in jax.tree_util.tree_leaves(tree)):
            raise TypeError(f"pmap {what} must be an int, None, or (nested) container with those "
                            f"types as leaves, but got {tree}.")

    def wrapped(*args):
        flat, tree = jax.tree_util.tree_flatten(args)
        # JAX flattens (args, kwargs) against (in_axes, 0); the same call gives its error wording.
        axes_flat = compat.flatten_axes("pmap in_axes", jax.tree_util.tree_structure((args, {})),
                                         (tuple(in_axes) if isinstance(in_axes, list) else in_axes, 0))
        for a, x in zip(axes_flat, flat):
            if a is not None and not -np.ndim(x) <= a < np.ndim(x):  # JAX: IndexError, not a wrap-around
                raise IndexError(
                    f"pmap in_axes={a} is out of range for an argument of rank {np.ndim(x)} (shape "
                    f"{np.shape(x)}); pass an axis in [{-np.ndim(x)}, {np.ndim(x)}), or None to broadcast it.")
        axes_flat = [None if a is None else a % np.ndim(x) for a, x in zip(axes_flat, flat)]
        sizes = {np.shape(x)[a] for a, x in zip(axes_flat, flat) if a is not None}
        if not sizes:
            raise ValueError("pmap requires at least one argument with a mapped axis.")
        if len(sizes) > 1:
            raise ValueError(
                "pmap got inconsistent sizes for array axes to be mapped: "
                + ", ".join(f"arg {i} axis {a} size {np.shape(x)[a]}"
                            for i, (a, x) in enumerate(zip(axes_flat, flat)) if a is not None)
                + "; give every mapped argument the same size along its in_axes dimension."
            )
        (n,) = sizes
        if axis_size is not None and axis_size != n:
            raise ValueError(f"pmap axis_size={axis_size} does not match the mapped axis size {n} of the "
                             "arguments; drop axis_size or pass arguments of that size.")
        ids = None
        if devices is not None:
            ids = np.array([getattr(d, "id", d) for d in devices], dtype=np.int64)
            if ids.size != n:
                raise ValueError(f"pmap devices has {ids.size} entries but the mapped axis has size {n}; "
                                 "pass one device per mapped index.")
        else:
            _check_pmap_size(n)
        mesh = Mesh((n,), (name,), device_ids=ids)

        def body():
            def per_device(*flat_args):
                local = [x if a is None else jax.lax.squeeze(x, (a,)) for x, a in zip(flat_args, axes_flat)]
                out = f(*jax.tree_util.tree_unflatten(tree, local))
                return jax.tree_util.tree_map(
                    lambda ax, sub: jax.tree_util.tree_map(
                        lambda y: y if ax is None else jax.lax.expand_dims(y, (ax,)), sub),
                    out_axes, out, is_leaf=lambda x: x is None)

            return per_device

        # One body function per (f, argument structure, in_axes, out_axes): the trace cache keys
        # on the function, so a fresh closure per call would trace the program again every call.
        per_device = _PMAP_BODIES.get(trace_cache.key_or_none(
            (f, tree, tuple(axes_flat), trace_cache.tree_key(out_axes, lambda x: x is None))), body)
        out_specs = jax.tree_util.tree_map(lambda ax: _axes_spec(name, ax), out_axes,
                                           is_leaf=lambda x: x is None)
        in_specs = tuple(_axes_spec(name, a) for a in axes_flat)
        sm = shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                       check_vma=False, strict=strict, fallback=fallback)
        return sm(*flat)

    wrapped.__name__ = getattr(f, "__name__", "pmap")
    wrapped.__wrapped__ = f
    return wrapped


def _check_pmap_size(n: int) -> None:
    """Without `devices=`, jax.pmap maps over ``jax.devices()[:n]``: a mapped axis longer than JAX's
    device count is refused, as JAX refuses it (IndivisibleError when the count does not divide it,
    ValueError otherwise; both ValueErrors). refsim's virtual devices are the ones JAX has here;
    `devices=` names any other ids."""
    import jax

    count = jax.device_count()
    if n <= count:
        return
    from refsim.errors import IndivisibleError

    cls = IndivisibleError if n % count else ValueError
    raise cls(f"pmap got a mapped axis of size {n}, but JAX has {count} devices here: jax.pmap maps one index "
              f"per device (it lays the {n} rows out over {count} devices and fails). Map at most {count} "
              "indices per call (split the batch), or pass devices= with one virtual device id per index "
              "(refsim only: JAX has no such devices).")


def _broadcast_prefix(prefix, tree) -> list:
    """Leaves of `prefix` repeated over the leaves of the matching subtrees of `tree`."""
    import jax

    out: list = []
    jax.tree_util.tree_map(
        lambda p, sub: out.extend([p] * len(jax.tree_util.tree_leaves(sub))), prefix, tree,
        is_leaf=lambda x: x is None,
    )
    return out


# --- jit ------------------------------------------------------------------------------------------

def _is_sharding(x) -> bool:
    return isinstance(x, (NamedSharding, SingleDeviceSharding))


def _sharding_leaves(tree) -> list:
    import jax

    return [s for s in jax.tree_util.tree_leaves(tree, is_leaf=_is_sharding) if _is_sharding(s)]


def _find_mesh(in_shardings, out_shardings, flat_args) -> Mesh | None:
    for s in _sharding_leaves(in_shardings) + _sharding_leaves(out_shardings):
        if isinstance(s, NamedSharding) and isinstance(s.mesh, Mesh):
            return s.mesh
    import jax

    for a in flat_args:
        if isinstance(a, Array) and isinstance(a.sharding, NamedSharding):
            return a.sharding.mesh
        if isinstance(getattr(a, "sharding", None), jax.sharding.NamedSharding) and hasattr(a.sharding.mesh, "devices"):
            return Mesh.from_jax(a.sharding.mesh)  # a jax.Array laid out on a concrete mesh

    ctx = jax.sharding.get_mesh()  # the user's `jax.set_mesh`, as jax.jit reads it
    return None if getattr(ctx, "empty", True) else Mesh.from_jax(ctx)


def _context_mesh(in_shardings, out_shardings) -> Mesh | None:
    """The one concrete mesh the NamedShardings name (None if none or several): the mesh
    `xla_backend.jit` runs the program under with `jax.set_mesh`."""
    found = {s.mesh for s in _sharding_leaves(in_shardings) + _sharding_leaves(out_shardings)
             if isinstance(s, NamedSharding) and isinstance(s.mesh, Mesh)}
    return found.pop() if len(found) == 1 else None


def _is_desc(x) -> bool:
    return x is None or _is_sharding(x) or (isinstance(x, tuple) and x[:1] == ("named",))


def _trace_desc(tree):
    """What tracing reads of a sharding tree: each NamedSharding's spec (no device ids)."""
    import jax

    return jax.tree_util.tree_map(
        lambda s: ("named", s.spec) if isinstance(s, NamedSharding) else s, tree,
        is_leaf=lambda x: x is None or _is_sharding(x))


def _sharding_to_jax(s, jmesh):
    import jax

    if isinstance(s, NamedSharding):
        return jax.sharding.NamedSharding(jmesh, s.spec.to_jax())
    if s is None:
        return None
    raise TypeError(
        f"refsim.jit shardings must be refsim.NamedSharding (or None), got {s!r}; build one with "
        "refsim.NamedSharding(mesh, P(...))."
    )


def jit(f: Callable, in_shardings=None, out_shardings=None, *, fallback: bool = False,
        intermediates=None, donate_argnums=()) -> Callable:
    """`jax.jit` run by refsim: global-view evaluation, outputs laid out by their shardings.

    `donate_argnums` (an int or ints, as `jax.jit`'s): those arguments are consumed by the call, as
    JAX's documentation of buffer donation states: a donated `refsim.Array` is deleted after the
    call (reading it raises RuntimeError); the values computed do not depend on donation.

    Output placement follows `out_shardings`, else the shardings the traced program states
    (the jit equation's out_shardings, or the avals' explicit-sharding types), else fully
    replicated over the program's mesh (or device 0 when no mesh is involved).
    `intermediates=` dumps every equation's value as in `refsim.shard_map`.
    """
    import jax

    donated = _donate_argnums(donate_argnums)

    def wrapped(*args):
        load_rules()
        flat, tree = jax.tree_util.tree_flatten(args)
        mesh = _find_mesh(in_shardings, out_shardings, flat)
        # The mesh as `jax.set_mesh` of it on this platform's devices states it (see below).
        jmesh = (compat.context_abstract_mesh(mesh.axis_sizes, mesh.axis_names, mesh.axis_types)
                 if mesh is not None else None)
        explicit = mesh is not None and AxisType.Explicit in mesh.axis_types
        conv = lambda tree_: jax.tree_util.tree_map(  # noqa: E731
            lambda s: _sharding_to_jax(s, jmesh), tree_, is_leaf=lambda x: x is None or _is_sharding(x))
        if in_shardings is None or _is_sharding(in_shardings):
            in_flat_sh = [in_shardings] * len(flat)
        else:
            in_flat_sh = _broadcast_prefix(tuple(in_shardings) if isinstance(in_shardings, list)
                                           else in_shardings, tuple(args))
        abstract, avals_key = [], []
        for x, s in zip(flat, in_flat_sh):
            if s is None and isinstance(x, Array) and isinstance(x.sharding, NamedSharding):
                s = x.sharding
            elif s is None and mesh is not None and isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding):
                s = NamedSharding(mesh, S.as_refsim_spec(x.sharding.spec))  # a jax.Array argument
            aval, k = _aval_and_key(x, _sharding_to_jax(s, jmesh) if explicit and s is not None else None)
            abstract.append(aval)
            avals_key.append(k)
        in_desc = trace_cache.tree_key(_trace_desc(in_shardings), _is_desc)
        out_desc = trace_cache.tree_key(_trace_desc(out_shardings), _is_desc)

        def jit_kw():
            kw = {}
            if in_shardings is not None:
                kw["in_shardings"] = conv(in_shardings)
            if out_shardings is not None:
                kw["out_shardings"] = conv(out_shardings)
            return kw

        # The JAX shardings depend only on the mesh and each NamedSharding's spec (the trace
        # descriptions): built once per those (a TypeError for a non-refsim sharding raises here
        # every call, as building them raised it).
        kw = _JIT_KW.get(trace_cache.key_or_none(
            (jmesh, in_desc, out_desc, in_shardings is None, out_shardings is None)), jit_kw)
        # As xla_backend.jit runs under `jax.set_mesh` of the one mesh its shardings name, refsim
        # traces under that mesh as the abstract-mesh context, so `with_sharding_constraint(x,
        # P(...))` and `reshard` find it; sharding-in-types needs it for any Explicit mesh too.
        # A context the user set (jax.set_mesh / use_abstract_mesh) is kept as it is.
        user_ctx = not jax.sharding.get_abstract_mesh().empty
        scoped = not user_ctx and (explicit or _context_mesh(in_shardings, out_shardings) is not None)
        scope = compat.use_abstract_mesh(jmesh) if scoped else contextlib.nullcontext()

        def trace():
            with scope:
                return jax.make_jaxpr(jax.jit(f, **kw), return_shape=True)(
                    *jax.tree_util.tree_unflatten(tree, abstract))

        key = trace_cache.program_key(
            "jit", f, None if mesh is None else _abstract_key(mesh), tree, tuple(avals_key),
            in_desc, out_desc, scoped)
        closed, out_shape = trace_cache.lookup(key, trace)
        out_uses = [DA.Use("out_sharding", DA.assignment(s)) for s in _sharding_leaves(out_shardings)]
        DA.check_call(f, args, flat, in_shardings=in_flat_sh, uses=out_uses + DA.inside_uses(closed),
                      treedef=tree)
        res = evaluate(closed, flat, mesh=mesh, out_layouts=_out_placements(closed, out_shardings, out_shape, mesh),
                       fallback=fallback, intermediates=intermediates)
        for i in donated:   # consumed, whatever XLA would do with the buffer
            for leaf in (jax.tree_util.tree_leaves(args[i]) if i < len(args) else ()):
                if isinstance(leaf, Array):
                    leaf.delete()
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), res)

    wrapped.__name__ = getattr(f, "__name__", "jit")
    wrapped.__wrapped__ = f
    return wrapped


def _donate_argnums(donate_argnums) -> tuple:
    """`donate_argnums` as a tuple of non-negative ints; TypeError / ValueError naming the value otherwise."""
    nums = (donate_argnums,) if isinstance(donate_argnums, int) else donate_argnums
    try:
        nums = tuple(nums)
    except TypeError:
        raise TypeError(f"donate_argnums={donate_argnums!r} must be an int or a sequence of ints, as for "
                        "jax.jit.") from None
    for n in nums:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"donate_argnums contains {n!r}; pass the positions of the donated arguments as ints.")
        if n < 0:
            raise ValueError(f"donate_argnums contains {n}; pass non-negative argument positions.")
    return tuple(int(n) for n in nums)


def _out_placements(closed, out_shardings, out_shape, mesh) -> list:
    n = len(closed.jaxpr.outvars)
    if out_shardings is not None:
        user = (_broadcast_prefix(out_shardings, out_shape) if not _is_sharding(out_shardings)
                else [out_shardings] * n)
    else:
        user = [None] * n
    traced = [None] * n
    eqns = closed.jaxpr.eqns
    if len(eqns) == 1 and eqns[0].primitive.name == "jit" and list(eqns[0].outvars) == list(closed.jaxpr.outvars):
        traced = list(eqns[0].params.get("out_shardings", traced))
    out = []
    for i, aval in enumerate(closed.out_avals):
        s = user[i]
        if s is None and mesh is not None:
            spec = _spec_of(traced[i]) or _spec_of(getattr(aval, "sharding", None))
            s = NamedSharding(mesh, spec if spec is not None else PartitionSpec())
        out.append(s if s is not None else SingleDeviceSharding(0))
    return out


def _spec_of(jax_sharding):
    """The refsim spec of a traced output sharding; None when it states nothing (all None, no
    unreduced/reduced axes). Reads `.partitions`: a JAX spec with unreduced axes refuses `iter`."""
    spec = getattr(jax_sharding, "spec", None)
    if spec is None:
        return None
    spec = S.as_refsim_spec(spec)
    if not any(p is not None for p in spec) and not spec.unreduced and not spec.reduced:
        return None
    return spec


# --- low level -------------------------------------------------------------------------------------

def eval_jaxpr(closed_jaxpr, *args, mesh=None, fallback: bool = False, probe=None) -> list:
    """Evaluate a ClosedJaxpr with refsim's rules; returns a list of ndarrays.

    With `mesh=None` the jaxpr is a global-view program and `args` are global arrays. With a
    mesh, the jaxpr is a manual-region body (such as a shard_map's) and each arg is stacked
    per device: shape `mesh.axis_sizes + local_shape`, size 1 along axes it is invariant over;
    outputs come back stacked the same way. `probe(eqn, invals, outvals)` is called after every
    equation (the debugger's hook).
    """
    load_rules()
    extra = _new_extra(fallback, False, probe)
    if mesh is None:
        ctx = Context(extra=extra)
        args = [_global(a) for a in args]
    else:
        if not isinstance(mesh, AbstractMesh):
            mesh = Mesh.from_jax(mesh)
        ctx = Context(nm=mesh.ndim, mesh=mesh, extra=extra)
        args = [np.asarray(a) for a in args]
        for i, a in enumerate(args):
            if a.ndim < mesh.ndim or any(d not in (1, s) for d, s in zip(a.shape, mesh.axis_sizes)):
                raise ValueError(
                    f"eval_jaxpr arg {i} has shape {a.shape}; with mesh={mesh!r} every arg must start with "
                    f"the mesh dims {mesh.axis_sizes} (1 where invariant), followed by its local shape."
                )
    if hasattr(closed_jaxpr, "consts"):
        return core.eval_closed_jaxpr(closed_jaxpr, *args, ctx=ctx)
    return core.eval_jaxpr(closed_jaxpr, (), *args, ctx=ctx)
