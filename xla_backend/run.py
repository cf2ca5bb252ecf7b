"""The program entry points on real XLA: shard_map, pmap, jit and device_put.

Each takes the same arguments as its refsim twin, runs the unmodified function with
JAX on the devices the refsim mesh/sharding names (by device id), and returns
refsim.Array values whose shards were copied off each device. Compiled executables
are cached by (function, mesh, specs, input avals), see `xla_backend.cache`.
"""
from __future__ import annotations

import functools

from refsim import device_assignment
from refsim.layouts.mesh import Mesh
from xla_backend import cache, convert, placement, provenance, staging


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
    layout = staging.Layout.shard_map(mesh, in_specs, out_specs, check_vma=check_vma,
                                      axis_names=None if axis_names is ... else axis_names)
    wrapped = staging.wrap(f, layout)
    static = ("shard_map", f, mesh, staging.tree_key(in_specs, staging.is_spec),
              staging.tree_key(out_specs, staging.is_spec), check_vma, layout.axis_names)

    @functools.wraps(f)
    def call(*args):
        leaf_specs = wrapped.leaf_shardings(args)
        # A committed argument on other devices is an error under jax.jit(shard_map), not a move.
        device_assignment.check_call(f, args, jax.tree_util.tree_leaves(args), uses=[
            device_assignment.Use("inside", device_assignment.assignment(mesh), eqn="shard_map")])
        staged = wrapped.place(args, leaf_specs)
        # Under set_mesh, as a JAX user would run it, so the body may read the context mesh.
        with staged.context():
            if eager:
                outs = cache.timed_run(staged.fn, *staged.args)
                info = provenance.info(hlo=hlo, mode="eager_shard_map")
            else:
                key = static + (placement.avals_key(staged.flat_args),)
                exe, hit = cache.compiled(key, lambda: staged.lower().compile(), staged.fresh_compile)
                outs = cache.timed_run(exe, *staged.args)
                info = provenance.info(compiled=exe, hlo=hlo, mode="jit_shard_map", cache_hit=hit)
        return placement.results(outs, info)

    return call


def pmap(f, axis_name=None, *, in_axes=0, out_axes=0, axis_size=None, devices=None,
         static_broadcasted_argnums=(), hlo=False):
    """Run `jax.pmap(f, ...)` over `devices` (refsim/JAX device ids or JAX devices).

    Arguments are global NumPy values (a refsim.Array is read as its global value);
    results keep the layout JAX gives pmap outputs, copied off each device.
    """
    layout = staging.Layout.pmap(axis_name, in_axes=in_axes, out_axes=out_axes, axis_size=axis_size,
                                 devices=devices, static_broadcasted_argnums=static_broadcasted_argnums)
    wrapped = staging.wrap(f, layout)
    static = ("pmap", f, axis_name, repr(in_axes), repr(out_axes), axis_size, layout.devices,
              static_broadcasted_argnums)

    @functools.wraps(f)
    def call(*args):
        staged = wrapped.place(args)
        key = static + (tuple((tuple(x.shape), str(x.dtype)) for x in staged.flat_args),)
        exe, hit = cache.compiled(key, lambda: staged.lower().compile(), staged.fresh_compile)
        outs = cache.timed_run(exe, *staged.args)
        info = provenance.info(compiled=exe, hlo=hlo, mode="pmap", cache_hit=hit)
        return placement.results(outs, info)

    return call


def jit(f, in_shardings=None, out_shardings=None, *, static_argnums=(), donate_argnums=(), hlo=False):
    """Run `jax.jit(f, in_shardings=..., out_shardings=...)` with refsim shardings converted.

    `donate_argnums`: as `jax.jit`'s: the placed arguments are donated (XLA may write outputs into
    their buffers). A NumPy argument is placed afresh for each call, so only that copy is consumed.

    When all NamedShardings share one mesh, the program runs under `jax.set_mesh` of it,
    so `with_sharding_constraint(x, P(...))`, `reshard` and explicit-sharding types work.
    """
    layout = staging.Layout.jit(in_shardings, out_shardings, static_argnums=static_argnums,
                                donate_argnums=donate_argnums)
    wrapped = staging.wrap(f, layout)
    static = ("jit", f, staging.tree_key(in_shardings, staging.is_sharding),
              staging.tree_key(out_shardings, staging.is_sharding), static_argnums, layout.donate_argnums)

    @functools.wraps(f)
    def call(*args):
        staged = wrapped.place(args)
        static_args = {i: args[i] for i in layout.static_argnums if i < len(args)}
        key = static + (tuple(sorted(static_args.items(), key=lambda kv: kv[0])),
                        placement.avals_key(staged.flat_args))
        with staged.context():
            exe, hit = cache.compiled(key, lambda: staged.lower().compile(), staged.fresh_compile)
            outs = cache.timed_run(exe, *staged.dynamic_args)
        info = provenance.info(compiled=exe, hlo=hlo, mode="jit", cache_hit=hit)
        return placement.results(outs, info)

    return call


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
