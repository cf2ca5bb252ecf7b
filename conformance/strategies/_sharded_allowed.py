"""The allowed set for a drawn sharded program's inexact outputs (issue 39, point 4).

The value model (`conformance.strategies._sharded_graph`) bounds each output a priori, over the
ranges its values may take; the allowed set (`refsim.bounds`, `conformance.verdict.allowed`)
bounds each element of this case's data. `refine` holds every element of an output the value
model leaves inexact to the tighter of the two: the allowed set where it is tighter and decided,
the value model elsewhere (and where the allowed set is undecidable: the value model's data are
drawn to decide what the program turns on, and stays the judge there rather than nobody). Exact
outputs keep their bit-for-bit policy. A program the walk cannot take (several jit calls, a
failure of the walk) keeps the value model, unchanged.
"""
from __future__ import annotations

import collections
import dataclasses

import numpy as np

#: the bound walk is skipped above this many element operations (as conformance.check's)
MAX_WORK = 1 << 22
#: traced programs kept, by structure and argument types: a program's data sets share one trace
_TRACES: collections.OrderedDict = collections.OrderedDict()
TRACES_MAX = 256


def _closed(case):
    """The jit's closed jaxpr for `case` (traced once per structure and argument types, with the
    arguments placed as the XLA run places them)."""
    from xla_backend import staging

    key = (case._structure_key, tuple((np.shape(a), str(np.asarray(a).dtype)) for a in case.args))
    hit = _TRACES.get(key)
    if hit is None:
        # traced as xla_backend.jit runs it: with the arguments placed by their in_shardings, so that
        # on an Explicit mesh their avals carry the sharding type (traced from bare NumPy arrays, a
        # pullback may accumulate its cotangents in another order than the program XLA and refsim run)
        wrapped = staging.wrap(case.fn, staging.Layout.jit(case.in_shardings, case.out_shardings))
        staged = wrapped.place(case.args)
        with staged.context():
            hit = _TRACES[key] = staged.call.trace(*staged.dynamic_args).jaxpr
        if len(_TRACES) > TRACES_MAX:
            _TRACES.popitem(last=False)
    else:
        _TRACES.move_to_end(key)
    return hit


def _chain_closed(case):
    """The closed jaxpr of a ``jit_chain_orders`` program's calls, chained (module docstring); its
    outputs are `ShardedProgram._run_chain`'s: the last carry, then each call's other outputs."""
    import jax

    from conformance.strategies import _program_classes as pc
    from conformance.strategies.sharded import _pspec
    from refsim.layouts.named_sharding import NamedSharding
    from refsim import compat
    from xla_backend import staging
    from xla_backend.convert import to_jax_sharding

    key = ("chain", case._structure_key, tuple((np.shape(a), str(np.asarray(a).dtype)) for a in case.args))
    hit = _TRACES.get(key)
    if hit is not None:
        _TRACES.move_to_end(key)
        return hit
    meshes = pc.chain_meshes(case.graph.program_class, case.mesh)
    steps = pc.chain_specs(case.graph.program_class, len(case.graph.outs))
    traced = []     # per call: its closed jaxpr, the staged call (its mesh context) and its in_shardings
    for m, specs in zip(meshes, steps):
        ins = tuple(NamedSharding(m, sh.spec) for sh in case.in_shardings)
        outs = tuple(NamedSharding(m, _pspec(sp)) for sp in specs)
        staged = staging.wrap(case.fn, staging.Layout.jit(ins, outs)).place(case.args)
        with staged.context():
            traced.append((staged.call.trace(*staged.dynamic_args).jaxpr, staged,
                           [to_jax_sharding(s) for s in ins]))

    def chained(*flat):
        # each call under its own mesh, its arguments moved into its in_shardings first, as
        # ShardedProgram._run_chain runs it (on an Explicit mesh the types carry the mesh)
        args, outs = list(flat), []
        for k, (closed, staged, ins) in enumerate(traced):
            with compat.use_abstract_mesh(staged.jax_mesh.abstract_mesh):   # set_mesh is refused under a trace
                if k:
                    args = [jax.device_put(a, s) for a, s in zip(args, ins)]
                o = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *args)
            args[0] = o[0]
            outs += list(o[1:])
        return (args[0], *outs)

    flat = [np.asarray(a) for a in jax.tree_util.tree_leaves(case.args)]
    hit = _TRACES[key] = jax.make_jaxpr(chained)(*flat)
    if len(_TRACES) > TRACES_MAX:
        _TRACES.popitem(last=False)
    return hit


def refine(case, outs: list, pols: list, inexact: list) -> list:
    """`pols` (the value model's, one per output of `outs`, refsim's Arrays of `case`) with each
    output k where `inexact[k]` held to the allowed set where it is tighter (see the module)."""
    if not any(inexact) or case.entry != "jit":
        return pols
    import jax

    from conformance.verdict import allowed
    from refsim.bounds.coverage import work_estimate

    try:
        closed = _chain_closed(case) if case.program_class == "jit_chain_orders" else _closed(case)
        if work_estimate(closed) > MAX_WORK:
            return pols
        flat = [np.asarray(a) for a in jax.tree_util.tree_leaves(case.args)]
        platform = jax.devices()[0].platform
        new, _notes, _result = allowed.build(closed, flat, outs, list(inexact), pols, platform=platform)
    except Exception:  # noqa: BLE001 - the value model judges, as before the allowed set
        return pols
    return [dataclasses.replace(p, judge_undecidable=True) if isinstance(p, allowed.AllowedSet) else p
            for p in new]
