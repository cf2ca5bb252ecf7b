"""What a conformance case is: its program, the hand-written corpus, and its reproducer.

* `program`  the case types `Program` and `CollectiveCall` (data, not closures: the function is
             source text, so refsim, XLA and the reproducer run the same code) and mesh naming;
* `source`   Python source text for meshes, specs, arrays and indices;
* `corpus`   hand-written programs (control flow, autodiff, training steps, pmap, PRNG, ...);
* `repro`    the standalone reproducer file of a failing case (format v1, JAX and NumPy only).

The case types and their helpers are importable from here (`conformance.cases.Program`).
"""
from conformance.cases.program import (
    DEVICE_ORDERS, ENTRIES, CollectiveCall, Program, compile_source, device_order, mesh_id,
)
from conformance.cases.source import mesh_source, spec_source
from conformance.verdict.reductions import group_members, local_blocks, reduction_terms, sum_bound_for

__all__ = ["CollectiveCall", "DEVICE_ORDERS", "ENTRIES", "Program", "compile_source", "device_order",
           "group_members", "local_blocks", "mesh_id", "mesh_source", "reduction_terms", "spec_source",
           "sum_bound_for"]
