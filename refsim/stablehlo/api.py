"""`refsim.stablehlo.interpret`: run a StableHLO module over virtual devices.

Two views of one program are supported. The module JAX lowers (`jax.jit(f).lower(*args)
.compiler_ir("stablehlo")`) takes global arguments; its `sdy.manual_computation` regions run
per device. XLA's compiled module (`refsim.stablehlo.hlo_module_to_stablehlo(compiled)`) is
SPMD-partitioned: every device runs it on its own shard with its own `partition_id`, so its
arguments are per-device stacks. Either way the results are stacked: leading dimension N
(one entry per device) or 1 (the same on every device).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from refsim.stablehlo import plan as P
from refsim.stablehlo.machine import Machine, missing_ops
from refsim.stablehlo.registry import UnsupportedOp


def load(module) -> P.Program:
    """A compiled `plan.Program` of `module` (StableHLO text, bytecode, an `ir.Module`, or a Program)."""
    return module if isinstance(module, P.Program) else P.compile_module(module)


def coverage(module) -> dict[str, str]:
    """{op name: where it is first used} for every op of `module` refsim.stablehlo cannot run
    (empty when it runs the whole module). Custom calls are named by their target."""
    return missing_ops(load(module))


def _counts(program: P.Program, num_partitions, num_replicas) -> tuple[int, int]:
    a = program.attrs
    parts = num_partitions if num_partitions is not None else a.get("mhlo.num_partitions")
    reps = num_replicas if num_replicas is not None else a.get("mhlo.num_replicas", 1)
    if parts is None:
        raise ValueError("num_partitions is not recorded in this module (XLA's compiled module keeps it in "
                         "its config); pass num_partitions=, e.g. the number of devices the program ran on.")
    return int(parts), int(reps)


def interpret(module, *args, per_device: bool = False, num_partitions: int | None = None,
              num_replicas: int | None = None, probe: Callable[[Any, list], None] | None = None) -> list:
    """Evaluate `module`'s main function on virtual devices; returns stacked results.

    per_device=False: each argument is one global value (the lowered module's view).
    per_device=True: each argument is stacked, leading dimension N = replicas x partitions (or
    1 for the same value everywhere): device d's own parameter (the compiled module's view).
    Raises `UnsupportedOp` naming every op the module uses that has no rule. `probe(op, outs)`
    is called after every op; a list it returns replaces the op's results.
    """
    program = load(module)
    missing = missing_ops(program)
    if missing:
        names = ", ".join(f"{k} (at {v})" for k, v in missing.items())
        err = UnsupportedOp(next(iter(missing)), next(iter(missing.values())))
        err.args = (f"refsim.stablehlo cannot run this module: no rule for {names}. Add rules in "
                    "refsim/stablehlo/ops/.",)
        err.missing = missing
        raise err
    parts, reps = _counts(program, num_partitions, num_replicas)
    main = program.main
    if len(args) != len(main.arg_types):
        raise TypeError(f"@{main.name} takes {len(main.arg_types)} arguments, got {len(args)}.")
    n = parts * reps
    vals = []
    for i, (a, t) in enumerate(zip(args, main.arg_types)):
        a = np.asarray(a)
        if not per_device:
            a = a.reshape((1,) + a.shape)
        if a.shape[1:] != t.shape or a.shape[0] not in (1, n):
            want = f"({n} or 1, *{t.shape})" if per_device else str(t.shape)
            raise ValueError(f"argument {i} has shape {a.shape[1:] if not per_device else a.shape}, but "
                             f"@{main.name} takes {want}" + ("; with per_device=True give each device's shard "
                                                              "stacked on a leading axis." if per_device else "."))
        if t.dtype is not None and a.dtype != t.dtype:
            raise TypeError(f"argument {i} has dtype {a.dtype}, but @{main.name} takes {t.dtype}; cast it.")
        vals.append(a)
    m = Machine(program, num_partitions=parts, num_replicas=reps, probe=probe)
    return m.call(main.name, vals)


__all__ = ["coverage", "interpret", "load", "UnsupportedOp"]
