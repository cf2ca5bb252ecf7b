"""How MPMD resharding batches its work: pure functions of array sizes, shared by both backends.

Resharding a pytree at once needs memory for every intermediate at the same time, so
jaxpp splits the work into batches whose total size stays under a byte threshold. The
order and the batching are pure functions of the sizes, so refsim and xla_backend (and
every process of a multi-process run) compute the same plan.
"""
from __future__ import annotations

from typing import Sequence


def check_threshold(threshold) -> int | None:
    """`threshold` (a byte count >= 0, or None for "no limit") as an int, validated as both
    backends' MPMD resharding take it: TypeError for a non-integer, ValueError for a negative one."""
    if threshold is None:
        return None
    if isinstance(threshold, bool) or not isinstance(threshold, int) and not hasattr(threshold, "__index__"):
        raise TypeError(
            f"threshold must be an int number of bytes or None, got {threshold!r} of type "
            f"{type(threshold).__name__}; pass e.g. threshold=1 << 30."
        )
    threshold = int(threshold)
    if threshold < 0:
        raise ValueError(f"threshold={threshold} is negative; give a byte count >= 0 (0 puts every array in its own batch).")
    return threshold


def group_by_size_threshold(sizes: Sequence[int], threshold: int) -> list[list[int]]:
    """Consecutive groups of indices into `sizes`, each summing to at most `threshold` where possible.

    Sequential, as jaxpp's `_group_by_size_threshold`: entry i joins the current group
    unless that would make the group's total pass `threshold` and the group is not
    empty; then a new group starts with it (an entry larger than `threshold` gets a
    group of its own). `threshold=0` gives one group per entry of positive size.
    """
    threshold = check_threshold(threshold)
    if threshold is None:
        raise TypeError("group_by_size_threshold needs an int threshold, got None.")
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, size in enumerate(sizes):
        if isinstance(size, bool) or int(size) != size or size < 0:
            raise ValueError(f"sizes[{i}]={size!r} is not a byte count; every size must be an int >= 0.")
        if current and total + size > threshold:
            groups.append(current)
            current, total = [], 0
        current.append(i)
        total += int(size)
    if current:
        groups.append(current)
    return groups


def interleaved_order(sizes: Sequence[int], keys: Sequence[int]) -> list[int]:
    """Indices ordered round-robin over MPMD groups, largest first within each group.

    `keys[i]` is the group entry i is sent to (jaxpp: the smallest of its mesh_ids).
    Round r takes the r-th largest entry of every group, groups in ascending order;
    equal sizes keep index order. Interleaving spreads each batch over all groups.
    """
    if len(sizes) != len(keys):
        raise ValueError(f"sizes has {len(sizes)} entries but keys has {len(keys)}; give one key per size.")
    by_key: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        by_key.setdefault(int(k), []).append(i)
    queues = [sorted(v, key=lambda i: (-sizes[i], i)) for _, v in sorted(by_key.items())]
    order: list[int] = []
    for r in range(max((len(q) for q in queues), default=0)):
        order.extend(q[r] for q in queues if r < len(q))
    return order


def largest_first_order(sizes: Sequence[int]) -> list[int]:
    """Indices by decreasing size, equal sizes in index order (mpmd_to_spmd_reshard's order)."""
    return sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))


def batches(order: Sequence[int], sizes: Sequence[int], threshold) -> list[list[int]]:
    """The batches (lists of original indices) of `order` under `threshold`; None: one batch."""
    threshold = check_threshold(threshold)
    if not order:
        return []
    if threshold is None:
        return [list(order)]
    return [[order[j] for j in g] for g in group_by_size_threshold([sizes[i] for i in order], threshold)]


def spmd_to_mpmd_plan(shard_bytes: Sequence[int], keys: Sequence[int], mpmd_dim: int, threshold) -> list[list[int]]:
    """Batches of spmd_to_mpmd_reshard: interleaved order, each entry weighing shard bytes x mpmd_dim.

    The weight is the intermediate's footprint: the array replicated over all MPMD groups.
    """
    weights = [int(b) * int(mpmd_dim) for b in shard_bytes]
    return batches(interleaved_order(weights, keys), weights, threshold)


def mpmd_to_spmd_plan(shard_bytes: Sequence[int], mpmd_dim: int, threshold) -> list[list[int]]:
    """Batches of mpmd_to_spmd_reshard: largest first, each entry weighing local shard bytes x mpmd_dim
    (the logically stacked intermediate)."""
    weights = [int(b) * int(mpmd_dim) for b in shard_bytes]
    return batches(largest_first_order(weights), weights, threshold)
