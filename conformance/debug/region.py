"""The program a bisection searches: one traced region, run by refsim and by an XLA runner.

A `Region` is the equation list the debugger bisects: the body of the program's
`shard_map` (values are per-device blocks) or of its `jit` (global values). A prefix of
it (the first k equations, returning chosen variables) is again a Region, which a
runner compiles and runs. `xla_runner` is the default runner: it re-binds the region's
equations, unchanged, inside `jax.jit(jax.shard_map(...))` or `jax.jit(...)` on the
mesh's real devices (through `xla_backend`), so the prefix is compiled as the program
itself is. `isolated_runner` (bisect's default) builds the same program and has XLA compile and
run it in a worker process (`xla_backend.isolated`): a fatal XLA CHECK ends the worker, and the
runner raises `XlaCrash` naming the step, which bisect reports as the prefix XLA cannot take.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Sequence

import numpy as np

import xla_backend
from refsim import compat as _compat
from refsim.array import Shard
from refsim.interpreter.registry import Context, load_rules
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec
from xla_backend import convert, isolated, placement, staging

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.

# The runner a jaxpr-stage fault planted by `conformance.faults.inject` puts in place: `bisect`
# uses it when it is given no runner (None: no fault planted).
planted_runner = None

KINDS = ("shard_map", "jit")


@dataclasses.dataclass(frozen=True)
class Region:
    """Equations to compile: `jaxpr` (open; its eqns and outvars) over `mesh`.

    kind "shard_map": `in_layouts` are the body's in_specs (refsim PartitionSpecs, one per
    flat argument) and every value is a device-local block. kind "jit": `in_layouts` are
    NamedShardings (or None) and values are global.
    """

    kind: str
    jaxpr: Any
    consts: tuple
    mesh: Mesh
    in_layouts: tuple
    check_vma: bool = True

    def prefix(self, stop: int, outvars: Sequence) -> "Region":
        """The first `stop` equations, returning `outvars` (variables they define or inputs)."""
        jaxpr = self.jaxpr.replace(eqns=list(self.jaxpr.eqns[:stop]), outvars=list(outvars))
        return dataclasses.replace(self, jaxpr=jaxpr)

    def with_eqn(self, index: int, eqn) -> "Region":
        """This region with equation `index` replaced (for planting faults in tests)."""
        eqns = list(self.jaxpr.eqns)
        eqns[index] = eqn
        return dataclasses.replace(self, jaxpr=self.jaxpr.replace(eqns=eqns))


Runner = Callable[[Region, Sequence[np.ndarray]], list]


def trace(fn, args: Sequence, *, mesh: Mesh, in_specs=None, out_specs=None, check_vma: bool = True,
          in_shardings=None, out_shardings=None) -> tuple[Region, list[np.ndarray]]:
    """Trace `fn` as `jax.shard_map` (when `in_specs` is given) or `jax.jit`; returns the Region
    and the flat canonical arguments.

    The program must trace to a single shard_map (or jit) equation, as
    `jax.make_jaxpr(jax.shard_map(f, ...))` does; the region is that equation's body. It is
    wrapped by `xla_backend.staging`, as `xla_backend.shard_map` / `jit` run it.
    """
    import jax

    if isinstance(mesh, jax.sharding.Mesh):
        mesh = Mesh.from_jax(mesh)
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh or a refsim.Mesh with device ids, got "
                        f"{type(mesh).__name__}; build one with jax.make_mesh(shape, names), "
                        "refsim.Mesh(shape, names, device_ids=...) or xla_backend.mesh(shape, names).")
    flat, tree = jax.tree_util.tree_flatten(tuple(args))
    flat = [placement.canonical_numpy(x) for x in flat]
    abstract = jax.tree_util.tree_unflatten(tree, [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in flat])
    # Traced over the mesh's real devices: each equation records the context mesh it was traced
    # under, and re-binding it (the XLA side) must see the same one.
    if in_specs is not None:
        if out_specs is None:
            raise ValueError("bisect: in_specs given without out_specs; pass out_specs as for jax.shard_map.")
        wrapped = staging.wrap(fn, staging.Layout.shard_map(mesh, in_specs, out_specs, check_vma=check_vma))
        closed = jax.make_jaxpr(wrapped.fn)(*abstract)
        eqn = _single_eqn(closed, "shard_map")
        body = eqn.params["jaxpr"]
        specs = tuple(staging.spec_to_refsim(s) for s in eqn.params["in_specs"])
        return Region("shard_map", body, (), mesh, specs, bool(check_vma)), flat

    wrapped = staging.wrap(fn, staging.Layout.jit(in_shardings, out_shardings, mesh=mesh))
    with wrapped.context():
        closed = jax.make_jaxpr(wrapped.call)(*abstract)
    eqn = _single_eqn(closed, "jit", "pjit")
    body = eqn.params["jaxpr"]
    layouts = tuple(wrapped.leaf_shardings(tuple(args)))
    return Region("jit", body.jaxpr, tuple(body.consts), mesh, layouts, True), flat


def trace_called(fn, args: Sequence) -> tuple[Region, list[np.ndarray]]:
    """The Region of a callable as the user runs it: `fn` under `jax.jit` (a `jax.jit` /
    `jax.pmap` / `jax.shard_map`-wrapped function, or a plain one, which is put under `jax.jit`),
    `args` a pytree of jax.Arrays (placed) and NumPy values.

    Through the program's top-level jits: a body that is one shard_map equation is a
    "shard_map" region (its mesh, in_specs and check_vma); otherwise the jit's body is a
    "jit" region laid out by the jit's in_shardings, or where it states none by where the
    arguments are placed. Returns the Region and the flat global arguments.
    """
    import jax

    call = fn if hasattr(fn, "lower") else jax.jit(fn)
    leaves = jax.tree_util.tree_leaves(tuple(args))
    flat = [np.asarray(x) for x in leaves]
    closed = jax.make_jaxpr(call)(*args)
    jaxpr, consts, in_sh = closed.jaxpr, list(closed.consts), [None] * len(leaves)
    while (len(jaxpr.eqns) == 1 and jaxpr.eqns[0].primitive.name in ("jit", "pjit")
           and list(jaxpr.eqns[0].invars) == list(jaxpr.invars) and not consts):
        eqn = jaxpr.eqns[0]
        in_sh = [s if _is_sharding(s) else prev for s, prev in zip(eqn.params.get("in_shardings", in_sh), in_sh)]
        inner = eqn.params["jaxpr"]
        jaxpr, consts = inner.jaxpr, list(inner.consts)
    if (len(jaxpr.eqns) == 1 and jaxpr.eqns[0].primitive.name == "shard_map" and not consts
            and list(jaxpr.eqns[0].invars) == list(jaxpr.invars)):
        eqn = jaxpr.eqns[0]
        jm = eqn.params["mesh"]
        if not isinstance(jm, jax.sharding.Mesh):
            jm = next((getattr(getattr(x, "sharding", None), "mesh", None) for x in leaves
                       if isinstance(getattr(getattr(x, "sharding", None), "mesh", None), jax.sharding.Mesh)), None)
        if jm is None:
            raise ValueError("bisect: the program's shard_map is over an abstract mesh and no argument is placed on "
                             "a concrete one; pass mesh= (a jax.sharding.Mesh) with in_specs/out_specs instead.")
        specs = tuple(staging_spec(s) for s in eqn.params["in_specs"])
        check_vma = bool(eqn.params.get("check_vma", eqn.params.get("check_rep", True)))
        return Region("shard_map", eqn.params["jaxpr"], (), Mesh.from_jax(jm), specs, check_vma), flat
    layouts, mesh = [], None
    for s, x in zip(in_sh, leaves):
        s = s if _is_sharding(s) else getattr(x, "sharding", None)
        try:
            r = convert.from_jax_sharding(s) if s is not None else None
        except TypeError:
            r = None
        r = r if isinstance(r, NamedSharding) else None
        layouts.append(r)
        mesh = mesh or (r.mesh if r is not None else None)
    if mesh is None:
        mesh = Mesh((len(jax.devices()),), ("i",), device_ids=np.asarray([d.id for d in jax.devices()]))
    return Region("jit", jaxpr, tuple(consts), mesh, tuple(layouts), True), flat


def _is_sharding(s) -> bool:
    import jax

    return isinstance(s, jax.sharding.Sharding)


def staging_spec(spec) -> PartitionSpec:
    return staging.spec_to_refsim(spec)


def _single_eqn(closed, *names):
    eqns = closed.jaxpr.eqns
    if len(eqns) != 1 or eqns[0].primitive.name not in names or list(eqns[0].outvars) != list(closed.jaxpr.outvars):
        got = [e.primitive.name for e in eqns]
        raise ValueError(
            f"bisect needs a program that traces to one {names[0]} equation, got equations {got}; "
            f"pass the function that {names[0]} wraps (not an already wrapped one) and its arguments.")
    return eqns[0]


# -- refsim side -------------------------------------------------------------------------------------

def refsim_values(region: Region, args: Sequence[np.ndarray]) -> dict:
    """Every variable of the region's body evaluated by refsim: {var: value}.

    shard_map regions hold stacked per-device values (mesh dims first, size 1 where
    invariant), split from the global args by the in_specs; jit regions hold global values.
    Recorded through the interpreter's probe hook.
    """
    from refsim.interpreter import core
    from refsim.interpreter.rules.sharding import split_by_spec

    load_rules()
    jaxpr = region.jaxpr
    own = {id(e) for e in jaxpr.eqns}
    env: dict = {}

    def probe(eqn, invals, outvals):
        if id(eqn) in own:
            for v, val in zip(eqn.outvars, outvals):
                env[v] = val

    extra = {"fallback": False, "strict": False, "replication": [], "probe": probe}
    if region.kind == "shard_map":
        mesh = region.mesh
        nm = mesh.ndim
        vals = [split_by_spec(a.reshape((1,) * nm + a.shape), mesh, s) for a, s in zip(args, region.in_layouts)]
        ctx = Context(nm=nm, mesh=mesh, extra=extra)
    else:
        nm, vals = 0, list(args)
        ctx = Context(extra=extra)
    consts = [core.lift(c, nm) for c in region.consts]
    for v, c in zip(jaxpr.constvars, consts):
        env[v] = c
    for v, a in zip(jaxpr.invars, vals):
        env[v] = a
    core.eval_jaxpr(jaxpr, consts, *vals, ctx=ctx)
    return env


def as_global(region: Region, value: np.ndarray, aval) -> np.ndarray:
    """A refsim value in the coordinates of `xla_runner`'s result: stacked blocks broadcast to the
    full mesh shape (shard_map), or the global value itself (jit)."""
    if region.kind == "shard_map":
        return np.broadcast_to(value, tuple(region.mesh.axis_sizes) + tuple(aval.shape))
    return np.asarray(value)


# -- XLA side ----------------------------------------------------------------------------------------

def xla_runner(region: Region, args: Sequence[np.ndarray]) -> list:
    """Compile and run `region` on XLA; one refsim.Array per outvar, shards copied off the devices.

    shard_map regions return each value with the mesh dims in front, laid out
    `P(*mesh.axis_names)`, so device d's shard is exactly its own block; jit regions return
    the values with the shardings XLA chose for them.
    """
    fn, out_specs = _region_program(region)
    if out_specs is not None:
        run = xla_backend.shard_map(fn, mesh=region.mesh, in_specs=tuple(region.in_layouts),
                                    out_specs=out_specs, check_vma=region.check_vma)
        return list(run(*args))
    run = xla_backend.jit(fn, in_shardings=tuple(region.in_layouts))
    try:
        return list(run(*args))
    except TypeError:
        # XLA chose an output sharding refsim cannot name: read it back replicated instead.
        rep = NamedSharding(region.mesh, PartitionSpec())
        run = xla_backend.jit(fn, in_shardings=tuple(region.in_layouts),
                              out_shardings=tuple(rep for _ in region.jaxpr.outvars))
        return list(run(*args))


def _region_program(region: Region):
    """(the function XLA runs for `region`, its out_specs or None for a jit region): a shard_map
    region returns each value with the mesh dims in front, laid out `P(*mesh.axis_names)`."""
    import jax

    jaxpr, consts = region.jaxpr, list(region.consts)
    if region.kind == "shard_map":
        nm = region.mesh.ndim

        def body(*a):
            outs = jax.core.eval_jaxpr(jaxpr, consts, *a)
            return tuple(jax.lax.expand_dims(o, tuple(range(nm))) for o in outs)

        return body, tuple(PartitionSpec(*region.mesh.axis_names) for _ in jaxpr.outvars)

    def prog(*a):
        return tuple(jax.core.eval_jaxpr(jaxpr, consts, *a))

    return prog, None


class XlaCrash(RuntimeError):
    """XLA failed on a prefix in `isolated_runner`'s worker: `phase` ("compile" or "execute"),
    `crashed` (the worker died: a fatal CHECK), `message` (XLA's error or fatal line)."""

    def __init__(self, phase: str, message: str, crashed: bool):
        super().__init__(f"XLA {'crashed' if crashed else 'failed'} in the {phase}: {message}")
        self.phase, self.message, self.crashed = phase, message, crashed


class _Returned:
    """A value a runner returns: `shards` (refsim.Shard per device) and `sharding.mesh`."""

    def __init__(self, shards, mesh):
        self.shards = shards
        self.sharding = types.SimpleNamespace(mesh=mesh)


def _staged_region(region: Region, args):
    """The program `xla_runner` runs for `region`, placed and lowered (not compiled)."""
    fn, out_specs = _region_program(region)
    if out_specs is not None:
        layout = staging.Layout.shard_map(region.mesh, tuple(region.in_layouts), out_specs,
                                          check_vma=region.check_vma)
    else:
        layout = staging.Layout.jit(tuple(region.in_layouts), None)
    staged = staging.stage(fn, layout, tuple(args))
    return staged, staged.lower()


def isolated_runner(region: Region, args: Sequence[np.ndarray]) -> list:
    """`xla_runner`'s program, compiled and run by XLA in a worker process; raises `XlaCrash` when XLA
    fails (or dies) compiling or running it."""
    import jax

    staged, lowered = _staged_region(region, args)
    with staged.context():
        record = isolated.capture(lowered)
    flat = [np.asarray(a) for a in jax.tree_util.tree_leaves(tuple(args))]
    kept = _compat.lowered_kept_args(lowered, len(flat))
    out_shapes = [tuple(o.shape) for o in jax.tree_util.tree_leaves(lowered.out_info)]
    ans = isolated.run(record, [flat[i] for i in kept], out_shapes)
    if ans.get("phase") != "done":
        text = ans.get("error", "")
        raise XlaCrash(ans.get("phase", "compile"), text, bool(ans.get("crashed")))
    ids = ans["device_ids"]
    out = []
    for value, indices in zip(ans["outputs"], ans["out_indices"]):
        out.append(_Returned([Shard(int(d), tuple(idx), value[p]) for p, (d, idx) in enumerate(zip(ids, indices))],
                             region.mesh))
    return out


def is_probeable(var) -> bool:
    """Values a runner can return: arrays of ordinary dtypes (not PRNG keys, tokens or float0)."""
    aval = var.aval
    if not hasattr(aval, "shape") or not hasattr(aval, "dtype"):
        return False
    import jax

    if _compat.prng_impl_of(aval.dtype) is not None:
        return False
    return aval.dtype != jax.dtypes.float0
