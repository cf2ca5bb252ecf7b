"""Unreduced values in the global view: per-device partial sums, kept as such end to end.

JAX's sharding-in-types lets a global (jit-level) value be *unreduced* over Explicit mesh
axes (`P(unreduced={'x'})`): each device along those axes holds a partial sum and the
logical value is their sum (`jax._src.core.getu`). `dot_general` / `reduce_sum` with such
an `out_sharding` produce one from operands sharded along the contracted / summed
dimensions; linear ops (`add` of two unreduced values, `mul` by a reduced one, reshape,
transpose, slicing, concatenate, convert_element_type, ...) keep it unreduced; a `reshard`
or `sharding_constraint` to a spec without those axes sums it (an all-reduce); a
`shard_map` with `in_specs=P(unreduced=...)` hands each device its own partial sum.

refsim holds such a value as `Partials`: the stacked partial sums (`mesh.axis_sizes +
global shape`, size 1 along every axis it is not unreduced over), so a `psum` inside the
`shard_map` sees exactly the per-device values XLA does. The equation loop calls
`apply` for every global-view equation that reads or produces one.
"""
from __future__ import annotations

import numpy as np

from refsim import compat
from refsim.collectives import reductions as _red
from refsim.errors import UnsupportedUnreducedKind
from refsim.interpreter.registry import Context
from refsim.layouts.partition_spec import PartitionSpec
from refsim.layouts.unreduced import held_mask, partial_sums

# Equations whose outputs are not unreduced but whose operand is: JAX's all-reduce of the
# partial sums (`reshard` / `sharding_constraint` to a reduced-free spec), or a move.
# Loops and cond too: a scan / while carry, a cond operand (or scan xs / ys) unreduced over the same axes on every
# iteration stays `Partials`, and the body's own equations combine the partial sums.
_SUBJAXPR = {"jit", "pjit", "closed_call", "core_call", "remat2", "checkpoint", "custom_jvp_call",
             "custom_vjp_call", "custom_vjp_call_jaxpr", "shard_map", "scan", "while", "cond"}


class Partials:
    """A global-view value unreduced over `axes` of `mesh`: the logical value is the sum
    over those mesh axes of `parts` (shape `mesh.axis_sizes + global shape`, size 1 along
    the mesh axes not in `axes`); with `kind` "max" / "min" (jax 0.12's `unreduced_kind`)
    their maximum / minimum."""

    __slots__ = ("parts", "mesh", "axes", "kind")

    def __init__(self, parts: np.ndarray, mesh, axes, kind: str = "sum"):
        self.parts, self.mesh, self.axes, self.kind = parts, mesh, frozenset(axes), kind

    @property
    def shape(self) -> tuple:
        return self.parts.shape[self.mesh.ndim:]

    @property
    def dtype(self):
        return self.parts.dtype

    def total(self) -> np.ndarray:
        """The logical value: the partial values combined in ascending device position (an
        all-reduce by `kind`)."""
        axes = tuple(a for a in self.mesh.axis_names if a in self.axes)
        summed = _red.all_reduce(self.parts, mesh=self.mesh, axes=axes, op=self.kind, api="unreduced_" + self.kind)
        return summed.reshape(summed.shape[self.mesh.ndim:])

    def __repr__(self):
        kind = "" if self.kind == "sum" else f" ({self.kind})"
        return f"Partials(shape={self.shape}, dtype={self.dtype}, unreduced over {sorted(self.axes)}{kind})"


def out_unreduced(aval) -> frozenset:
    """The mesh axes a global-view aval is unreduced over (empty for Auto meshes).

    UnsupportedUnreducedKind for partial values combined other than by sum, max or min."""
    sharding = getattr(aval, "sharding", None)
    spec = getattr(sharding, "spec", None)
    axes = frozenset(getattr(spec, "unreduced", ()) or ())
    if axes and compat.unreduced_kind_of(spec) not in ("sum", "max", "min"):
        raise UnsupportedUnreducedKind(
            f"a value unreduced over {sorted(axes)} with unreduced_kind={compat.unreduced_kind_of(spec)} "
            f"({aval}): refsim models partial sums only; reduce it (jax.lax.unreduced_pmax / pmin or a "
            "reshard) before it leaves the program, or check it with fallback=True.")
    return axes


def kind_of(aval_or_spec) -> str:
    """How the partial values of an unreduced aval (or JAX spec) combine: "sum", "max", "min"."""
    spec = getattr(getattr(aval_or_spec, "sharding", None), "spec", aval_or_spec)
    return compat.unreduced_kind_of(spec)


def _mesh_of(aval):
    from refsim.interpreter.rules.sharding import as_refsim_mesh

    return as_refsim_mesh(aval.sharding.mesh)


def lift(x, mesh) -> np.ndarray:
    """A plain (replicated or reduced) global value as stacked parts: the same on every device."""
    if isinstance(x, Partials):
        return x.parts
    x = np.asarray(x)
    return x.reshape((1,) * mesh.ndim + x.shape)


def from_plain(x, mesh, axes) -> Partials:
    """A plain value entering an unreduced layout: device 0 of every group holds it, the others zero.

    This is one valid decomposition (its sum is the value); refsim uses it only where no
    producer states the partial sums, e.g. a NumPy argument given for an unreduced in_spec.
    """
    x = np.asarray(x)
    shape = tuple(mesh.axis_size(a) if a in axes else 1 for a in mesh.axis_names)
    parts = np.zeros(shape + x.shape, x.dtype)
    parts[(0,) * mesh.ndim] = x
    return Partials(parts, mesh, axes)


def unreduced_axes_of(x) -> frozenset:
    """The mesh axes a laid-out value (refsim.Array, jax.Array) is unreduced over; empty if none."""
    spec = getattr(getattr(x, "sharding", None), "spec", None)
    return frozenset(getattr(spec, "unreduced", ()) or ())


def from_array(arr, kind: str = "sum") -> Partials:
    """The `Partials` of a refsim.Array laid out by a NamedSharding with unreduced axes: device
    p's block is its own partial sum (as `jax.Array` shards of an unreduced sharding hold it),
    tiled back into one partial global value per position along the unreduced axes
    (`refsim.layouts.unreduced.partial_sums`; replicas along the other axes must agree).
    `kind`: how they combine (refsim's specs do not carry jax 0.12's `unreduced_kind`)."""
    sharding = arr.sharding
    parts = partial_sums(np.asarray(arr.to_stacked(sharding.mesh)), sharding.mesh, sharding.spec)
    return Partials(parts, sharding.mesh, sharding.spec.unreduced, kind)


def to_unreduced(x, src_spec, mesh, axes, target=None, kind: str = "sum") -> Partials:
    """`x` (a plain global value laid out by `src_spec`, or `Partials`) made unreduced over
    `axes`, with the per-device partial sums JAX's reshard gives: partial sums over axes the
    target keeps stay as they are, axes it drops are summed (an all-reduce), and over new axes
    each element goes to the one device `held_mask` names (for a layout cut by `target`),
    zeros to the others. Partial values combined by max / min (`kind`) are the value itself on
    every device along new axes (max(v, v) = v)."""
    axes = frozenset(axes)
    if isinstance(x, Partials):
        if x.axes == axes and x.kind == kind:
            return x
        if x.kind != kind:                      # combined by another rule: reduce it first
            x = x.total()
    if isinstance(x, Partials):
        parts, have = x.parts, x.axes
        drop = tuple(a for a in mesh.axis_names if a in have - axes)
        if drop:
            parts = _red.all_reduce(parts, mesh=mesh, axes=drop, op=kind, api="unreduced_" + kind)
            parts = parts[tuple(slice(0, 1) if n in drop else slice(None) for n in mesh.axis_names)]
        new = axes - have
    else:
        parts, new = lift(x, mesh), axes
    if new and kind == "sum":
        mask = held_mask(parts.shape[mesh.ndim:], src_spec, mesh, new, target)
        parts = np.where(mask, parts, np.zeros((), parts.dtype))
    return Partials(parts, mesh, axes, kind)


def _split_spec(spec, dims, axes, ndim: int) -> PartitionSpec:
    """A spec naming, for each dim in `dims`, only the mesh axes of `axes` its entry shards it over."""
    entries = [None] * ndim
    parts = tuple(getattr(spec, "partitions", spec)) if spec is not None else ()
    for d in dims:
        entry = parts[d] if d < len(parts) else None
        names = entry if isinstance(entry, tuple) else (() if entry is None else (entry,))
        kept = tuple(n for n in names if n in axes)
        entries[d] = kept if len(kept) > 1 else (kept[0] if kept else None)
    return PartitionSpec(*entries)


def _split(x, aval, dims, axes, mesh) -> np.ndarray:
    """Operand `x` cut into the blocks of `dims` its sharding puts on each device along `axes`
    (a `Partials` operand keeps its partial sums along its own axes)."""
    from refsim.interpreter.rules.sharding import split_by_spec

    spec = getattr(getattr(aval, "sharding", None), "spec", None)
    stacked = lift(x, mesh)
    return split_by_spec(stacked, mesh, _split_spec(spec, dims, axes, stacked.ndim - mesh.ndim))


def _produce(ctx, eqn, invals, rule, axes, mesh):
    """dot_general / reduce_sum into a layout unreduced over `axes` (beyond the operands' own
    unreduced axes): each device reduces its own block of the contracted / summed dims."""
    name = eqn.primitive.name
    inner = Context(nm=mesh.ndim, mesh=mesh, extra=ctx.extra)
    if name == "dot_general":
        (lc, rc), _ = eqn.params["dimension_numbers"]
        lhs = _split(invals[0], eqn.invars[0].aval, lc, axes, mesh)
        rhs = _split(invals[1], eqn.invars[1].aval, rc, axes, mesh)
        return rule(inner, lhs, rhs, **eqn.params)
    x = _split(invals[0], eqn.invars[0].aval, eqn.params["axes"], axes, mesh)
    return rule(inner, x, **eqn.params)


# The reductions that produce partial values of each kind from operands sharded along the reduced dims.
_PRODUCERS = {"sum": ("dot_general", "reduce_sum"), "max": ("reduce_max",), "min": ("reduce_min",)}

# Equations that only move data: into an unreduced layout they keep on each device what it holds.
_MOVES = {"reshard", "sharding_constraint", "mesh_cast", "device_put"}


def _move(eqn, invals, ur):
    """A reshard-like equation with an unreduced output: JAX's decomposition (`to_unreduced`)."""
    res = []
    for x, var, out, axes in zip(invals, eqn.invars, eqn.outvars, ur):
        if axes:
            src = getattr(getattr(getattr(var, "aval", None), "sharding", None), "spec", None)
            res.append(to_unreduced(x, src, _mesh_of(out.aval), axes, out.aval.sharding.spec, kind_of(out.aval)))
        else:
            res.append(x.total() if isinstance(x, Partials) else x)
    return res if eqn.primitive.multiple_results else res[0]


def apply(ctx, eqn, invals, rule):
    """Evaluate a global-view equation that reads or produces unreduced values; None if neither.

    Returns the rule's outputs with every unreduced output as `Partials`.
    """
    has_partials = any(isinstance(v, Partials) for v in invals)
    ur = [out_unreduced(v.aval) for v in eqn.outvars]
    if not has_partials and not any(ur):
        return None
    name = eqn.primitive.name
    if name in _SUBJAXPR:
        return None  # the sub-jaxpr's own equations see the Partials
    multiple = eqn.primitive.multiple_results
    if name in _MOVES and any(ur):
        return _move(eqn, invals, ur)
    if not has_partials:
        kind = kind_of(eqn.outvars[0].aval)
        if name in _PRODUCERS[kind]:
            mesh = _mesh_of(eqn.outvars[0].aval)
            out = _produce(ctx, eqn, invals, rule, ur[0], mesh)
            return Partials(out, mesh, ur[0], kind)
        return None
    mesh = next(v.mesh for v in invals if isinstance(v, Partials))
    kind = next(v.kind for v in invals if isinstance(v, Partials))
    summed = frozenset().union(*(v.axes for v in invals if isinstance(v, Partials)))
    if name in _PRODUCERS[kind] and ur[0] - summed:
        # partial values over the operands' axes, and over the axes the contracted / reduced
        # dims are sharded over: each device reduces its own block of its own partial value
        out = Partials(_produce(ctx, eqn, invals, rule, ur[0] - summed, mesh), mesh, ur[0] | summed, kind)
        return to_unreduced(out, None, mesh, ur[0], kind=kind)  # axes the output type drops are all-reduced
    inner = Context(nm=mesh.ndim, mesh=mesh, extra=ctx.extra)
    outs = rule(inner, *[lift(v, mesh) for v in invals], **eqn.params)
    outs = list(outs) if multiple else [outs]
    res = []
    for o, axes, var in zip(outs, ur, eqn.outvars):
        if axes:
            res.append(Partials(o, mesh, axes, kind_of(var.aval)))
        else:  # reshard / sharding_constraint away from unreduced: the all-reduce
            res.append(Partials(o, mesh, summed, kind).total())
    return res if multiple else res[0]


def all_reduced(arr, kind: str = "sum"):
    """A refsim.Array with unreduced axes made an ordinary one: the sum of its partial values
    (`Partials.total`, an all-reduce; their max / min for `kind` "max" / "min") laid out by the
    same spec without `unreduced`, as `jax.reshard(x, P(*x.sharding.spec))` gives it. Any other
    Array is returned as it is.

    Only the sum is what JAX's semantics state about a global-view unreduced value; how it is
    split into partial sums is the partitioner's choice (conformance's oracle compares such
    outputs this way)."""
    from refsim.array import device_put
    from refsim.layouts.named_sharding import NamedSharding

    if not unreduced_axes_of(arr) or not isinstance(arr.sharding, NamedSharding):
        return arr
    spec = arr.sharding.spec
    return device_put(from_array(arr, kind).total(), NamedSharding(arr.sharding.mesh, PartitionSpec(*spec)))
