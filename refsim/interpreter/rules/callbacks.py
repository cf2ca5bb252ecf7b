"""Host callbacks: `jax.debug.print`, `jax.debug.callback`, `jax.pure_callback`, `io_callback`.

JAX runs a callback on the host once per device that executes it, on that device's own
operands: once in a global-view (jit) program, once per device inside `shard_map` /
`pmap` with the device's local block (`jax/_src/debugging.py`, `jax/_src/callback.py`).
refsim does the same on NumPy values, devices in ascending device-id order (XLA:CPU runs
devices concurrently, so JAX's own order is unspecified; a fixed order makes refsim's
output reproducible). `pure_callback` / `io_callback` results are converted to the
declared `result_avals` dtypes and checked against their shapes, as JAX checks them.
"""
from __future__ import annotations

import numpy as np

from refsim import compat
from refsim.interpreter.registry import register


def _device_positions(ctx) -> list[tuple]:
    """Mesh positions of the devices, in ascending device id (row-major when ids are unknown)."""
    if not ctx.nm:
        return [()]
    sizes = tuple(ctx.mesh.axis_sizes)
    positions = list(np.ndindex(*sizes))
    ids = getattr(ctx.mesh, "device_ids", None)
    if ids is not None:
        positions.sort(key=lambda p: int(np.asarray(ids)[p]))
    return positions


def _local(x: np.ndarray, pos: tuple, nm: int) -> np.ndarray:
    """Device `pos`'s own value of stacked `x` (a size-1 mesh dim is read at 0)."""
    if not nm:
        return x
    return x[tuple(p if x.shape[k] > 1 else 0 for k, p in enumerate(pos))]


def _run_per_device(ctx, args, call) -> list:
    """`call(*local args)` for each device; returns the per-device results in position order."""
    out = []
    for pos in _device_positions(ctx):
        out.append((pos, call(*[_local(np.asarray(a), pos, ctx.nm) for a in args])))
    return out


def _stack(ctx, per_device, result_avals, what: str) -> list:
    """Per-device callback results as stacked values (mesh dims first), checked against avals."""
    results = []
    for i, aval in enumerate(result_avals):
        shape, dtype = tuple(aval.shape), compat.physical_dtype(aval.dtype)
        sizes = tuple(ctx.mesh.axis_sizes) if ctx.nm else ()
        out = np.empty(sizes + shape, dtype)
        for pos, res in per_device:
            res = list(res)
            if len(res) != len(result_avals):
                raise RuntimeError(f"{what} returned {len(res)} values, but result_shape_dtypes declares "
                                   f"{len(result_avals)}; return one array per declared result.")
            val = np.asarray(res[i])
            if val.shape != shape:
                raise RuntimeError(
                    f"{what} result {i} has shape {val.shape}, but result_shape_dtypes declares {shape}; "
                    "make the callback return arrays of the declared shapes.")
            if val.dtype != dtype:
                raise RuntimeError(
                    f"{what} result {i} has dtype {val.dtype}, but result_shape_dtypes declares {dtype}; "
                    "make the callback return arrays of the declared dtypes.")
            out[pos] = val
        results.append(out)
    return results


@register("debug_callback")
def debug_callback_rule(ctx, *args, callback, effect, partitioned=False):
    """`jax.debug.callback`: the flat callback once per device on its own operands; no outputs."""
    _run_per_device(ctx, args, callback)
    return []


@register("debug_print")
def debug_print_rule(ctx, *args, fmt, ordered, partitioned, in_tree, static_args, np_printoptions,
                     has_placeholders, logging_record=None):
    """`jax.debug.print`: JAX's own formatting, printed once per device; no outputs."""
    cb = compat.debug_print_callback(fmt, np_printoptions, has_placeholders, logging_record, in_tree,
                                      static_args)
    _run_per_device(ctx, args, cb)
    return []


@register("pure_callback")
def pure_callback_rule(ctx, *args, callback, result_avals, sharding=None, vmap_method=None):
    """`jax.pure_callback`: the host function once per device; results must match result_avals."""
    return _stack(ctx, _run_per_device(ctx, args, callback), result_avals, "pure_callback")


@register("io_callback")
def io_callback_rule(ctx, *args, callback, result_avals, sharding=None, ordered=False):
    """`jax.experimental.io_callback`: as pure_callback, run in program order (refsim is sequential)."""
    return _stack(ctx, _run_per_device(ctx, args, callback), result_avals, "io_callback")
