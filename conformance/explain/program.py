"""One program as JAX runs it: lowered module, compiled executable and the device arguments.

`build` wraps a function the way the conformance runner does (`jax.jit(jax.shard_map(...))`
pinned to the out_specs, `jax.jit` with shardings under the mesh, or `jax.pmap`), places the
arguments, and lowers it once. The stages of `conformance.explain` all start from this one
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


def _flat_specs(specs, args, is_leaf, what):
    from xla_backend import placement

    return placement.broadcast_prefix(specs, tuple(args), is_leaf, what)


def _lower(jitted, jargs, platforms):
    if platforms:
        return jitted.trace(*jargs).lower(lowering_platforms=tuple(platforms))
    return jitted.lower(*jargs)


def build(fn, args, *, mesh: Mesh | None = None, in_specs=None, out_specs=None, check_vma: bool = True,
          axis_names=None, in_shardings=None, out_shardings=None, pmap_kwargs=None,
          lowering_platforms=None) -> Staged:
    """Lower `fn` as `jax.shard_map` (in_specs given), `jax.pmap` (pmap_kwargs given) or `jax.jit`.

    `mesh` is a refsim Mesh whose device ids name JAX devices (`xla_backend.mesh`); `args`
    are global NumPy values. `lowering_platforms` (e.g. ("cuda",)) lowers for another
    platform, for an op this one has no lowering for: only the lowered stage can then run.
    Lowering errors (e.g. jax 0.12 rejecting a ppermute over axes out of mesh order)
    propagate unchanged.
    """
    platforms = tuple(lowering_platforms) if lowering_platforms else None
    import jax

    import refsim
    import xla_backend
    from xla_backend import placement

    args = [placement.canonical_numpy(a) for a in jax.tree_util.tree_leaves(tuple(args))]
    if pmap_kwargs is not None:
        kw = dict(pmap_kwargs)
        if kw.get("devices") is not None:  # device ids (refsim's view) -> JAX devices
            kw["devices"] = list(xla_backend.meshes.jax_devices([int(i) for i in kw["devices"]]))
        pm = jax.pmap(fn, **kw)
        lowered = _lower(pm, args, platforms) if platforms else pm.lower(*args)
        n = max(np.shape(a)[0] for a in args)
        ids = np.array([d.id for d in kw["devices"]]) if kw.get("devices") else np.array(
            [d.id for d in jax.devices()[:n]])
        return Staged(lowered, list(args), list(args), ids, lambda: _leaves(refsim.pmap(fn, **pmap_kwargs)(*args)),
                      platforms=platforms)
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a refsim.Mesh (xla_backend.mesh(shape, names)), got {type(mesh).__name__}.")
    jmesh = xla_backend.jax_mesh(mesh)
    ids = np.asarray(mesh.device_ids).reshape(-1)
    if in_specs is not None:
        kw = {} if axis_names is None else {"axis_names": frozenset(axis_names)}
        j_in = jax.tree_util.tree_map(placement.spec_to_jax, in_specs, is_leaf=placement.is_spec)
        j_out = jax.tree_util.tree_map(placement.spec_to_jax, out_specs, is_leaf=placement.is_spec)
        smapped = jax.shard_map(fn, mesh=jmesh, in_specs=j_in, out_specs=j_out, check_vma=check_vma, **kw)
        pinned = jax.tree_util.tree_map(lambda s: None if s is None else jax.sharding.NamedSharding(jmesh, s),
                                        j_out, is_leaf=placement.is_spec)
        specs = _flat_specs(in_specs, args, placement.is_spec, "in_specs")
        jargs = [placement.to_device(x, placement.named(mesh, s)) for x, s in zip(args, specs)]
        with jax.set_mesh(jmesh):
            lowered = _lower(jax.jit(smapped, out_shardings=pinned), jargs, platforms)
        run = refsim.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma,
                               **({} if axis_names is None else {"axis_names": set(axis_names)}))
        return Staged(lowered, jargs, list(args), ids, lambda: _leaves(run(*args)), jmesh, platforms)
    from xla_backend import convert

    to_j = lambda t: jax.tree_util.tree_map(convert.to_jax_sharding, t, is_leaf=placement.is_sharding)  # noqa: E731
    kw = {}
    if in_shardings is not None:
        kw["in_shardings"] = to_j(in_shardings)
    if out_shardings is not None:
        kw["out_shardings"] = to_j(out_shardings)
    shard = [None] * len(args) if in_shardings is None else _flat_specs(in_shardings, args, placement.is_sharding,
                                                                       "in_shardings")
    jargs = [placement.to_device(x, s) for x, s in zip(args, shard)]
    with jax.set_mesh(jmesh):
        lowered = _lower(jax.jit(fn, **kw), jargs, platforms)
    run = refsim.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings)
    return Staged(lowered, jargs, list(args), ids, lambda: _leaves(run(*args)), jmesh, platforms)


def _leaves(out) -> list:
    import jax

    return jax.tree_util.tree_leaves(out, is_leaf=lambda x: hasattr(x, "shards"))


def from_corpus(prog, lowering_platforms=None) -> Staged:
    """`build` for a `conformance.corpus.Program` with the inputs of seed 0."""
    from conformance import corpus
    import xla_backend

    args = prog.inputs(0)
    if prog.kind == "pmap":
        return build(prog.fn, args, pmap_kwargs=dict(prog.pmap_kwargs), lowering_platforms=lowering_platforms)
    mesh = xla_backend.mesh(prog.mesh_shape, prog.axis_names, axis_types=prog.axis_types)
    if prog.kind == "shard_map":
        return build(prog.fn, args, mesh=mesh, in_specs=prog.in_specs, out_specs=prog.out_specs,
                     check_vma=prog.check_vma, axis_names=prog.manual_axes, lowering_platforms=lowering_platforms)

    def named(tree):
        if tree is None:
            return None
        return jax_tree_map(lambda s: corpus.api_named(None, mesh, s), tree)

    return build(prog.fn, args, mesh=mesh, in_shardings=named(prog.in_specs), out_shardings=named(prog.out_specs),
                 lowering_platforms=lowering_platforms)


def jax_tree_map(f, tree):
    import jax

    return jax.tree_util.tree_map(f, tree, is_leaf=lambda x: x is None or isinstance(x, jax.sharding.PartitionSpec))
