"""`call_exported`: a `jax.export.Exported` called from a program (``exp.call(x)``, eagerly, under
jit or inside another export), run by refsim's StableHLO front end (`refsim.stablehlo`).

An Exported keeps no jaxpr: what it carries is the StableHLO module JAX lowered (global view:
each argument and result a global value, `sdy.manual_computation` regions per device, the
sharding of every argument and result stated on `@main`), which is also what XLA compiles when
the call runs. refsim interprets that module: outside a manual region the arguments and results
are global values, so its in/out shardings only say where they live (JAX's lowering wraps the
call's operands and results in sharding annotations, which do not change values); the oracle lays
the results out by the Exported's out shardings (conformance.oracle.program). As JAX's lowering
(`_call_exported_lowering`) does, the module gets only the arguments it kept
(`module_kept_var_idx`) and, when it was exported for several platforms, the index of the platform
it runs on first. Shape-polymorphic modules are refined to the call's static shapes first
(`refsim.compat.refined_exported_module`).
"""
from __future__ import annotations

import collections

import numpy as np

from refsim import compat
from refsim.errors import ReplicationError
from refsim.interpreter.registry import register
from refsim.layouts.stacking import replica_mismatch
from refsim.stablehlo import api as shlo

#: compiled modules by (serialized module, static argument shapes): a program calling the same
#: Exported many times loads it once
_PROGRAMS: "collections.OrderedDict" = collections.OrderedDict()
_PROGRAMS_MAX = 32


def _program(exported, shapes: tuple):
    key = (exported.mlir_module_serialized, shapes)
    prog = _PROGRAMS.get(key)
    if prog is None:
        prog = shlo.load(compat.refined_exported_module(exported, shapes))
        _PROGRAMS[key] = prog
        while len(_PROGRAMS) > _PROGRAMS_MAX:
            _PROGRAMS.popitem(last=False)
    else:
        _PROGRAMS.move_to_end(key)
    return prog


def _module_args(exported, program, args, per_device: bool = False) -> list:
    """The module's arguments: the platform index (exported for several platforms), then the kept ones."""
    kept = [args[i] for i in exported.module_kept_var_idx]
    if len(exported.platforms) > 1:
        idx = np.asarray(compat.exported_platform_index(exported), dtype=program.main.arg_types[0].dtype)
        kept = [idx[None] if per_device else idx] + kept
    return kept


def _global_view(ctx, stacked: np.ndarray, what: str) -> np.ndarray:
    """One global value from the module's per-device views (leading dimension N or 1): every
    device must see the same value (a manual region's result its out shardings call replicated);
    a difference is recorded (raised under strict) as refsim's shard_map records it, and device
    0's view is kept."""
    if stacked.shape[0] > 1:
        mism = replica_mismatch(stacked, 1, [0])
        if mism is not None:
            err = ReplicationError(
                f"{what}: the exported module's result differs between device {mism[0][0]} and device "
                f"{mism[1][0]} (first at local index {mism[2]}), though its out shardings make it one "
                "global value (a manual region's out_shardings leave a varying axis unnamed).")
            if ctx.extra.get("strict"):
                raise err
            ctx.extra.setdefault("replication", []).append(str(err))
    return stacked[0]


@register("call_exported")
def call_exported_rule(ctx, *args, exported):
    """`jax.export` `call_exported_p`: the Exported's StableHLO module evaluated by refsim.stablehlo
    on the call's arguments (JAX's `_call_exported_lowering` calls the same module). In global view
    the arguments and results are global values; in a manual region (shard_map, pmap) a module
    exported for one device runs on each device's own block."""
    if exported.ordered_effects:
        raise TypeError(f"call_exported: {exported.fun_name} was exported with ordered effects "
                        f"{exported.ordered_effects}; refsim replays no effects (host callbacks).")
    nm = ctx.nm
    args = [np.asarray(a) for a in args]
    if nm == 0:
        program = _program(exported, tuple(a.shape for a in args))
        outs = shlo.interpret(program, *_module_args(exported, program, args))
        return [_global_view(ctx, np.asarray(o), f"call_exported {exported.fun_name}") for o in outs]
    if exported.nr_devices != 1:
        # as JAX's lowering: a module for N devices is called where the context has N devices
        raise ValueError(f"Function {exported.fun_name} was exported for {exported.nr_devices} devices and is "
                         "called inside a manual region (shard_map / pmap), where each device runs it alone; "
                         "export it for one device to call it there.")
    mesh_shape = tuple(ctx.mesh.axis_sizes)
    n = int(np.prod(mesh_shape, dtype=np.int64))
    per_device = [np.broadcast_to(a, mesh_shape + a.shape[nm:]).reshape((n,) + a.shape[nm:]) for a in args]
    program = _program(exported, tuple(a.shape[1:] for a in per_device))
    outs = shlo.interpret(program, *_module_args(exported, program, per_device, True), per_device=True,
                          num_partitions=n)
    res = []
    for o in outs:
        o = np.asarray(o)
        res.append(o.reshape((1,) * nm + o.shape[1:]) if o.shape[0] == 1 else o.reshape(mesh_shape + o.shape[1:]))
    return res
