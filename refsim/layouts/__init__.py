"""Sharding layouts, pure Python + NumPy: importing this package needs no device."""
from refsim.layouts.mesh import AbstractMesh, AxisType, Mesh
from refsim.layouts.hlo_sharding import HloSharding, hlo_to_named, named_to_hlo
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import UNCONSTRAINED, PartitionSpec
from refsim.layouts.pmap_spec import (
    Chunked, NoSharding, PmapSharding, Replicated, ShardedAxis, ShardingSpec, Unstacked, pmap_sharding_spec,
    spec_to_indices,
)
from refsim.layouts.single_device import SingleDeviceSharding

__all__ = ["AbstractMesh", "AxisType", "Mesh", "NamedSharding", "PartitionSpec", "UNCONSTRAINED",
           "Chunked", "NoSharding", "PmapSharding", "Replicated", "ShardedAxis", "ShardingSpec", "Unstacked",
           "pmap_sharding_spec", "spec_to_indices", "SingleDeviceSharding",
           "HloSharding", "hlo_to_named", "named_to_hlo"]
