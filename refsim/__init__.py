"""refsim: a pure-NumPy reference engine for JAX collectives and sharding layouts."""
from refsim.errors import ReplicationError, UnsupportedPrimitive
from refsim.layouts import AbstractMesh, AxisType, Mesh

__all__ = ["AbstractMesh", "AxisType", "Mesh", "ReplicationError", "UnsupportedPrimitive"]
