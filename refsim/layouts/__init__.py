"""Sharding layouts, pure Python + NumPy: importing this package needs no device."""
from refsim.layouts.mesh import AbstractMesh, AxisType, Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import UNCONSTRAINED, PartitionSpec

__all__ = ["AbstractMesh", "AxisType", "Mesh", "NamedSharding", "PartitionSpec", "UNCONSTRAINED"]
