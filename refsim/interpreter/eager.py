"""Eager `refsim.shard_map`: run the body op by op, so Python can branch on invariant values.

`jax.shard_map` called outside `jit` evaluates each primitive as the Python function binds it,
so `1.0 if psum(axis_index('x'), 'x') > 0 else -1.0` works: the psum result is invariant
over the mesh, hence one Python value. refsim offers the same when a function cannot be
traced for that reason (`refsim.shard_map` falls back to this module on JAX's
ConcretizationTypeError when called outside any trace).

Each primitive the body binds is evaluated by refsim's own rule on the stacked per-device
values (the same rule the traced path uses); its output type — shape, dtype, weak type and
the manual-axis type (varying / unreduced / reduced axes) — is the primitive's own abstract
evaluation, as JAX's eager shard_map computes it. A value converts to a Python value only
where that type says it is the same on every device (`check_vma=True`); otherwise JAX's
own TracerBoolConversionError is raised, as eager `jax.shard_map` does.
"""
from __future__ import annotations

import numpy as np

from refsim import compat
from refsim.interpreter.registry import RULES, Context
from refsim.errors import UnsupportedPrimitive


def _jax():
    import jax

    return compat.trace_core(), jax.sharding.AxisType, jax.sharding.NamedSharding


def make_trace_classes():
    """The Trace / Tracer pair (built lazily: they subclass JAX's private core classes)."""
    core, AxisType, NamedSharding = _jax()

    class RefsimTracer(core.Tracer):
        """A body value: `val` stacked per device (mesh dims first), `aval` its per-device type."""

        __slots__ = ("val",)

        def __init__(self, trace, val, aval):
            super().__init__(trace, aval)
            self.val = val

        def to_concrete_value(self):
            mat = compat.aval_mat(self.aval)
            if not self._trace.check or mat is None or (mat.varying or mat.unreduced):
                return None  # the type does not promise the same value on every device
            nm = self._trace.ctx.nm
            v = np.asarray(self.val)
            return v[(0,) * nm] if nm else v

    class RefsimTrace(core.Trace):
        """Evaluates every primitive bound in the body with refsim's rule on stacked values."""

        def __init__(self, ctx, manual_mesh, check):
            super().__init__()
            self.ctx, self.manual_mesh, self.check = ctx, manual_mesh, check

        def lift(self, x):
            if isinstance(x, RefsimTracer) and x._trace is self:
                return x.val, x.aval
            if isinstance(x, core.Tracer):
                raise TypeError(f"eager refsim.shard_map got a value of another trace: {x}")
            aval = core.typeof(x)  # a Python scalar is weakly typed in JAX's canonical dtype
            arr = compat.to_numpy(x)
            if not arr.dtype.names and arr.dtype != compat.physical_dtype(aval.dtype):
                arr = arr.astype(compat.physical_dtype(aval.dtype))
            return arr.reshape((1,) * self.ctx.nm + arr.shape), aval

        def wrap(self, val, aval):
            return RefsimTracer(self, val, aval)

        def process_primitive(self, prim, tracers, params):
            vals, avals = zip(*(self.lift(t) for t in tracers)) if tracers else ((), ())
            out_avals, _ = prim.abstract_eval(*avals, **params)
            rule = RULES.get(prim.name)
            if rule is None:
                raise UnsupportedPrimitive(prim.name)
            out = rule(self.ctx, *vals, **params)
            if prim.multiple_results:
                return [self.wrap(v, a) for v, a in zip(out, out_avals)]
            return self.wrap(out, out_avals)

        def process_call(self, call_primitive, f, tracers, params):
            with core.set_current_trace(self):
                return f.call_wrapped(*tracers)

        def process_custom_jvp_call(self, prim, fun, jvp, tracers, *, symbolic_zeros):
            with core.set_current_trace(self):
                return fun.call_wrapped(*tracers)

        def process_custom_vjp_call(self, prim, fun, fwd, bwd, tracers, out_trees, symbolic_zeros):
            with core.set_current_trace(self):
                return fun.call_wrapped(*tracers)

    return RefsimTrace, RefsimTracer


_CLASSES = []


def run(f, args_stacked, in_avals, *, mesh, tracing_mesh, manual_axes, check, extra):
    """Call `f` on per-device values (stacked, with their per-device avals); returns the flat
    output values (stacked) and the output pytree structure."""
    import jax

    core, AxisType, _ = _jax()
    if not _CLASSES:
        _CLASSES.extend(make_trace_classes())
    RefsimTrace, _ = _CLASSES
    manual_mesh = tracing_mesh.update_axis_types({n: AxisType.Manual for n in manual_axes})
    trace = RefsimTrace(Context(nm=mesh.ndim, mesh=mesh, extra=extra), manual_mesh, check)
    tracers = [trace.wrap(v, a) for v, a in zip(args_stacked, in_avals)]
    axis_env = [(n, s) for n, s in zip(mesh.axis_names, mesh.axis_sizes) if n in manual_axes]
    with core.set_current_trace(trace), core.extend_axis_env_nd(axis_env), \
            compat.use_abstract_mesh(manual_mesh), compat.check_vma_context(check):
        out = f(*tracers)
    leaves, tree = jax.tree_util.tree_flatten(out)
    return [trace.lift(x)[0] for x in leaves], tree


def local_aval(x_stacked, nm, spec, manual_mesh_of, check):
    """The per-device aval of a shard_map argument: its block's shape and dtype, varying over the
    manual axes its in_spec names (JAX's `_spec_to_vma`), on the manual abstract mesh."""
    core, _, NamedSharding = _jax()
    local = x_stacked.shape[nm:]
    dtype = compat.jax_key_dtype(x_stacked.dtype) or x_stacked.dtype
    varying = frozenset(spec.used_axes()) if check else frozenset(manual_mesh_of.axis_names)
    aval = core.ShapedArray(local, dtype)
    from jax.sharding import PartitionSpec

    sharding = NamedSharding(manual_mesh_of, PartitionSpec(*([None] * len(local))))
    return compat.aval_with_mat(aval, sharding, varying if check else frozenset())
