"""One program as JAX runs it: lowered module, compiled executable and the device arguments.

`build` wraps a function the way the conformance runner does (`jax.jit(jax.shard_map(...))`
pinned to the out_specs, `jax.jit` with shardings under the mesh, or `jax.pmap`), places the
arguments, and lowers it once, all through `xla_backend.staging`, the step xla_backend's own
entry points use. `build_called` takes a callable as the user runs it (already under
`jax.jit` / `jax.shard_map` / `jax.pmap`, with jax.Arrays placed by their shardings), as
`conformance.check` does. The stages of `conformance.debug.explain` all start from this one
`Staged` object, so the module refsim interprets is the one XLA compiles and runs.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import numpy as np

import refsim
import xla_backend
from conformance.oracle import program as oprog
from refsim import compat
from refsim.layouts.mesh import Mesh
from xla_backend import placement, staging

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.


@dataclasses.dataclass
class Staged:
    """A lowered program: `lowered` (jax.stages.Lowered), `jargs` (the positional arguments its
    executable takes), `global_args` (flat NumPy values), `device_ids` (JAX device id of each
    partition or replica, in the module's order), `refsim` (a callable returning refsim's flat
    outputs as refsim.Arrays; given the executable's output shardings, or None)."""

    lowered: Any
    jargs: list
    global_args: list
    device_ids: np.ndarray
    refsim: Callable[..., list]
    mesh_context: Any = None
    platforms: tuple | None = None
    _compiled: Any = None
    #: () -> (ClosedJaxpr, flat global NumPy inputs) of the whole program as JAX traces it: what the
    #: bound walk (`refsim.bounds`) reads for the allowed set (`conformance.debug.explain.judge`)
    jaxpr: Callable[[], tuple] | None = None

    def context(self):
        import jax

        return jax.set_mesh(self.mesh_context) if self.mesh_context is not None else contextlib.nullcontext()

    def compiled(self):
        if self.platforms is not None:
            raise RuntimeError(f"the module was lowered for {list(self.platforms)}, not for this platform; only its "
                               "lowered stage can be evaluated here.")
        if self._compiled is None:
            with self.context():
                self._compiled = self.lowered.compile()
        return self._compiled


def refsim_mesh(mesh):
    """A refsim Mesh for `mesh` (a refsim Mesh, or a jax.sharding.Mesh: its devices' ids)."""
    import jax

    if isinstance(mesh, Mesh):
        return mesh
    if isinstance(mesh, jax.sharding.Mesh):
        return Mesh.from_jax(mesh)
    raise TypeError(f"mesh must be a jax.sharding.Mesh (jax.make_mesh(shape, names)) or a refsim.Mesh, got "
                    f"{type(mesh).__name__}.")


def build(fn, args, *, mesh: Mesh | None = None, in_specs=None, out_specs=None, check_vma: bool = True,
          axis_names=None, in_shardings=None, out_shardings=None, pmap_kwargs=None,
          lowering_platforms=None) -> Staged:
    """Lower `fn` as `jax.shard_map` (in_specs given), `jax.pmap` (pmap_kwargs given) or `jax.jit`.

    `mesh` is a jax.sharding.Mesh or a refsim Mesh whose device ids name JAX devices
    (`xla_backend.mesh`); `args` are global values. `lowering_platforms` (e.g. ("cuda",))
    lowers for another platform, for an op this one has no lowering for: only the lowered
    stage can then run. Lowering errors (e.g. jax 0.12 rejecting a ppermute over axes out of
    mesh order) propagate unchanged. The program is wrapped and its arguments placed by
    `xla_backend.staging`, as `xla_backend.shard_map` / `jit` / `pmap` run it.
    """
    platforms = tuple(lowering_platforms) if lowering_platforms else None
    import jax

    args = [placement.canonical_numpy(a) for a in jax.tree_util.tree_leaves(tuple(args))]
    if pmap_kwargs is not None:
        layout = staging.Layout.pmap(**pmap_kwargs)
    else:
        mesh = refsim_mesh(mesh)
        if in_specs is not None:
            layout = staging.Layout.shard_map(mesh, in_specs, out_specs, check_vma=check_vma, axis_names=axis_names)
        else:
            layout = staging.Layout.jit(in_shardings, out_shardings, mesh=mesh)
    staged = staging.stage(fn, layout, args)
    lowered = staged.lower(platforms)
    run = getattr(refsim, layout.entry)(fn, **layout.entry_kwargs())
    return Staged(lowered, list(staged.flat_args), list(args), staged.device_ids,
                  lambda out_shardings=None: _leaves(run(*args)), staged.jax_mesh, platforms,
                  jaxpr=lambda: _traced_jaxpr(staged.call, staged.args, staged.context))


def _traced_jaxpr(call, args, context=None) -> tuple:
    """(closed jaxpr, flat global NumPy inputs) of `call(*args)`, traced as `conformance.check` traces it."""
    with (context() if context is not None else contextlib.nullcontext()):
        traced = oprog.trace(call, tuple(args), {})
    return traced.closed, [np.asarray(a) for a in traced.flat_args]


def is_wrapped(fn) -> bool:
    """True for a callable already under a JAX entry point: `jax.jit` (anything with `.lower`),
    `jax.pmap`, or `jax.shard_map` (which traces to one shard_map equation)."""
    return hasattr(fn, "lower") or type(fn).__name__ in ("PmapFunction",)


def build_called(fn, args, *, lowering_platforms=None) -> Staged:
    """Lower `fn(*args)` as the user calls it: `fn` under its own `jax.jit` / `jax.pmap` (a plain or
    `jax.shard_map`-wrapped function is put under `jax.jit`), `args` a pytree of jax.Arrays (kept
    where they are placed) and NumPy values. refsim replays the traced call as
    `conformance.check` does (`conformance.oracle.program`)."""
    import jax

    args = tuple(args)
    call = fn if hasattr(fn, "lower") else jax.jit(fn)
    platforms = tuple(lowering_platforms) if lowering_platforms else None
    if platforms:
        lowered = call.trace(*args).lower(lowering_platforms=platforms)
    else:
        lowered = call.lower(*args)
    traced = oprog.trace(call, args, {})
    oprog.check_replayable(traced)
    oprog.take_host_copies(traced)
    leaves = jax.tree_util.tree_leaves(args)
    global_args = [np.asarray(x) for x in leaves]
    ids = _device_ids_of(leaves, lowered)

    def run(out_shardings=None):
        outs = [_Out(s) for s in (out_shardings or [None] * len(jax.tree_util.tree_leaves(traced.out_tree)))]
        return oprog.refsim_outputs(traced, outs)[0]

    return Staged(lowered, list(args), global_args, np.asarray(ids, dtype=np.int64), run, None, platforms,
                  jaxpr=lambda: (traced.closed, list(traced.flat_args)))


class _Out:
    """Stands for an XLA output where `conformance.oracle.program.refsim_outputs` reads only its
    layout: a refsim sharding, or None (the global value, replicated)."""

    def __init__(self, sharding):
        self.sharding = sharding


def _device_ids_of(leaves, lowered) -> list:
    """The devices a called program runs on, in order: its arguments' mesh (or device set), else
    the output shardings it was lowered with, else every device."""
    import jax

    for s in [getattr(x, "sharding", None) for x in leaves] + list(_safe(compat.lowered_out_shardings, lowered)):
        mesh = getattr(s, "mesh", None)
        if isinstance(mesh, jax.sharding.Mesh) and mesh.size > 1:
            return [d.id for d in mesh.devices.flat]
    for x in leaves:
        devs = getattr(getattr(x, "sharding", None), "_device_assignment", None)
        if devs is not None and len(devs) > 1:
            return [d.id for d in devs]
    return [d.id for d in jax.devices()]


def _safe(f, *a) -> list:
    try:
        return list(f(*a))
    except Exception:  # noqa: BLE001 - only a hint of the device order
        return []


def _leaves(out) -> list:
    import jax

    return jax.tree_util.tree_leaves(out, is_leaf=lambda x: hasattr(x, "shards"))


def from_corpus(prog, lowering_platforms=None) -> Staged:
    """`build` for a `conformance.cases.corpus.Program` with the inputs of seed 0."""
    args = prog.inputs(0)
    if prog.kind == "pmap":
        return build(prog.fn, args, pmap_kwargs=dict(prog.pmap_kwargs), lowering_platforms=lowering_platforms)
    mesh = xla_backend.mesh(prog.mesh_shape, prog.axis_names, axis_types=prog.axis_types)
    if prog.kind == "shard_map":
        return build(prog.fn, args, mesh=mesh, in_specs=prog.in_specs, out_specs=prog.out_specs,
                     check_vma=prog.check_vma, axis_names=prog.manual_axes, lowering_platforms=lowering_platforms)
    in_shardings, out_shardings = prog.shardings(mesh)
    return build(prog.fn, args, mesh=mesh, in_shardings=in_shardings, out_shardings=out_shardings,
                 lowering_platforms=lowering_platforms)


def case_kwargs(case) -> dict:
    """`build` / `explain` keywords of a conformance case (`conformance.cases.Program`)."""
    if case.entry == "shard_map":
        return dict(mesh=case.mesh, in_specs=case.in_specs, out_specs=case.out_specs, axis_names=case.axis_names)
    if case.entry == "jit":
        return dict(mesh=case.mesh, in_shardings=case.in_shardings, out_shardings=case.out_shardings)
    if case.entry == "pmap":
        ids = [int(i) for i in np.asarray(case.mesh.device_ids).ravel()]
        return dict(pmap_kwargs=dict(axis_name=case.mesh.axis_names[0], devices=ids))
    raise ValueError(f"case {case.case_id} has entry {case.entry!r}: a device_put has no program to lower; "
                     "use conformance.debug (bisect) for it.")


def from_case(case, lowering_platforms=None) -> Staged:
    """`build` for a conformance case (shard_map, jit or pmap entry)."""
    return build(case.fn, case.args, lowering_platforms=lowering_platforms, **case_kwargs(case))
