"""refsim.stablehlo: an interpreter of StableHLO modules over virtual devices.

It runs the module JAX lowers for a program and the per-device module XLA compiles from it
on the same stacked arrays and collective kernels as refsim's jaxpr interpreter, so the
stages of a miscompile can be told apart (`conformance.explain`).

>>> import refsim.stablehlo as sh
>>> outs = sh.interpret(module_text, *global_args)              # doctest: +SKIP
>>> per_device = sh.hlo_module_to_stablehlo(jax.jit(f).lower(*args).compile())  # doctest: +SKIP
>>> outs = sh.interpret(per_device, *shards, per_device=True, num_partitions=8)  # doctest: +SKIP
"""
from refsim.stablehlo.api import coverage, interpret, load
from refsim.stablehlo.hlo_text import hlo_module_to_stablehlo
from refsim.stablehlo.registry import UnsupportedOp

__all__ = ["UnsupportedOp", "coverage", "hlo_module_to_stablehlo", "interpret", "load"]
