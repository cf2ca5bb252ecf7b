"""Opt-in fallback: evaluate one equation that has no refsim rule with JAX on CPU, per device.

Off by default. When a caller passes ``fallback=True``, an equation whose primitive
has no rule is bound with JAX on the CPU backend once per device (on that device's
local values), and the primitive is recorded in ``ctx.extra["fallback_log"]`` so the
result's ``info`` says it is not an independent (pure NumPy) result. Collectives are
never evaluated this way: one device's values alone cannot define them.
"""
from __future__ import annotations

import numpy as np

from refsim.errors import UnsupportedPrimitive

# Params that mark a primitive as communicating across devices.
_COLLECTIVE_PARAMS = ("axes", "axis_name", "axis_index_groups")


def evaluate_with_jax(ctx, eqn, invals) -> list | np.ndarray:
    """Bind `eqn.primitive` with JAX on CPU for each device's local operands; stack the results."""
    import jax

    name = eqn.primitive.name
    if any(k in eqn.params for k in _COLLECTIVE_PARAMS):
        raise UnsupportedPrimitive(
            name, "It communicates across devices, so fallback cannot evaluate it one device at a time."
        )
    nm = ctx.nm
    invals = [np.asarray(v) for v in invals]
    mesh_shape = tuple(np.broadcast_shapes(*(v.shape[:nm] for v in invals))) if nm and invals else (1,) * nm
    cpu = jax.devices("cpu")[0]
    per_device: list[list[np.ndarray]] = []
    for pos in np.ndindex(*mesh_shape):
        local = [v[tuple(p if v.shape[k] > 1 else 0 for k, p in enumerate(pos))] for v in invals]
        with jax.default_device(cpu):
            out = eqn.primitive.bind(*[jax.numpy.asarray(x) for x in local], **eqn.params)
        outs = out if eqn.primitive.multiple_results else [out]
        per_device.append([np.asarray(o) for o in outs])
    n_out = len(per_device[0]) if per_device else len(eqn.outvars)
    stacked = [
        np.stack([d[i] for d in per_device]).reshape(mesh_shape + per_device[0][i].shape)
        for i in range(n_out)
    ]
    log = ctx.extra.setdefault("fallback_log", {})
    log[name] = log.get(name, 0) + 1
    return stacked if eqn.primitive.multiple_results else stacked[0]
