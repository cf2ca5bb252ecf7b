"""MPMD pipeline layouts (NVIDIA jaxpp's): MpmdMesh, MpmdSharding, MpmdArray and SPMD <-> MPMD resharding."""
from refsim.mpmd.array import MpmdArray, MpmdArrayBase
from refsim.mpmd.mesh import MpmdMesh, MpmdSharding, canonical_spec, filter_axes
from refsim.mpmd.plan import group_by_size_threshold, interleaved_order, mpmd_to_spmd_plan, spmd_to_mpmd_plan
from refsim.mpmd.reshard import logically_stacked, mpmd_to_spmd_reshard, spmd_to_mpmd_reshard

__all__ = ["MpmdArray", "MpmdArrayBase", "MpmdMesh", "MpmdSharding", "canonical_spec", "filter_axes",
           "group_by_size_threshold", "interleaved_order", "logically_stacked", "mpmd_to_spmd_plan",
           "mpmd_to_spmd_reshard", "spmd_to_mpmd_plan", "spmd_to_mpmd_reshard"]
