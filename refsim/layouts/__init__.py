"""Sharding layouts, pure Python + NumPy: importing this package needs no device."""
from refsim.layouts.mesh import AbstractMesh, AxisType, Mesh

__all__ = ["AbstractMesh", "AxisType", "Mesh"]
