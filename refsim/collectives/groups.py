"""Who talks to whom: (mesh, axis names, axis_index_groups) -> device groups.

Every collective in refsim goes through `device_groups` (the StableHLO reference
interpreter keeps the same split: replica groups are computed in one place, each
collective only says what is computed) and through `GroupLayout`, which moves a
stacked value's named mesh axes to one leading "linear index" axis and back.
"""
from __future__ import annotations

import math
import operator

import numpy as np


def normalize_axis_name(axis_name, api: str = "collective") -> tuple:
    """`axis_name` as a tuple of names, as JAX normalises a name or a tuple/list of names."""
    if isinstance(axis_name, (tuple, list)):
        names = tuple(axis_name)
    else:
        return (axis_name,)
    if len(names) < 2:
        return names
    dupes = sorted({str(n) for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(
            f"{api}: axis_name={names!r} names axis {dupes[0]!r} more than once; "
            "name each mesh axis at most once."
        )
    return names


def normalize_axis_index_groups(axis_index_groups, api: str = "collective") -> tuple | None:
    """`axis_index_groups` read once into a tuple of tuples of ints (None stays None).

    Any iterable of iterables is accepted and consumed exactly once here, so a generator
    works like a list. An empty list of groups, or an empty group, is a ValueError (JAX's
    lowering rejects both: "replica groups should be a rank 2 tensor", "Instruction cannot
    have an empty replica group"); non-integer members are a TypeError.
    """
    if axis_index_groups is None:
        return None
    try:
        groups = tuple(tuple(operator.index(i) for i in g) for g in axis_index_groups)
    except TypeError:
        raise TypeError(
            f"{api}: axis_index_groups={axis_index_groups!r} must be a list of lists of ints, "
            "e.g. [[0, 1], [2, 3]]."
        ) from None
    if not groups:
        raise ValueError(
            f"{api}: axis_index_groups={axis_index_groups!r} holds no group; pass None for one "
            "group over the whole axis, or groups like [[0, 1], [2, 3]]."
        )
    empty = [k for k, g in enumerate(groups) if not g]
    if empty:
        raise ValueError(
            f"{api}: axis_index_groups={groups!r} has an empty group at position {empty[0]}; "
            "every group needs at least one axis index (XLA rejects empty replica groups)."
        )
    return groups


def _axis_positions(mesh, names: tuple, api: str) -> tuple[int, ...]:
    out = []
    for n in names:
        if n not in mesh.axis_names:
            raise NameError(
                f"Found an unbound axis name: {n!r} (axis_name={names!r}) in {api}. The mesh "
                f"has axes {tuple(mesh.axis_names)!r}; use one of them, or call {api} under a "
                "shard_map/pmap that binds the axis."
            )
        out.append(mesh.axis_names.index(n))
    return tuple(out)


def group_size_total(mesh, axis_name) -> int:
    """Number of devices along the named axes (the product of their sizes)."""
    names = normalize_axis_name(axis_name)
    pos = _axis_positions(mesh, names, "axis_size")
    return int(np.prod([mesh.axis_sizes[p] for p in pos], dtype=np.int64))


def device_groups(mesh, axis_name, axis_index_groups=None, *, equal_sizes: bool = False,
                  api: str = "collective") -> list[np.ndarray] | np.ndarray:
    """Groups of linear indices over the named axes, in the given axis order.

    The linear index of a device is its row-major index over `axis_name` taken in the
    order given (JAX's `axis_index` of a tuple, and the order of `pxla.axis_groups`).
    Without `axis_index_groups` there is one group holding 0..K-1 (K = product of the
    axis sizes); with them, each entry is one group, members in the given order (that
    order is the "position in the group" used by all_gather, psum_scatter, all_to_all).
    Groups must cover 0..K-1 exactly once (ValueError, as JAX's
    `_validate_reduce_axis_index_groups`); with `equal_sizes=True` they must also be
    equally sized (ValueError, as JAX's lowering "Replica groups must be equally sized").

    Returns an int64 array of shape (num_groups, group_size) when all groups have one
    size, else a list of 1-D int64 arrays.
    """
    names = normalize_axis_name(axis_name, api)
    pos = _axis_positions(mesh, names, api)
    k = int(np.prod([mesh.axis_sizes[p] for p in pos], dtype=np.int64))
    if axis_index_groups is None:
        return np.arange(k, dtype=np.int64).reshape(1, k)
    groups = normalize_axis_index_groups(axis_index_groups, api)
    axis_index_groups = groups  # a generator is consumed above; show what it held
    flat = [i for g in groups for i in g]
    if sorted(flat) != list(range(k)):
        raise ValueError(
            f"{api}: axis_index_groups must cover all indices exactly once: got "
            f"axis_index_groups={axis_index_groups!r} for axis_name={names!r} of size {k}; "
            f"give groups that together hold each of 0..{k - 1} once."
        )
    sizes = {len(g) for g in groups}
    if len(sizes) == 1:
        return np.asarray(groups, dtype=np.int64)
    if equal_sizes:
        raise ValueError(
            f"{api}: axis_index_groups must all be the same size, got sizes "
            f"{[len(g) for g in groups]} in axis_index_groups={axis_index_groups!r}; "
            "this collective needs equally sized groups."
        )
    return [np.asarray(g, dtype=np.int64) for g in groups]


def sized_groups(mesh, names: tuple, axis_index_groups, axis_size: int, api: str) -> np.ndarray:
    """Equal-sized groups whose size must equal the `axis_size` param JAX bound (gather/scatter)."""
    groups = device_groups(mesh, names, axis_index_groups, equal_sizes=True, api=api)
    gs = groups.shape[1]
    if axis_size != gs:
        raise ValueError(
            f"{api}: axis_size={axis_size} but the group size over axis_name={names!r} "
            f"is {gs}; pass axis_size={gs}."
        )
    return groups


def replica_groups(mesh, axis_name, axis_index_groups=None) -> list[list[int]]:
    """Device ids of each group, as the replica groups JAX's lowering emits.

    One list per (group of the other axes, axis_index_group), in the order of
    `jax._src.lax.parallel._replica_groups`, with the mesh's own device ids.
    """
    names = normalize_axis_name(axis_name)
    pos = _axis_positions(mesh, names, "replica_groups")
    ids = np.asarray(getattr(mesh, "device_ids", np.arange(mesh.size).reshape(mesh.axis_sizes)))
    moved = np.moveaxis(ids, pos, tuple(range(len(pos))))
    k = int(np.prod(moved.shape[: len(pos)], dtype=np.int64))
    by_axis = moved.reshape(k, -1).T  # (other devices, K) in given-axis linear order
    groups = device_groups(mesh, names, axis_index_groups)
    return [[int(row[i]) for i in g] for row in by_axis for g in groups]


# (mesh shape, axis names) -> what GroupLayout derives from them: collectives build one per equation,
# and a pvary only checks its names, so the derivation is kept once per pair (a successful one only)
_DERIVED: dict = {}


class GroupLayout:
    """A stacked value viewed as (K, *other mesh dims, *local) with K the named axes.

    `to_k(x)` broadcasts size-1 named mesh dims, moves the named axes (given order) to
    the front and merges them into one linear-index axis; `from_k(y, k_dims)` undoes it
    for a result whose leading axis is either K (varying) or 1 (same on every member).
    """

    def __init__(self, mesh, axis_name, api: str = "collective"):
        self.mesh = mesh
        self.names = normalize_axis_name(axis_name, api)
        key = (mesh.axis_sizes, mesh.axis_names, self.names)   # tuples of ints and names: cheap to hash
        try:
            self.pos, self.nm, self.sizes, self.k, self.others = _DERIVED[key]
            return
        except KeyError:
            pass
        except TypeError:  # an unhashable axis name: JAX's own check names it
            key = None
        self.pos = _axis_positions(mesh, self.names, api)
        self.nm = mesh.ndim
        self.sizes = tuple(mesh.axis_sizes[p] for p in self.pos)
        self.k = math.prod(self.sizes)   # Python ints: no overflow, and a fraction of np.prod's cost
        self.others = tuple(i for i in range(self.nm) if i not in self.pos)
        if key is not None:
            if len(_DERIVED) >= 4096:   # bounded: many meshes in one process
                _DERIVED.clear()
            _DERIVED[key] = (self.pos, self.nm, self.sizes, self.k, self.others)

    def check(self, x: np.ndarray, api: str) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim < self.nm or any(
            s not in (1, m) for s, m in zip(x.shape[: self.nm], self.mesh.axis_sizes)
        ):
            raise ValueError(
                f"{api}: x has shape {x.shape} but a stacked value on mesh "
                f"{dict(self.mesh.shape)} needs {self.nm} leading mesh dims of sizes "
                f"{self.mesh.axis_sizes} (or 1 where the value is invariant)."
            )
        return x

    def to_k(self, x: np.ndarray) -> np.ndarray:
        shape = list(x.shape)
        for p in self.pos:
            shape[p] = self.mesh.axis_sizes[p]
        if tuple(shape) != x.shape:
            x = np.broadcast_to(x, shape)
        perm = self.pos + self.others + tuple(range(self.nm, x.ndim))
        x = x.transpose(perm)
        return x.reshape((self.k,) + x.shape[len(self.pos):])

    def from_k(self, y: np.ndarray) -> np.ndarray:
        lead = self.sizes if y.shape[0] == self.k else (1,) * len(self.pos)
        y = y.reshape(lead + y.shape[1:])
        perm = self.pos + self.others
        inv = [0] * self.nm
        for i, p in enumerate(perm):
            inv[p] = i
        return y.transpose(tuple(inv) + tuple(range(self.nm, y.ndim)))


def member_index(groups: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """For each linear index 0..K-1: (its group number, its position in the group)."""
    g = np.empty(k, dtype=np.int64)
    j = np.empty(k, dtype=np.int64)
    ng, gs = groups.shape
    g[groups.ravel()] = np.repeat(np.arange(ng), gs)
    j[groups.ravel()] = np.tile(np.arange(gs), ng)
    return g, j
