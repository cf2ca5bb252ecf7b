"""The program entry points on real XLA: shard_map, pmap, jit and device_put.

Each takes the same arguments as its refsim twin, runs the unmodified function with
JAX on the devices the refsim mesh/sharding names (by device id), and returns
refsim.Array values whose shards were copied off each device. Compiled executables
are cached by (function, mesh, specs, input avals), see `xla_backend.cache`.
"""
from __future__ import annotations

import contextlib
import functools

from refsim import device_assignment
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from xla_backend import cache, convert, meshes, placement, provenance


def shard_map(f, *, mesh, in_specs, out_specs, check_vma=True, axis_names=..., eager=False,
              hlo=False):
    """Run `jax.jit(jax.shard_map(f, ...))` (or eager `jax.shard_map`) on `jax_mesh(mesh)`.

    Arguments are global values (NumPy, refsim.Array, jax.Array) laid out by
    ``NamedSharding(mesh, in_spec)``; `axis_names` (default: every mesh axis) are the
    manual axes, as in `jax.shard_map`. Under jit, outputs are pinned to
    ``NamedSharding(mesh, out_spec)`` (replicated over axes outside a partial `axis_names`,
    as refsim lays them out). `hlo=True` records the compiled HLO in ``info``.
    """
    import jax

    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"mesh must be a refsim.Mesh, got {type(mesh).__name__}; build one with "
            "xla_backend.mesh(shape, names) or refsim.Mesh.from_jax(jax_mesh)."
        )
    jmesh = meshes.jax_mesh(mesh)
    kw = {} if axis_names is ... or axis_names is None else {"axis_names": frozenset(axis_names)}
    j_in = jax.tree_util.tree_map(placement.spec_to_jax, in_specs, is_leaf=placement.is_spec)
    j_out = jax.tree_util.tree_map(placement.spec_to_jax, out_specs, is_leaf=placement.is_spec)
    smapped = jax.shard_map(f, mesh=jmesh, in_specs=j_in, out_specs=j_out, check_vma=check_vma, **kw)
    # Pinned so that the layout over axes outside `axis_names` is NamedSharding(mesh, out_spec),
    # as refsim places it, not whatever XLA's partitioner picks for a partially manual region.
    pinned = jax.tree_util.tree_map(
        lambda s: None if s is None else jax.sharding.NamedSharding(jmesh, s), j_out,
        is_leaf=placement.is_spec)
    static = ("shard_map", f, mesh, placement.tree_key(in_specs, placement.is_spec),
              placement.tree_key(out_specs, placement.is_spec), check_vma, kw.get("axis_names"))

    @functools.wraps(f)
    def call(*args):
        leaf_specs = placement.broadcast_prefix(in_specs, args, placement.is_spec, "in_specs")
        leaves, treedef = jax.tree_util.tree_flatten(args)
        # A committed argument on other devices is an error under jax.jit(shard_map), not a move.
        device_assignment.check_call(f, args, leaves, uses=[
            device_assignment.Use("inside", device_assignment.assignment(mesh), eqn="shard_map")])
        jleaves = [placement.to_device(x, placement.named(mesh, s)) for x, s in zip(leaves, leaf_specs)]
        jargs = jax.tree_util.tree_unflatten(treedef, jleaves)
        # Under set_mesh, as a JAX user would run it, so the body may read the context mesh.
        with _mesh_context(mesh):
            if eager:
                outs = cache.timed_run(smapped, *jargs)
                info = provenance.info(hlo=hlo, mode="eager_shard_map")
            else:
                key = static + (placement.avals_key(jleaves),)
                exe, hit = cache.compiled(
                    key, lambda: jax.jit(smapped, out_shardings=pinned).lower(*jargs).compile())
                outs = cache.timed_run(exe, *jargs)
                info = provenance.info(compiled=exe, hlo=hlo, mode="jit_shard_map", cache_hit=hit)
        return placement.results(outs, info)

    return call


def pmap(f, axis_name=None, *, in_axes=0, out_axes=0, axis_size=None, devices=None,
         static_broadcasted_argnums=(), hlo=False):
    """Run `jax.pmap(f, ...)` over `devices` (refsim/JAX device ids or JAX devices).

    Arguments are global NumPy values (a refsim.Array is read as its global value);
    results keep the layout JAX gives pmap outputs, copied off each device.
    """
    import jax

    jdevs = None
    if devices is not None:
        ids = [d.id if hasattr(d, "id") else int(d) for d in devices]
        jdevs = meshes.jax_devices(ids).tolist()
    pmapped = jax.pmap(f, axis_name, in_axes=in_axes, out_axes=out_axes, axis_size=axis_size,
                       devices=jdevs, static_broadcasted_argnums=static_broadcasted_argnums)
    static = ("pmap", f, axis_name, repr(in_axes), repr(out_axes), axis_size,
              None if jdevs is None else tuple(d.id for d in jdevs), static_broadcasted_argnums)

    @functools.wraps(f)
    def call(*args):
        leaves, treedef = jax.tree_util.tree_flatten(args)
        leaves = [x if isinstance(x, jax.Array) else placement.canonical_numpy(x) for x in leaves]
        pargs = jax.tree_util.tree_unflatten(treedef, leaves)
        key = static + (tuple((tuple(x.shape), str(x.dtype)) for x in leaves),)
        exe, hit = cache.compiled(key, lambda: pmapped.lower(*pargs).compile())
        outs = cache.timed_run(exe, *pargs)
        info = provenance.info(compiled=exe, hlo=hlo, mode="pmap", cache_hit=hit)
        return placement.results(outs, info)

    return call


def _context_mesh(*sharding_trees):
    """The one concrete refsim mesh named by the shardings (None if none or several)."""
    import jax

    found = set()
    for tree in sharding_trees:
        for s in jax.tree_util.tree_leaves(tree, is_leaf=placement.is_sharding):
            if isinstance(s, NamedSharding) and isinstance(s.mesh, Mesh):
                found.add(s.mesh)
    return found.pop() if len(found) == 1 else None


def jit(f, in_shardings=None, out_shardings=None, *, static_argnums=(), hlo=False):
    """Run `jax.jit(f, in_shardings=..., out_shardings=...)` with refsim shardings converted.

    When all NamedShardings share one mesh, the program runs under `jax.set_mesh` of it,
    so `with_sharding_constraint(x, P(...))`, `reshard` and explicit-sharding types work.
    """
    import jax

    to_j = lambda t: jax.tree_util.tree_map(convert.to_jax_sharding, t, is_leaf=placement.is_sharding)
    j_in, j_out = to_j(in_shardings), to_j(out_shardings)
    kw = {}
    if in_shardings is not None:
        kw["in_shardings"] = j_in
    if out_shardings is not None:
        kw["out_shardings"] = j_out
    jitted = jax.jit(f, static_argnums=static_argnums, **kw)
    ctx_mesh = _context_mesh(in_shardings, out_shardings)
    static = ("jit", f, placement.tree_key(in_shardings, placement.is_sharding),
              placement.tree_key(out_shardings, placement.is_sharding), static_argnums)

    @functools.wraps(f)
    def call(*args):
        static_args = {i: a for i, a in enumerate(args) if i in _as_tuple(static_argnums)}
        dyn = tuple(a for i, a in enumerate(args) if i not in static_args)
        if in_shardings is None:
            shardings = [None] * len(jax.tree_util.tree_leaves(dyn))
        else:
            shardings = placement.broadcast_prefix(in_shardings, dyn, placement.is_sharding,
                                                   "in_shardings")
        leaves, treedef = jax.tree_util.tree_flatten(dyn)
        jleaves = [placement.to_device(x, s) for x, s in zip(leaves, shardings)]
        jdyn = iter(jax.tree_util.tree_unflatten(treedef, jleaves))
        jargs = [static_args[i] if i in static_args else next(jdyn) for i in range(len(args))]
        key = static + (tuple(sorted(static_args.items(), key=lambda kv: kv[0])),
                        placement.avals_key(jleaves))
        with _mesh_context(ctx_mesh):
            exe, hit = cache.compiled(key, lambda: jitted.lower(*jargs).compile())
            outs = cache.timed_run(exe, *_dynamic_args(jargs, static_args))
        info = provenance.info(compiled=exe, hlo=hlo, mode="jit", cache_hit=hit)
        return placement.results(outs, info)

    return call


def _dynamic_args(jargs, static_args):
    # A Compiled executable takes only the dynamic arguments.
    return [a for i, a in enumerate(jargs) if i not in static_args]


def _as_tuple(x):
    return (x,) if isinstance(x, int) else tuple(x)


def _mesh_context(mesh):
    import jax

    if mesh is None:
        return contextlib.nullcontext()
    return jax.set_mesh(meshes.jax_mesh(mesh))


def device_put(x, sharding):
    """`jax.device_put(x, sharding)` on real devices: a layout or reshard (also onto another
    mesh or device order), returned as a refsim.Array copied off each device.

    A refsim.Array source is first placed by its own sharding, device by device, so the
    transfer XLA performs is the reshard itself.
    """
    import jax

    jsh = convert.to_jax_sharding(sharding)
    src = placement.to_device(x, None if placement.keeps_layout(x) else jsh)
    out = cache.timed_run(jax.device_put, src, jsh)
    return placement.results(out, provenance.info(mode="device_put"))
