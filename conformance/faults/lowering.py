"""Named miscompiles injected into XLA's side only, to measure the conformance suite's power.

Each `Fault` replaces JAX's MLIR lowering rule of one or more primitives (the tables
`mlir.register_lowering` fills) with a wrong one modelled on a real XLA/JAX collective
bug; `reshard_permutation_ignored` instead drops the device permutation JAX's dispatcher
applies when resharding onto a permuted device order. A fault is active only inside
``with inject("ppermute_pairs_reversed"):``. refsim traces the same program to a jaxpr
and never lowers it, so it still computes the correct answer while XLA runs the wrong one.

Entering and leaving the context clears JAX's jit/pmap caches and xla_backend's compile
cache, so no executable compiled with a fault is reused outside it, and none compiled outside is
reused inside. JAX's persistent compilation cache stays on for faults that replace a lowering
rule (the faulty module is another key: a warm cache must catch them as a cold one does) and is
turned off inside for faults that patch a later step (`Fault.patch`), which its key cannot see.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from typing import Callable, Iterable

import ml_dtypes
import numpy as np

from conformance.faults import firing, split
from refsim import compat as _compat
from xla_backend import cache

# JAX is imported inside the functions below: worker processes import this module before they
# configure the platform, and JAX reads the platform once, when it loads.


@dataclasses.dataclass(frozen=True)
class Fault:
    """One injectable miscompile.

    `primitives` are the JAX primitives whose lowering rule `make_rule(original, RuleEnv)`
    replaces (`make_rule` returns the wrong rule); `patch` is for a fault outside the lowering
    tables (a context manager factory). `cpu` is False where XLA:CPU cannot run the targeted
    op at all (no CPU lowering or thunk), so only an accelerator run can kill the fault.
    `inline`: the rule is lowered where its equation is, never as JAX's cached per-equation
    function, so it sees the ops that define its operands (`conformance.faults.split`).
    """

    name: str
    summary: str
    primitives: tuple = ()
    make_rule: Callable | None = None
    patch: Callable | None = None
    cpu: bool = True
    inline: bool = False

    @property
    def targets(self) -> str:
        """What the fault acts on, in words (for the warning of a block where it never fired)."""
        if self.primitives:
            return f"JAX's lowering of {', '.join(self.primitives)}: {self.summary}"
        return self.summary


FAULTS: dict[str, Fault] = {}


def _nothing() -> None:
    pass


@dataclasses.dataclass(frozen=True)
class RuleEnv:
    """What `make_rule` gets besides the rule it replaces: the primitive's name, the
    original (unfaulted) default rules of other primitives it may delegate to, and `fired()`,
    which a rule calls when it changed the lowering in a way its result does not show (an
    attribute edited in place); every other change is seen without it (`_counted`)."""

    primitive: str
    originals: dict
    fired: Callable[[], None] = _nothing


def _fault(name, summary, primitives=(), *, cpu=True, patch=None, inline=False):
    def register(make_rule):
        if name in FAULTS:
            raise ValueError(f"fault {name!r} is registered twice")
        FAULTS[name] = Fault(name, summary, tuple(primitives), make_rule, patch, cpu, inline)
        return make_rule
    return register


def names() -> tuple[str, ...]:
    """Every fault name, in registration order (the order of the issue's bug classes)."""
    return tuple(FAULTS)


# -- helpers used inside replaced lowering rules -----------------------------------------
def _named(axes) -> tuple:
    axes = axes if isinstance(axes, (tuple, list)) else (axes,)
    return tuple(a for a in axes if not isinstance(a, int))


def _group_size(ctx, axes, axis_index_groups=None) -> int:
    """Devices per replica group of a collective over `axes` (and `axis_index_groups`)."""
    if axis_index_groups is not None:
        return len(axis_index_groups[0])
    env = _compat.lowering_axis_env(ctx)
    return math.prod(env[a] for a in _named(axes))


def apply(ctx, fn, value, aval_in, aval_out):
    """Lower `fn` (jax.numpy on one array of `aval_in`) at this point of the module: the
    building block of a replaced lowering rule (here and in `conformance.faults.numerics`)."""
    # A fresh token slot: the replaced rule may already have set the outer ctx's tokens.
    sub = ctx.replace(primitive=None, avals_in=[aval_in], avals_out=[aval_out], tokens_out=None)
    out, = _compat.lower_fun(fn, multiple_results=False)(sub, value)
    return out


def _post(ctx, results, fn):
    """Apply `fn` to the single result of a rule (same aval before and after)."""
    aval, = ctx.avals_out
    (value,) = results
    return [apply(ctx, fn, value, aval, aval)]


def _with_params(transform):
    """A `make_rule` that calls the original rule with params rewritten by `transform(ctx, params)`."""
    def make(orig, env):
        def rule(ctx, *args, **params):
            return orig(ctx, *args, **transform(ctx, dict(params)))
        return rule
    return make


# -- ppermute ---------------------------------------------------------------------------------
def _components(perm) -> list[list[tuple]]:
    """The pairs of `perm` split into its cycles and chains (a fixed point is a 1-cycle)."""
    succ = {int(s): int(d) for s, d in perm}
    pred = {d: s for s, d in succ.items()}
    seen, out = set(), []
    for s, _ in perm:
        s = int(s)
        if s in seen:
            continue
        node = succ[s]
        while node != s and node in succ:
            node = succ[node]
        start = s
        if node != s:                      # a chain: begin at its head
            while start in pred:
                start = pred[start]
        comp, node = [], start
        while node in succ and node not in seen:
            seen.add(node)
            comp.append((node, succ[node]))
            node = succ[node]
        out.append(comp)
    return out


@_fault("ppermute_pairs_reversed",
        "ppermute sends along each (source, destination) pair backwards (the inverse permutation)",
        ["ppermute"])
def _ppermute_reversed(orig, env):
    return _with_params(lambda ctx, p: {**p, "perm": tuple((d, s) for s, d in p["perm"])})(orig, env)


@_fault("ppermute_fixed_points_dropped",
        "ppermute drops self-send pairs (i, i), so those devices receive zeros",
        ["ppermute"])
def _ppermute_fixed_points(orig, env):
    return _with_params(lambda ctx, p: {**p, "perm": tuple((s, d) for s, d in p["perm"] if s != d)})(
        orig, env)


@_fault("ppermute_one_cycle_kept",
        "ppermute of a multi-cycle permutation keeps only the cycle of its first pair; "
        "the other destinations receive zeros",
        ["ppermute"])
def _ppermute_one_cycle(orig, env):
    return _with_params(lambda ctx, p: {**p, "perm": tuple(_components(p["perm"])[0]) if p["perm"] else ()})(
        orig, env)


# -- axis_index_groups and axis order ---------------------------------------------------------
_GROUPED = ("psum", "pmax", "pmin", "all_gather", "reduce_scatter", "all_to_all")


def _is_strided(groups) -> bool:
    k, n = len(groups), sum(len(g) for g in groups)
    return k > 1 and len(groups[0]) > 1 and all(list(g) == list(range(i, n, k)) for i, g in enumerate(groups))


def _contiguous_if_strided(ctx, p):
    groups = p.get("axis_index_groups")
    if groups is not None and _is_strided(groups):
        g = len(groups[0])
        p["axis_index_groups"] = tuple(tuple(range(i, i + g)) for i in range(0, g * len(groups), g))
    return p


@_fault("groups_strided_as_contiguous",
        "strided axis_index_groups ([[0, 2], [1, 3]]) are lowered as contiguous ones ([[0, 1], [2, 3]])",
        _GROUPED)
def _strided_groups(orig, env):
    return _with_params(_contiguous_if_strided)(orig, env)


def _mesh_order(ctx, p):
    key = "axes" if "axes" in p else "axis_name"
    axes = p[key]
    if isinstance(axes, (tuple, list)) and len(_named(axes)) > 1:
        order = list(_compat.lowering_axis_env(ctx))
        named = sorted(_named(axes), key=order.index)
        p[key] = tuple(named) + tuple(a for a in axes if isinstance(a, int))
    return p


@_fault("multi_axis_mesh_order",
        "a collective over several mesh axes numbers devices in mesh axis order instead of "
        "the order the axes were given",
        ("psum", "psum_invariant", "pmax", "pmin", "ppermute", "all_gather", "reduce_scatter",
         "all_to_all", "pbroadcast"))
def _axis_order(orig, env):
    return _with_params(_mesh_order)(orig, env)


# -- all_to_all / all_gather / reduce_scatter layouts ------------------------------------------
@_fault("all_to_all_split_concat_swapped",
        "all_to_all stacks the received chunks along split_axis instead of concat_axis "
        "(the buffer then read in the declared shape), as a decomposition that swaps the two would",
        ["all_to_all"])
def _all_to_all_swapped(orig, env):
    def rule(ctx, x, *, split_axis, concat_axis, axis_name, axis_index_groups, **kw):
        out = orig(ctx, x, split_axis=split_axis, concat_axis=concat_axis, axis_name=axis_name,
                   axis_index_groups=axis_index_groups, **kw)
        n = _group_size(ctx, axis_name, axis_index_groups)
        if split_axis == concat_axis or n == 1 or kw.get("is_async"):
            return out
        s, c = split_axis, concat_axis

        def restack(y):
            import jax.numpy as jnp

            shp = y.shape
            z = y.reshape(shp[:c] + (n, shp[c] // n) + shp[c + 1:])
            z = jnp.moveaxis(z, c, s)                       # the n chunks now sit before split
            z = z.reshape(z.shape[:s] + (z.shape[s] * z.shape[s + 1],) + z.shape[s + 2:])
            return z.reshape(shp)
        return _post(ctx, out, restack)
    return rule


@_fault("all_gather_reversed_order",
        "all_gather concatenates the chunks in reversed group order",
        ["all_gather"])
def _all_gather_reversed(orig, env):
    def rule(ctx, x, *, all_gather_dimension, axis_size, tiled, **kw):
        out = orig(ctx, x, all_gather_dimension=all_gather_dimension, axis_size=axis_size, tiled=tiled, **kw)
        if axis_size == 1 or kw.get("is_async"):
            return out
        d, n = all_gather_dimension, axis_size

        def reverse(y):
            import jax.numpy as jnp

            if not tiled:
                return jnp.flip(y, d)
            shp = y.shape
            z = y.reshape(shp[:d] + (n, shp[d] // n) + shp[d + 1:])
            return jnp.flip(z, d).reshape(shp)
        return _post(ctx, out, reverse)
    return rule


@_fault("psum_scatter_wrong_dimension",
        "psum_scatter scatters along the major dimension of the row-major buffer instead of "
        "scatter_dimension (right only when scatter_dimension is 0 or every dimension before it is 1)",
        ["reduce_scatter"])
def _reduce_scatter_wrong_dim(orig, env):
    def rule(ctx, x, *, scatter_dimension, axis_name, axis_index_groups, axis_size, tiled, **kw):
        (aval_in,), (aval_out,) = ctx.avals_in, ctx.avals_out
        if all(d == 1 for d in aval_in.shape[:scatter_dimension]):   # the major dimension is the right one
            return orig(ctx, x, scatter_dimension=scatter_dimension, axis_name=axis_name,
                        axis_index_groups=axis_index_groups, axis_size=axis_size, tiled=tiled, **kw)
        n = axis_size
        total = math.prod(aval_in.shape)
        flat_in = aval_in.update(shape=(n, total // n))
        flat_out = aval_in.update(shape=(total // n,))
        xf = apply(ctx, lambda a: a.reshape(n, total // n), x, aval_in, flat_in)
        sub = ctx.replace(avals_in=[flat_in], avals_out=[flat_out])
        (yf,) = orig(sub, xf, scatter_dimension=0, axis_name=axis_name,
                     axis_index_groups=axis_index_groups, axis_size=axis_size, tiled=False, **kw)
        return [apply(ctx, lambda a: a.reshape(aval_out.shape), yf, flat_out, aval_out)]
    return rule


# -- reductions ---------------------------------------------------------------------------------
def _wrong_start(kind: str, dtype):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return kind == "pmax"
    if dt.kind == "u":
        return 1 if kind == "pmax" else 0
    if dt.kind == "i":
        return 0
    tiny = float(np.finfo(np.float32).tiny) if dt.name == "bfloat16" else float(np.finfo(dt).tiny)
    return tiny if kind == "pmax" else -tiny


@_fault("pmax_pmin_wrong_start",
        "pmax/pmin start from a wrong identity: max from the smallest positive normal float "
        "(0 for signed ints), min from its negation, so negative (positive) results are clamped",
        ("pmax", "pmin"))
def _wrong_start_rule(orig, env):
    kind = env.primitive

    def rule(ctx, x, **params):
        out = orig(ctx, x, **params)
        aval, = ctx.avals_out

        def clamp(y):
            import jax.numpy as jnp

            start = jnp.asarray(_wrong_start(kind, aval.dtype), dtype=y.dtype)
            return jnp.maximum(y, start) if kind == "pmax" else jnp.minimum(y, start)
        return _post(ctx, out, clamp)
    return rule


def _drop_last_member(ctx, axes, groups):
    n = _group_size(ctx, axes)
    groups = [list(range(n))] if groups is None else [list(g) for g in groups]
    out = []
    for g in groups:
        out += [g[:-1], g[-1:]] if len(g) > 1 else [g]
    return tuple(tuple(g) for g in out)


@_fault("psum_drop_member",
        "psum leaves the last member of each group out of the sum (it is reduced alone)",
        ("psum", "psum_invariant"))
def _psum_drop(orig, env):
    psum_rule = env.originals["psum"]

    def rule(ctx, x, *, axes, **kw):
        if not _named(axes):
            return orig(ctx, x, axes=axes, **kw)
        groups = _drop_last_member(ctx, axes, kw.get("axis_index_groups"))
        return psum_rule(ctx, x, axes=axes, axis_index_groups=groups)
    return rule


# -- broadcast, axis_index, ragged ---------------------------------------------------------------
@_fault("pbroadcast_wrong_source",
        "pbroadcast sends the value of device source + 1 (mod the group size) instead of source",
        ["pbroadcast"], cpu=False)
def _pbroadcast_source(orig, env):
    def shift(ctx, p):
        p["source"] = (p["source"] + 1) % _group_size(ctx, p["axis_name"])
        return p
    return _with_params(shift)(orig, env)


@_fault("axis_index_reversed",
        "axis_index counts from the far end of the axis (size - 1 - i)",
        ["axis_index"])
def _axis_index_reversed(orig, env):
    def rule(ctx, *, axis_name, **kw):
        out = orig(ctx, axis_name=axis_name, **kw)
        n = _group_size(ctx, axis_name)
        return out if n == 1 else _post(ctx, out, lambda i: (n - 1) - i)
    return rule


@_fault("ragged_all_to_all_single_device_offsets",
        "ragged_all_to_all over single-device groups (a local copy) writes at offset 0, "
        "ignoring output_offsets",
        ["ragged_all_to_all"], cpu=False)
def _ragged_offsets(orig, env):
    def rule(ctx, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, **params):
        if _group_size(ctx, params["axis_name"], params.get("axis_index_groups")) == 1:
            aval = ctx.avals_in[4]
            output_offsets = apply(ctx, lambda o: o * 0, output_offsets, aval, aval)
        return orig(ctx, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, **params)
    return rule


# -- numerics, device ids and the jit (GSPMD) path -------------------------------------------------
def _lowest(kind: str, dtype):
    """The value a NaN-dropping max (min) all-reduce substitutes: the lowest (highest) finite value."""
    fi = ml_dtypes.finfo(dtype)  # its finfo knows numpy's floats and bfloat16 / float8 alike
    return float(fi.min) if kind == "pmax" else float(fi.max)


def _is_float_dtype(dtype) -> bool:
    dt = np.dtype(dtype)
    return dt.kind == "f" or (dt.kind == "V" and "float" in dt.name) or dt.name.startswith(("bfloat16", "float8"))


@_fault("pmax_pmin_drop_nan",
        "pmax/pmin drop NaN: each NaN operand is replaced by the lowest (highest) finite value before the "
        "all-reduce, as an accumulator that starts at numeric_limits::lowest() and compares with > would",
        ("pmax", "pmin"))
def _drop_nan_rule(orig, env):
    kind = env.primitive

    def rule(ctx, *xs, **params):
        new = []
        for x, aval in zip(xs, ctx.avals_in):
            if _is_float_dtype(aval.dtype):
                low = _lowest(kind, aval.dtype)

                def fill(a, low=low):
                    import jax.numpy as jnp

                    return jnp.where(jnp.isnan(a), jnp.asarray(low, a.dtype), a)
                x = apply(ctx, fill, x, aval, aval)
            new.append(x)
        return orig(ctx, *new, **params)
    return rule


@_fault("psum_accumulates_in_bf16",
        "a float32 psum is accumulated in bfloat16: the operand is rounded to bfloat16, all-reduced, and "
        "converted back",
        ("psum", "psum_invariant"))
def _psum_bf16(orig, env):
    def rule(ctx, *xs, **params):
        if len(xs) != 1 or np.dtype(ctx.avals_in[0].dtype) != np.float32:
            return orig(ctx, *xs, **params)
        import jax.numpy as jnp

        (x,), (aval_in,), (aval_out,) = xs, ctx.avals_in, ctx.avals_out
        low_in, low_out = aval_in.update(dtype=jnp.bfloat16), aval_out.update(dtype=jnp.bfloat16)
        xb = apply(ctx, lambda a: a.astype(jnp.bfloat16), x, aval_in, low_in)
        (yb,) = orig(ctx.replace(avals_in=[low_in], avals_out=[low_out]), xb, **params)
        return [apply(ctx, lambda a: a.astype(jnp.float32), yb, low_out, aval_out)]
    return rule


@_fault("axis_index_wrong_device_id",
        "axis_index is computed from the next device's id (replica / partition id + 1), so device i "
        "reports index (i + 1) mod size",
        ["axis_index"])
def _axis_index_next(orig, env):
    def rule(ctx, *, axis_name, **kw):
        out = orig(ctx, axis_name=axis_name, **kw)
        n = _group_size(ctx, axis_name)
        return out if n == 1 else _post(ctx, out, lambda i: (i + 1) % n)
    return rule


def _gspmd(ctx) -> bool:
    """True when lowering for jit's automatic partitioner (not inside shard_map's manual region)."""
    return type(ctx.module_context.axis_context).__name__ == "ShardingContext"


@_fault("partitioned_reduction_drops_shard",
        "under jit, a reduce_sum over a dimension split across the devices leaves out the last device's "
        "block of it (the entries from the start of the last block on: the last size/k for k equal blocks), "
        "as a partitioned reduction whose cross-device all-reduce misses one shard; a dimension counts as "
        "split where the lowered program says so (the jit's in_shardings, a sharding constraint or an "
        "explicit-axes type, followed through elementwise ops: conformance.faults.split)",
        ["reduce_sum"], inline=True)
def _reduction_drops(orig, env):
    def rule(ctx, x, *, axes, **kw):
        if not _gspmd(ctx):
            return orig(ctx, x, axes=axes, **kw)
        (aval,) = ctx.avals_in
        counts = split.split_counts(ctx, x, aval)
        dim = next((d for d in axes if counts[d] > 1 and aval.shape[d] > 1), None)
        if dim is None:
            return orig(ctx, x, axes=axes, **kw)
        size = aval.shape[dim]
        block = -(-size // counts[dim])            # XLA pads an uneven split: blocks of ceil(size / k)
        keep = (size - 1) // block * block         # the start of the last block that holds data

        def drop(a, dim=dim, keep=keep):
            import jax.numpy as jnp

            idx = jnp.arange(a.shape[dim]).reshape([-1 if d == dim else 1 for d in range(a.ndim)])
            return jnp.where(idx < keep, a, jnp.zeros((), a.dtype))
        return orig(ctx, apply(ctx, drop, x, aval, aval), axes=axes, **kw)
    return rule


def _constraint_blocks(sharding, shape) -> tuple | None:
    """(start of device 0's block, start of the first block that differs, block shape) of a
    NamedSharding over `shape`, or None when every device holds the same block."""
    spec = tuple(sharding.spec)
    mesh = sharding.mesh
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    ndim = len(shape)
    b0 = _block_coords(0, sizes, spec, ndim)
    other = next((p for p in range(1, math.prod(sizes.values())) if _block_coords(p, sizes, spec, ndim) != b0), None)
    if other is None:
        return None
    counts = [max(1, math.prod(sizes[a] for a in (
        () if d >= len(spec) or spec[d] is None else (spec[d],) if isinstance(spec[d], str) else spec[d])))
        for d in range(ndim)]
    block = tuple(s // c for s, c in zip(shape, counts))
    start0 = tuple(b * k for b, k in zip(b0, block))
    start1 = tuple(b * k for b, k in zip(_block_coords(other, sizes, spec, ndim), block))
    return start0, start1, block


@_fault("sharding_constraint_wrong_permutation",
        "with_sharding_constraint under jit moves the data to a wrong device permutation: the blocks of "
        "mesh position 0 and of the first position holding a different block are exchanged",
        ["sharding_constraint"])
def _constraint_permuted(orig, env):
    def rule(ctx, x, **params):
        sharding = params.get("sharding")
        (aval,) = ctx.avals_in
        plan = None
        if sharding is not None and hasattr(sharding, "spec") and hasattr(sharding, "mesh"):
            try:
                plan = _constraint_blocks(sharding, aval.shape)
            except (KeyError, TypeError, ValueError):
                plan = None            # a spec this model does not cover (UNCONSTRAINED, ...)
        if plan is None:
            return orig(ctx, x, **params)
        start0, start1, block = plan

        def swap(y):
            from jax import lax

            a0 = lax.dynamic_slice(y, start0, block)
            a1 = lax.dynamic_slice(y, start1, block)
            return lax.dynamic_update_slice(lax.dynamic_update_slice(y, a1, start0), a0, start1)
        return orig(ctx, apply(ctx, swap, x, aval, aval), **params)
    return rule


# -- placement ----------------------------------------------------------------------------------
@contextlib.contextmanager
def _ignore_reshard_permutation():
    dispatch = _compat.reshard_dispatch_module()
    saved = dispatch._cached_logical_device_ids

    def ignored(*args, **kw):
        if saved(*args, **kw) is not None:     # a permutation JAX would have applied
            firing.note("reshard_permutation_ignored")
        return None

    dispatch._cached_logical_device_ids = ignored
    try:
        yield
    finally:
        dispatch._cached_logical_device_ids = saved


FAULTS["reshard_permutation_ignored"] = Fault(
    "reshard_permutation_ignored",
    "device_put onto the same devices in a permuted order keeps every buffer where it is, "
    "as if the target mesh listed the devices in the source's order",
    patch=_ignore_reshard_permutation)


def _block_coords(position: int, mesh_sizes: dict, spec, ndim: int) -> tuple:
    """Which block (per dimension) the device at flat mesh `position` holds under `spec`."""
    coords = dict(zip(mesh_sizes, np.unravel_index(position, tuple(mesh_sizes.values()))))
    out = []
    for d in range(ndim):
        entry = spec[d] if d < len(spec) else None
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        idx = 0
        for a in axes:
            idx = idx * mesh_sizes[a] + int(coords[a])
        out.append(idx)
    return tuple(out)


@_fault("output_shards_swapped",
        "shard_map hands the output shards of two devices (mesh position 0 and the first position "
        "holding a different block) to each other",
        ["shard_map"])
def _swap_outputs(orig, env):
    def rule(ctx, *args, mesh, out_specs, **params):
        outs = orig(ctx, *args, mesh=mesh, out_specs=out_specs, **params)
        sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
        new = []
        for value, aval, spec in zip(outs, ctx.avals_out, out_specs):
            ndim = len(aval.shape)
            b0 = _block_coords(0, sizes, spec, ndim)
            other = next((p for p in range(1, math.prod(sizes.values()))
                          if _block_coords(p, sizes, spec, ndim) != b0), None)
            if other is None:
                new.append(value)
                continue
            counts = [max(1, math.prod(sizes[a] for a in (
                () if d >= len(spec) or spec[d] is None else
                (spec[d],) if isinstance(spec[d], str) else spec[d]))) for d in range(ndim)]
            block = tuple(s // c for s, c in zip(aval.shape, counts))
            start0 = tuple(b * k for b, k in zip(b0, block))
            start1 = tuple(b * k for b, k in zip(_block_coords(other, sizes, spec, ndim), block))
            jmesh, jspec = mesh, spec

            def swap(y, start0=start0, start1=start1, block=block, jmesh=jmesh, jspec=jspec):
                import jax
                from jax import lax

                a0 = lax.dynamic_slice(y, start0, block)
                a1 = lax.dynamic_slice(y, start1, block)
                y = lax.dynamic_update_slice(lax.dynamic_update_slice(y, a1, start0), a0, start1)
                return jax.lax.with_sharding_constraint(y, jax.sharding.NamedSharding(jmesh, jspec))
            new.append(apply(ctx, swap, value, aval, aval))
        return new
    return rule


# -- activation ---------------------------------------------------------------------------------
def _resolve(faults) -> list[Fault]:
    if isinstance(faults, (str, Fault)):
        faults = [faults]
    out = []
    for f in faults:
        if isinstance(f, Fault):
            out.append(f)
        elif f in FAULTS:
            out.append(FAULTS[f])
        else:
            raise ValueError(f"unknown fault {f!r}; choose from {', '.join(FAULTS)}.")
    return out


def _unchanged(calls: list, ctx, args, params, out) -> bool:
    """True when the replaced rule only delegated: it called JAX's rule once, with its own context,
    arguments and params, and returned that rule's values as they were."""
    if len(calls) != 1 or calls[0] is _FIRED:
        return False
    c_ctx, c_args, c_params, c_out = calls[0]
    if c_ctx is not ctx or len(c_args) != len(args) or any(a is not b for a, b in zip(c_args, args)):
        return False
    if set(c_params) != set(params) or not all(firing.same_param(c_params[k], params[k], k) for k in params):
        return False
    if out is c_out:
        return True
    try:
        return len(out) == len(c_out) and all(a is b for a, b in zip(out, c_out))
    except TypeError:
        return False


_FIRED = object()


def _counted(fault: Fault, orig, env: RuleEnv):
    """`fault`'s rule for one table entry, counting (`firing.note`) each lowering it changed."""
    frames: list[list] = []          # one per active call: nested lowerings (a shard_map body) push their own

    def spy(ctx, *args, **params):
        out = orig(ctx, *args, **params)
        if frames:
            frames[-1].append((ctx, args, params, out))
        return out

    def fired():
        if frames:
            frames[-1].append(_FIRED)

    rule = fault.make_rule(spy, dataclasses.replace(env, fired=fired))

    def counted(ctx, *args, **params):
        frames.append([])
        try:
            out = rule(ctx, *args, **params)
        finally:
            calls = frames.pop()
        if _FIRED in calls or not _unchanged(calls, ctx, args, params, out):
            firing.note(fault.name)
        return out

    return counted


def _uncacheable():
    """JAX's set of primitives whose equations are lowered where they are, not as cached per-equation
    functions (`_uncacheable_primitives` beside the lowering tables, jax 0.10 … 0.12); None if absent."""
    entry = _compat.lowering_tables()[2]
    found = getattr(sys.modules.get(entry.__module__), "_uncacheable_primitives", None)
    return found if isinstance(found, set) else None


def _clear_compiled():
    import jax

    jax.clear_caches()
    cache.clear_cache()


@contextlib.contextmanager
def _persistent_cache_off():
    import jax

    from conformance.engine import compile_cache

    try:
        before = jax.config.jax_enable_compilation_cache
    except AttributeError:
        yield
        return
    # JAX's switch, for a cache the run did not install; the run's own cache reads it once per process
    # on jax 0.12, so it is passed by as well
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        with compile_cache.bypass():
            yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)


@contextlib.contextmanager
def inject(faults: str | Fault | Iterable):
    """Activate one fault (a name) or several for the duration of the block.

    Inside, XLA programs lowered by JAX use the faulty rules; on exit — normal or by an
    exception — every replaced table entry is put back exactly, and every compiled
    executable (JAX's caches, xla_backend's cache) is dropped on entry and on exit. Yields a
    `firing.Planted`: the names (a list) and `fired`, how many times each changed a lowering.

    >>> with inject("axis_index_reversed"):           # doctest: +SKIP
    ...     xla_backend.shard_map(f, mesh=m, in_specs=P('x'), out_specs=P('x'))(a)
    """
    chosen = _resolve(faults)
    default, per_platform, Entry = _compat.lowering_tables()
    saved: list = []                       # (table, primitive, entry or None)
    uncached: list = []                    # primitives this block made JAX lower inline (Fault.inline)
    planted = firing.Planted([f.name for f in chosen], {f.name: f.targets for f in chosen})
    with contextlib.ExitStack() as stack:
        try:
            _clear_compiled()
            if any(f.patch is not None for f in chosen):
                # a patch acts after JAX keys its persistent cache (dispatch, a planted CHECK): an executable
                # from the cache would skip it. A replaced lowering rule lowers another module, another key,
                # so the cache stays on for those: a warm cache must catch them as a cold one does.
                stack.enter_context(_persistent_cache_off())
            for fault in chosen:
                if fault.patch is not None:
                    stack.enter_context(fault.patch())
                    continue
                originals = {}
                for pname in ("psum",):
                    prim = _compat.primitive_by_name(pname)
                    if prim in default:
                        originals[pname] = default[prim].rule
                for pname in fault.primitives:
                    prim = _compat.primitive_by_name(pname)
                    if prim is None:
                        continue               # not in this JAX version
                    tables = [default] + [per_platform[p] for p in list(per_platform)]
                    for table in tables:
                        if prim not in table:
                            continue
                        entry = table[prim]
                        saved.append((table, prim, entry))
                        table[prim] = Entry(_counted(fault, entry.rule, RuleEnv(pname, originals)), entry.inline)
                    never_cached = _uncacheable() if fault.inline else None
                    if never_cached is not None and prim not in never_cached:
                        never_cached.add(prim)
                        uncached.append(prim)
            with firing.active(planted):
                yield planted
        finally:
            for table, prim, entry in reversed(saved):
                table[prim] = entry
            never_cached = _uncacheable()
            for prim in uncached:
                never_cached.discard(prim)
            _clear_compiled()
