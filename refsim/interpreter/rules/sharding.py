"""Manual regions and sharding annotations: `shard_map`, `sharding_constraint`, `reshard`, ...

Entering a `shard_map` splits each operand by its in_spec into mesh-major stacked
blocks (`mesh.axis_sizes + block shape`; a mesh dim stays size 1 where the value
is invariant, JAX's vma type); leaving it tiles the blocks back by out_specs, as
`jax.shard_map`'s docstring states ("out_specs ... how the outputs are
concatenated"). Devices along a manual axis that out_specs leaves unnamed claim to
hold the same value; `check_replicated` verifies that claim device by device.

Outside manual regions values are global arrays, so annotations that only move
data between devices (`sharding_constraint`, `reshard`, `device_put`,
`layout_constraint`, `mesh_cast`) are the identity on the value.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from refsim import compat
from refsim.errors import ReplicationError
from refsim.interpreter import core
from refsim.interpreter.registry import Context, register
from refsim.interpreter.unreduced import Partials, from_plain
from refsim.layouts.mesh import AbstractMesh
from refsim.layouts.stacking import replica_mismatch
from refsim.layouts.partition_spec import UNCONSTRAINED, PartitionSpec


def as_refsim_spec(spec) -> PartitionSpec:
    """A refsim PartitionSpec from a JAX or refsim spec (or a plain tuple)."""
    if isinstance(spec, PartitionSpec):
        return spec
    if compat.is_jax_partition_spec(spec):
        return PartitionSpec.from_jax(spec)
    return PartitionSpec(*tuple(spec))


def as_refsim_mesh(mesh) -> AbstractMesh:
    """A refsim (Abstract)Mesh with the names, sizes and axis types of a JAX or refsim mesh."""
    if isinstance(mesh, AbstractMesh):
        return mesh
    types = getattr(mesh, "axis_types", None)
    sizes = tuple(getattr(mesh, "axis_sizes", None) or tuple(mesh.shape.values()))
    return AbstractMesh(sizes, tuple(mesh.axis_names), axis_types=types)


def _mesh_for(ctx: Context, param_mesh) -> AbstractMesh:
    """The mesh a nested region runs on: the enclosing region's one when it is the same mesh."""
    pm = as_refsim_mesh(param_mesh)
    if ctx.mesh is not None and (ctx.mesh.axis_names, ctx.mesh.axis_sizes) == (pm.axis_names, pm.axis_sizes):
        return ctx.mesh
    if ctx.nm:
        raise ValueError(
            f"shard_map over mesh {pm!r} inside a manual region over a different mesh {ctx.mesh!r}; "
            "nested shard_maps must use the enclosing mesh (jax.sharding.get_abstract_mesh())."
        )
    return pm


# --- the layout moves: split by in_specs, tile by out_specs ------------------------------

def split_by_spec(x: np.ndarray, mesh: AbstractMesh, spec) -> np.ndarray:
    """Cut each local dim of stacked `x` into blocks along the mesh axes `spec` names.

    `x` has `mesh.ndim` leading mesh dims; those of the axes `spec` names must be
    size 1 (the value is not yet split over them). Block ``b`` of dim ``d`` goes to
    the device whose linear index over ``spec[d]``'s axes (major to minor) is ``b``,
    as `NamedSharding` places blocks. Returns a view where NumPy allows one.
    """
    spec = as_refsim_spec(spec)
    nm = mesh.ndim
    local = x.shape[nm:]
    exp_shape: list[int] = list(x.shape[:nm])
    axis_slot: dict[int, int] = {}
    for d, n in enumerate(local):
        axes = spec.axes_of(d)
        sizes = [mesh.axis_size(a) for a in axes]
        for a, s in zip(axes, sizes):
            k = mesh.axis_index(a)
            if x.shape[k] != 1:
                raise ValueError(
                    f"in_specs entry {spec!r} splits dim {d} over axis {a!r}, but the value is already "
                    f"split over {a!r}; an axis can be made manual once (nest shard_maps over "
                    "different axes)."
                )
            axis_slot[k] = len(exp_shape)
            exp_shape.append(s)
        exp_shape.append(n // math.prod(sizes))  # mesh axis sizes: Python ints
    y = x.reshape(exp_shape)
    lead = [axis_slot.get(k, k) for k in range(nm)]
    rest = [i for i in range(nm, len(exp_shape)) if i not in axis_slot.values()]
    dropped = [k for k in range(nm) if k in axis_slot]
    y = y.transpose(lead + rest + dropped)
    return y.reshape(y.shape[: len(lead) + len(rest)])


def tile_by_spec(y: np.ndarray, mesh: AbstractMesh, spec) -> np.ndarray:
    """Inverse of `split_by_spec`: join blocks along the mesh axes `spec` names into local dims.

    The mesh dims of the named axes become size 1; a size-1 (invariant) mesh dim is
    broadcast first, so an invariant block is tiled as often as the axis is large, as
    `jax.shard_map` concatenates out_specs blocks.
    """
    spec = as_refsim_spec(spec)
    nm = mesh.ndim
    local = y.shape[nm:]
    named = {mesh.axis_index(a) for a in spec.used_axes()}
    if named:
        full = tuple(mesh.axis_sizes[k] if k in named else y.shape[k] for k in range(nm))
        y = np.broadcast_to(y, full + local)
    order = [k for k in range(nm) if k not in named]
    out_local = []
    for d, n in enumerate(local):
        ks = [mesh.axis_index(a) for a in spec.axes_of(d)]
        order.extend(ks)
        order.append(nm + d)
        out_local.append(n * math.prod([mesh.axis_sizes[k] for k in ks]))
    z = y.transpose(order)
    lead = tuple(1 if k in named else y.shape[k] for k in range(nm))
    return z.reshape(lead + tuple(out_local))


def first_replica_mismatch(y: np.ndarray, nm: int, axes_pos: Sequence[int]):
    """First (mesh position a, mesh position b, local index) where devices along `axes_pos` differ.

    Compares every device with the device at position 0 along the given mesh dims
    (NaN equals NaN, as a bitwise replica comparison); None when all agree. See
    `refsim.layouts.stacking.replica_mismatch` (broadcast dims are not compared).
    """
    return replica_mismatch(y, nm, axes_pos)


def replication_error(mesh, what: str, axes: Sequence[str], mismatch) -> ReplicationError:
    """A ReplicationError naming the axis, both devices (ids where the mesh has them) and the index."""
    pos_a, pos_b, index = mismatch
    differing = [n for k, n in enumerate(mesh.axis_names) if pos_a[k] != pos_b[k]]
    ids = getattr(mesh, "device_ids", None)
    dev_a = int(ids[pos_a]) if ids is not None else pos_a
    dev_b = int(ids[pos_b]) if ids is not None else pos_b
    return ReplicationError(
        f"{what} claims the value is replicated over mesh axis {differing[0]!r} (axes {tuple(axes)!r} "
        f"are not named in its spec), but device {dev_a} (mesh position {pos_a}) and device {dev_b} "
        f"(mesh position {pos_b}) differ, first at local index {index}. Name the axis in out_specs, "
        "reduce over it (psum/pmax), or run with check_vma=True to let JAX reject the program."
    )


def check_replicated(y: np.ndarray, mesh, spec, manual_axes, what: str, log: list | None, strict: bool) -> bool:
    """Verify manual axes that `spec` leaves unnamed hold equal values; record or raise a mismatch.

    Returns True when they agree (False when a mismatch was recorded)."""
    spec = as_refsim_spec(spec)
    unnamed = [a for a in mesh.axis_names if a in manual_axes and a not in spec.used_axes()]
    mism = first_replica_mismatch(y, mesh.ndim, [mesh.axis_index(a) for a in unnamed])
    if mism is None:
        return True
    err = replication_error(mesh, what, unnamed, mism)
    if strict:
        raise err
    if log is not None:
        log.append(str(err))
    return False


# --- shard_map ---------------------------------------------------------------------------

def enter_global(x, mesh: AbstractMesh, spec) -> np.ndarray:
    """A global-view value split by `spec` into stacked per-device blocks.

    With `spec.unreduced` each device along those axes gets its own partial sum (the
    `Partials` the value carries; a plain value is put on position 0, zeros elsewhere);
    a `Partials` entering a spec without its axes is summed first (the all-reduce).
    """
    ur = as_refsim_spec(spec).unreduced
    if isinstance(x, Partials) and x.axes == ur:
        x = x.parts
    elif ur:
        x = from_plain(x.total() if isinstance(x, Partials) else x, mesh, ur).parts
    else:
        x = np.asarray(x.total() if isinstance(x, Partials) else x)
        x = x.reshape((1,) * mesh.ndim + x.shape)
    return split_by_spec(x, mesh, spec)


def run_manual_region(ctx: Context, mesh: AbstractMesh, jaxpr, in_specs, args: Sequence[np.ndarray]) -> list:
    """Split stacked `args` by `in_specs` and run the body `jaxpr` with one mesh dim per axis."""
    nm = mesh.ndim
    stacked = []
    for x, spec in zip(args, in_specs):
        if ctx.nm == 0:
            stacked.append(enter_global(x, mesh, spec))
        else:
            stacked.append(split_by_spec(np.asarray(x), mesh, spec))
    inner = Context(nm=nm, mesh=mesh, extra=ctx.extra)
    return core.eval_jaxpr(jaxpr, (), *stacked, ctx=inner)


def leave_manual_region(ctx: Context, mesh: AbstractMesh, outs, out_specs, manual_axes) -> list:
    """Tile body outputs by `out_specs`; check and collapse replicated manual axes."""
    res = []
    for y, spec in zip(outs, out_specs):
        kind = compat.unreduced_kind_of(spec)   # jax 0.12's unreduced_kind (refsim's specs drop it)
        spec = as_refsim_spec(spec)
        # Devices along an unreduced axis hold partial sums: not replicas, nothing to check.
        replica_axes = frozenset(manual_axes) - spec.unreduced
        check_replicated(y, mesh, spec, replica_axes, "shard_map out_specs " + repr(spec),
                         ctx.extra.setdefault("replication", []), bool(ctx.extra.get("strict")))
        # Along an unnamed manual axis every device is a replica; outside the region the
        # value is one array again, so keep position 0 (checked above).
        unnamed = [mesh.axis_index(a) for a in replica_axes if a not in spec.used_axes()]
        y = y[tuple(slice(0, 1) if k in unnamed else slice(None) for k in range(y.ndim))]
        z = tile_by_spec(y, mesh, spec)
        if ctx.nm == 0 and spec.unreduced:
            res.append(Partials(z, mesh, spec.unreduced, kind))
            continue
        if ctx.nm == 0:
            z = z.reshape(z.shape[mesh.ndim:])
        res.append(np.ascontiguousarray(z) if not z.flags.c_contiguous and z.size < 1 << 16 else z)
    return res


@register("shard_map")
def _shard_map(ctx, *args, jaxpr, mesh, in_specs, out_specs, check_vma=True, **params):
    """`jax.shard_map`: split by in_specs, run the body per device (stacked), tile by out_specs."""
    rmesh = _mesh_for(ctx, mesh)
    manual = compat.shard_map_manual_axes(dict(params, mesh=mesh))
    body = getattr(jaxpr, "jaxpr", jaxpr)
    consts = getattr(jaxpr, "consts", ())
    if consts:
        raise TypeError("shard_map body jaxpr must be closed over no constants (JAX hoists them).")
    outs = run_manual_region(ctx, rmesh, body, in_specs, args)
    return leave_manual_region(ctx, rmesh, outs, out_specs, manual)


# --- annotations that do not change values ---------------------------------------------

def _identity(ctx, x, **params):
    return x


@register("sharding_constraint")
def _sharding_constraint(ctx, x, *, sharding, context_mesh=None, **params):
    """`with_sharding_constraint`: the identity on values. Inside a manual region its spec may
    name only non-manual axes: JAX's lowering (`mlir.add_manual_axes`) raises ValueError for
    a spec naming a manual axis, and so does refsim, with the same message."""
    manual = _manual_axes_of(context_mesh)
    spec = getattr(sharding, "spec", None)
    if manual and spec is not None:
        named = [a for p in as_refsim_spec(spec) if p is not None and p is not UNCONSTRAINED
                 for a in (p if isinstance(p, tuple) else (p,))]
        if any(a in manual for a in named):
            raise ValueError(
                f"pspec {spec} contains a manual axes {tuple(sorted(manual))} of mesh which is not "
                "allowed. If you are using a with_sharding_constraint under a shard_map, only use the "
                "mesh axis in PartitionSpec which are not manual.")
    return x


def _manual_axes_of(mesh) -> frozenset:
    types = getattr(mesh, "axis_types", None) or ()
    names = getattr(mesh, "axis_names", None) or ()
    return frozenset(n for n, t in zip(names, types) if getattr(t, "name", str(t)) == "Manual")
register("reshard")(_identity)
register("layout_constraint")(_identity)
register("relayout")(_identity)
register("mesh_cast")(_identity)


@register("device_put")
def _device_put(ctx, *xs, **params):
    """`jax.device_put` inside a traced program: moves data, keeps every value (multiple results)."""
    return list(xs)


@register("shard_alike")
def _shard_alike(ctx, x, y):
    """`shard_alike`: both operands unchanged (it only ties their shardings together)."""
    return [x, y]
