"""Public hypothesis strategies for the conformance suite, in the style of hypothesis.extra.numpy.

Every strategy takes keyword-only options, validates its arguments up front (raising
`hypothesis.errors.InvalidArgument`), accepts values or strategies, and draws only inputs
that JAX accepts. See docs/strategies.md.
"""
from conformance.strategies.arrays import arrays, dtypes
from conformance.strategies.collectives import (
    COLLECTIVES, GROUP_KINDS, PERM_KINDS, axis_index_groups, collective_calls, groups_kind, perm_kind,
    permutations,
)
from conformance.strategies.meshes import meshes
from conformance.strategies.programs import FAMILIES, programs
from conformance.strategies.sharded import CLASSES, OPS, ShardedProgram, sharded_programs
from conformance.strategies.specs import partition_specs, sharded_shapes

__all__ = [
    "CLASSES", "COLLECTIVES", "FAMILIES", "GROUP_KINDS", "PERM_KINDS", "arrays", "axis_index_groups",
    "collective_calls", "dtypes", "groups_kind", "meshes", "OPS", "partition_specs", "perm_kind", "permutations",
    "programs",
    "ShardedProgram", "sharded_programs", "sharded_shapes",
]
