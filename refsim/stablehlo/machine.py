"""The evaluation loop: run a compiled module's functions on stacked per-device values.

Every value is one ndarray whose first dimension is the device: size N (replicas x
partitions, device d = replica * num_partitions + partition, StableHLO's process order) or
size 1 (the same on every device). The loop itself does no per-device work; each rule is
O(1) NumPy calls over all devices.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from refsim.layouts.mesh import Mesh
from refsim.stablehlo import plan as P
from refsim.stablehlo.registry import OPS, UnsupportedOp, load, op_key

# The one axis of refsim's collective kernels: all devices, in process order.
DEVICE_AXIS = "devices"


class Machine:
    """Evaluates a `plan.Program` over `num_replicas * num_partitions` virtual devices.

    `probe(op, outs)`, when given, is called after every op (at any nesting depth); when it
    returns a list, those values replace the op's results for the rest of the evaluation.
    """

    def __init__(self, program: P.Program, *, num_partitions: int, num_replicas: int = 1,
                 probe: Callable[[Any, list], None] | None = None):
        from refsim.interpreter.registry import Context, load_rules

        load_rules()
        load()
        self.program = program
        self.num_partitions = int(num_partitions)
        self.num_replicas = int(num_replicas)
        self.n = self.num_partitions * self.num_replicas
        self.mesh = Mesh((self.n,), (DEVICE_AXIS,))
        # refsim's jaxpr rules see one mesh dimension: the device axis
        self.ctx = Context(nm=1, mesh=self.mesh, extra={"fallback": False, "strict": False, "replication": []})
        self.probe = probe

    # -- functions and blocks --------------------------------------------------------------

    def call(self, name: str, args: Sequence[np.ndarray]) -> list:
        try:
            fn = self.program.funcs[name]
        except KeyError:
            raise ValueError(f"refsim.stablehlo: call to unknown function @{name}; the module defines "
                             f"{sorted(self.program.funcs)}.") from None
        return self.run_block(fn.body, args, {})

    def run_block(self, block: P.Block, args: Sequence[np.ndarray], env: dict) -> list:
        """Run `block` with its arguments bound to `args` in `env` (shared with enclosing blocks,
        whose values StableHLO regions may read); returns the terminator's operands."""
        if len(args) != len(block.args):
            raise TypeError(f"refsim.stablehlo: block takes {len(block.args)} arguments, got {len(args)}.")
        for slot, val in zip(block.args, args):
            env[slot] = val
        probe = self.probe
        for op in block.ops:
            rule = op.rule
            if rule is None:
                rule = op.rule = self.rule_for(op)
            out = rule(self, op, env, *[env[s] for s in op.operands])
            if len(op.results) == 1 and not isinstance(out, list):
                env[op.results[0]] = out
                outs = [out]
            else:
                outs = list(out)
                for slot, val in zip(op.results, outs):
                    env[slot] = val
            if probe is not None:
                replaced = probe(op, outs)
                if replaced is not None:  # the probe substitutes the op's results (a debugger's anchor)
                    outs = list(replaced)
                    for slot, val in zip(op.results, outs):
                        env[slot] = val
        return [env[s] for s in block.returns]

    def region(self, op: P.Op, i: int, args: Sequence[np.ndarray], env: dict) -> list:
        return self.run_block(op.regions[i], args, env)

    def scalar_region(self, op: P.Op, i: int, args: Sequence[np.ndarray], env: dict) -> list:
        """Region `i` of `op`, whose arguments are scalars (a reduction body, a comparator, an
        update computation), applied elementwise to arrays of any shape: the arguments are
        broadcast together and flattened onto the leading axis, so every rule in the body (a
        bitcast or reshape of a scalar included) sees one scalar per row; one call for all."""
        arrays = np.broadcast_arrays(*[np.asarray(a) for a in args])
        shape = arrays[0].shape if arrays else ()
        flat = [a.reshape((-1,)) for a in arrays]
        outs = self.run_block(op.regions[i], flat, env)
        return [np.broadcast_to(np.asarray(o), (int(np.prod(shape, dtype=np.int64)),)).reshape(shape) for o in outs]

    @staticmethod
    def rule_for(op: P.Op):
        key = op_key(op)
        rule = OPS.get(key)
        if rule is None:
            raise UnsupportedOp(key, op.loc.source)
        return rule

    # -- helpers rules share ---------------------------------------------------------------

    def lift(self, value) -> np.ndarray:
        """A device-invariant value: a leading size-1 device dimension (a view)."""
        a = np.asarray(value)
        return a.reshape((1,) + a.shape)

    def full(self, x: np.ndarray) -> np.ndarray:
        """`x` with its device dimension broadcast to N (a view)."""
        return x if x.shape[0] == self.n else np.broadcast_to(x, (self.n,) + x.shape[1:])


def missing_ops(program: P.Program) -> dict[str, str]:
    """{op name: source of its first use} for every op in `program` without a rule (computed once)."""
    load()
    cached = getattr(program, "_missing", None)
    if cached is not None:
        return cached
    out: dict[str, str] = {}
    for fn in program.funcs.values():
        for op in P.walk(fn.body):
            key = op_key(op)
            if key not in OPS and key not in out:
                out[key] = op.loc.source or op.text[:80]
    program._missing = out
    return out
