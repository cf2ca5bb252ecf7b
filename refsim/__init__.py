"""refsim: a pure-NumPy reference engine for JAX collectives and sharding layouts."""
from refsim.errors import DuplicateSpecError, IndivisibleError, ReplicationError, UnsupportedPrimitive
from refsim.layouts import UNCONSTRAINED, AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

P = PartitionSpec

__all__ = [
    "AbstractMesh", "AxisType", "DuplicateSpecError", "IndivisibleError", "Mesh", "NamedSharding",
    "P", "PartitionSpec", "ReplicationError", "UNCONSTRAINED", "UnsupportedPrimitive",
]
