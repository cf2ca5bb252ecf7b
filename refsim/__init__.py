"""refsim: a pure-NumPy reference engine for JAX collectives and sharding layouts."""
from refsim.errors import DuplicateSpecError, IndivisibleError, ReplicationError, UnsupportedPrimitive
from refsim.layouts import UNCONSTRAINED, AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec
from refsim.layouts import PmapSharding, SingleDeviceSharding
from refsim.layouts import HloSharding
from refsim.array import Array, Shard, device_put, make_array_from_callback, make_array_from_single_device_arrays
from refsim.visualize import render_device_grid, visualize
from refsim.blas import set_blas_threads

P = PartitionSpec

_PROGRAM_ENTRY_POINTS = ("shard_map", "pmap", "jit", "eval_jaxpr", "evaluate")


def __getattr__(name):
    # Program entry points import JAX, so they load on first use; layouts stay JAX-free.
    if name in _PROGRAM_ENTRY_POINTS:
        from refsim.interpreter import api

        return getattr(api, name)
    raise AttributeError(f"module 'refsim' has no attribute {name!r}")

__all__ = [
    "AbstractMesh", "AxisType", "DuplicateSpecError", "IndivisibleError", "Mesh", "NamedSharding",
    "P", "PartitionSpec", "ReplicationError", "UNCONSTRAINED", "UnsupportedPrimitive",
    "Array", "Shard", "device_put", "make_array_from_callback", "make_array_from_single_device_arrays",
    "PmapSharding", "SingleDeviceSharding", "HloSharding", "visualize", "render_device_grid",
    "shard_map", "pmap", "jit", "eval_jaxpr", "evaluate", "set_blas_threads",
]
