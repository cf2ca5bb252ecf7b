"""One program as JAX runs it: lowered module, compiled executable and the device arguments.

`build` wraps a function the way the conformance runner does (`jax.jit(jax.shard_map(...))`
pinned to the out_specs, `jax.jit` with shardings under the mesh, or `jax.pmap`), places the
arguments, and lowers it once, all through `xla_backend.staging`, the step xla_backend's own
entry points use. The stages of `conformance.debug.explain` all start from this one
`Staged` object, so the module refsim interprets is the one XLA compiles and runs.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import numpy as np

from refsim.layouts.mesh import Mesh


@dataclasses.dataclass
class Staged:
    """A lowered program: `lowered` (jax.stages.Lowered), `jargs` (flat device arguments),
    `global_args` (flat NumPy values), `device_ids` (JAX device id of each partition or
    replica, in the module's order), `refsim` (a callable returning refsim's flat outputs)."""

    lowered: Any
    jargs: list
    global_args: list
    device_ids: np.ndarray
    refsim: Callable[[], list]
    mesh_context: Any = None
    platforms: tuple | None = None
    _compiled: Any = None

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


def build(fn, args, *, mesh: Mesh | None = None, in_specs=None, out_specs=None, check_vma: bool = True,
          axis_names=None, in_shardings=None, out_shardings=None, pmap_kwargs=None,
          lowering_platforms=None) -> Staged:
    """Lower `fn` as `jax.shard_map` (in_specs given), `jax.pmap` (pmap_kwargs given) or `jax.jit`.

    `mesh` is a refsim Mesh whose device ids name JAX devices (`xla_backend.mesh`); `args`
    are global NumPy values. `lowering_platforms` (e.g. ("cuda",)) lowers for another
    platform, for an op this one has no lowering for: only the lowered stage can then run.
    Lowering errors (e.g. jax 0.12 rejecting a ppermute over axes out of mesh order)
    propagate unchanged. The program is wrapped and its arguments placed by
    `xla_backend.staging`, as `xla_backend.shard_map` / `jit` / `pmap` run it.
    """
    platforms = tuple(lowering_platforms) if lowering_platforms else None
    import jax

    import refsim
    from xla_backend import placement, staging

    args = [placement.canonical_numpy(a) for a in jax.tree_util.tree_leaves(tuple(args))]
    if pmap_kwargs is not None:
        layout = staging.Layout.pmap(**pmap_kwargs)
    else:
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh must be a refsim.Mesh (xla_backend.mesh(shape, names)), got {type(mesh).__name__}.")
        if in_specs is not None:
            layout = staging.Layout.shard_map(mesh, in_specs, out_specs, check_vma=check_vma, axis_names=axis_names)
        else:
            layout = staging.Layout.jit(in_shardings, out_shardings, mesh=mesh)
    staged = staging.stage(fn, layout, args)
    lowered = staged.lower(platforms)
    run = getattr(refsim, layout.entry)(fn, **layout.entry_kwargs())
    return Staged(lowered, list(staged.flat_args), list(args), staged.device_ids, lambda: _leaves(run(*args)),
                  staged.jax_mesh, platforms)


def _leaves(out) -> list:
    import jax

    return jax.tree_util.tree_leaves(out, is_leaf=lambda x: hasattr(x, "shards"))


def from_corpus(prog, lowering_platforms=None) -> Staged:
    """`build` for a `conformance.cases.corpus.Program` with the inputs of seed 0."""
    import xla_backend

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
