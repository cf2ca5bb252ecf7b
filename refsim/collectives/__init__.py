"""refsim's collective engine: every JAX collective over mesh-major stacked arrays.

`refsim.collectives.<name>` are the user-facing functions with jax.lax's names and
signatures plus `mesh=`; the primitive kernels (params exactly as JAX binds them)
live in the submodules: groups (who talks to whom), reductions, gather, scatter,
alltoall, permute, ragged, p2p, asyncs and vma (manual-axis type rules).
"""
from refsim.collectives.api import (
    all_gather, all_gather_done, all_gather_invariant, all_gather_reduced, all_gather_start,
    all_to_all, all_to_all_done, all_to_all_start, axis_index, axis_size, pargmax, pargmin,
    pbroadcast, pbroadcast_done, pbroadcast_start, pcast, pmax, pmean, pmin, ppermute,
    ppermute_done, ppermute_start, precv, preduced, psend, pshuffle, psum, psum_done,
    psum_invariant, psum_scatter, psum_scatter_done, psum_scatter_start, psum_start, pswapaxes,
    pvary, ragged_all_to_all, reduced_vary_cast, unreduced_pmax, unreduced_pmin,
    unreduced_psum, unreduced_psum_scatter, vary_unreduced_cast,
)
from refsim.collectives.asyncs import Future
from refsim.collectives.groups import device_groups, replica_groups
from refsim.collectives.p2p import SendToken
from refsim.collectives.vma import Mat

__all__ = [
    "Future", "Mat", "SendToken", "all_gather", "all_gather_done", "all_gather_invariant",
    "all_gather_reduced", "all_gather_start", "all_to_all", "all_to_all_done", "all_to_all_start",
    "axis_index", "axis_size", "device_groups", "pargmax", "pargmin", "pbroadcast",
    "pbroadcast_done", "pbroadcast_start", "pcast", "pmax", "pmean", "pmin", "ppermute",
    "ppermute_done", "ppermute_start", "precv", "preduced", "psend", "pshuffle", "psum",
    "psum_done", "psum_invariant", "psum_scatter", "psum_scatter_done", "psum_scatter_start",
    "psum_start", "pswapaxes", "pvary", "ragged_all_to_all", "reduced_vary_cast",
    "replica_groups", "unreduced_pmax", "unreduced_pmin", "unreduced_psum",
    "unreduced_psum_scatter", "vary_unreduced_cast",
]
