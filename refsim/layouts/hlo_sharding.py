"""`HloSharding`: XLA's sharding annotation, with its text form, in NumPy.

A tiled sharding is a *tile assignment*: an int array whose shape gives the
number of tiles per array dimension (plus trailing subgroup dimensions) and
whose entries are logical device ids, i.e. positions in the computation's
device assignment (for a JAX `NamedSharding`, positions in `mesh.devices.flat`).
The array is written either explicitly (`devices=[2,2]3,1,0,2`) or in iota form
(`devices=[4,2]<=[2,4]T(1,0)`: `arange(8).reshape(2,4).transpose(1,0).reshape(4,2)`).

Every constructor normalises as XLA's `HloSharding` does (`xla/hlo/ir/hlo_sharding.cc`:
`PartialTile` sorts each replication group, `Subgroup` merges and orders subgroup
dimensions manual < unreduced < replicated, iota forms are kept canonical), so
`str()` equals the text XLA prints for the same sharding, and `named_to_hlo`
equals JAX's `NamedSharding._to_xla_hlo_sharding`.
"""
from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np

from refsim.layouts.tiling import block_shape

# XLA orders subgroup types MAXIMAL, TUPLE, OTHER, MANUAL, UNREDUCED, REPLICATED, UNKNOWN;
# only these three can appear in `last_tile_dims`.
SUBGROUP_TYPES = ("manual", "unreduced", "replicated")
_TYPE_ORDER = {t: i for i, t in enumerate(SUBGROUP_TYPES)}


# ----------------------------------------------------------------------------- iota forms
def _canonical_iota(reshape_dims, perm) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Drop size-1 reshape dims and merge runs of consecutive transpose entries (XLA's canonical iota)."""
    dims, perm = list(reshape_dims), list(perm)
    while True:
        keep = [i for i, d in enumerate(dims) if d != 1]
        renumber = {old: new for new, old in enumerate(keep)}
        dims = [dims[i] for i in keep]
        perm = [renumber[p] for p in perm if p in renumber]
        merged = False
        i = 0
        while i + 1 < len(perm):
            if perm[i + 1] == perm[i] + 1:  # two reshape dims that stay adjacent: one dim
                a, b = perm[i], perm[i + 1]
                dims[a] *= dims[b]
                dims[b] = 1
                merged = True
                break
            i += 1
        if not merged:
            break
    if not dims:
        return (1,), (0,)
    return tuple(dims), tuple(perm)


def _iota_form(flat: np.ndarray):
    """The canonical (reshape_dims, perm) whose iota equals `flat`, or None if there is none.

    Reads the mixed-radix structure off the values: the minor-most tile axis is
    the longest run 0, s, 2s, ...; the next starts at the end of that block, etc.
    """
    n = flat.size
    if n == 0 or flat[0] != 0:
        return None
    if n == 1:
        return (1,), (0,)
    axes = []  # (size, stride), minor first
    block = 1
    while block < n:
        stride = int(flat[block])
        if stride <= 0:
            return None
        m = 1
        while block * m < n and flat[block * m] == m * stride:
            m += 1
        if n % (block * m):
            return None
        axes.append((m, stride))
        block *= m
    by_stride = sorted(range(len(axes)), key=lambda k: -axes[k][1])
    reshape = tuple(axes[k][0] for k in by_stride)
    pos = {k: i for i, k in enumerate(by_stride)}
    perm = tuple(pos[k] for k in reversed(range(len(axes))))
    if not np.array_equal(np.arange(n).reshape(reshape).transpose(perm).ravel(), flat):
        return None
    return _canonical_iota(reshape, perm)


# Tile assignments are listed (one int64 per device) only on demand; an iota form is kept as
# (reshape_dims, perm) so parsing and printing work at any size. Listing more ids than this is
# refused with a ValueError rather than a MemoryError.
MAX_LISTED_DEVICES = 2**26


def _check_listable(n: int, what) -> None:
    if n > MAX_LISTED_DEVICES:
        raise ValueError(
            f"{what} assigns {n} devices; listing them needs {n * 8} bytes, more than refsim lists "
            f"(at most {MAX_LISTED_DEVICES} devices). Its text, tile dims and iota form are available; "
            "per-device placement needs a smaller sharding."
        )


class TileAssignment:
    """An int array of logical device ids, kept in iota form when it was built as one.

    An iota tile assignment holds only its dims and canonical (reshape_dims, perm): the
    device list is computed the first time `array()` is called, so `{devices=[65536,65536]
    <=[4294967296]}` parses and prints without allocating 32 GiB.
    """

    __slots__ = ("dims", "iota", "_array")

    def __init__(self, dims, array, iota=None):
        self.dims = tuple(int(d) for d in dims)
        self.iota = iota  # (reshape_dims, perm), canonical, or None for an explicit list
        if array is None:
            if iota is None:
                raise ValueError("a TileAssignment needs a device array or an iota form.")
            self._array = None
        else:
            self._array = np.asarray(array, dtype=np.int64).reshape(self.dims)
            self._array.setflags(write=False)

    @classmethod
    def from_iota(cls, dims, reshape_dims, perm) -> "TileAssignment":
        dims, reshape_dims, perm = tuple(dims), tuple(reshape_dims), tuple(perm)
        if any(d < 1 for d in reshape_dims):
            raise ValueError(f"iota reshape dims {list(reshape_dims)} must all be positive.")
        n = math.prod(reshape_dims)
        if sorted(perm) != list(range(len(reshape_dims))):
            raise ValueError(f"transpose perm {list(perm)} is not a permutation of 0..{len(reshape_dims) - 1}.")
        if math.prod(dims) != n:
            raise ValueError(
                f"tile dims {list(dims)} hold {math.prod(dims)} devices but the iota "
                f"reshape dims {list(reshape_dims)} give {n}; their products must match."
            )
        return cls(dims, None, _canonical_iota(reshape_dims, perm))

    @classmethod
    def from_array(cls, array) -> "TileAssignment":
        array = np.asarray(array, dtype=np.int64)
        return cls(array.shape, array, None)

    def array(self) -> np.ndarray:
        """The device ids as an int64 array of shape `dims` (listed now for an iota form)."""
        if self._array is None:
            n = self.num_elements
            _check_listable(n, f"tile assignment {self}")
            reshape, perm = self.iota
            arr = np.arange(n, dtype=np.int64).reshape(reshape).transpose(perm).reshape(self.dims)
            arr.setflags(write=False)
            self._array = arr
        return self._array

    @property
    def num_elements(self) -> int:
        return math.prod(self.dims)

    def with_array(self, dims, array) -> "TileAssignment":
        """Same kind (iota or explicit) holding `array` of shape `dims`; iota only where one exists."""
        array = np.asarray(array).reshape(dims)
        if self.iota is not None:
            form = _iota_form(array.ravel())
            if form is not None:
                return TileAssignment(dims, array, form)
        return TileAssignment(dims, array, None)

    def reshape(self, dims) -> "TileAssignment":
        return TileAssignment(dims, self._array, self.iota)  # the flat order is unchanged

    def __str__(self):
        head = "devices=[" + ",".join(map(str, self.dims)) + "]"
        if self.iota is not None:
            reshape, perm = self.iota
            body = "<=[" + ",".join(map(str, reshape)) + "]"
            if len(reshape) > 1:
                body += "T(" + ",".join(map(str, perm)) + ")"
            return head + body
        return head + ",".join(map(str, self._array.ravel().tolist()))

    def __eq__(self, other):
        """Same dims and the same device at every tile (an iota and an explicit list may be equal)."""
        if not isinstance(other, TileAssignment) or self.dims != other.dims:
            return False
        if self.iota is not None and self.iota == other.iota:
            return True
        if self.iota is not None and other.iota is not None and self.num_elements > MAX_LISTED_DEVICES:
            return False  # distinct canonical iota forms list distinct devices
        return np.array_equal(self.array(), other.array())

    def __hash__(self):
        return hash(self.dims)  # equal assignments have equal dims; listing ids is not needed


# ----------------------------------------------------------------------------- HloSharding
class HloSharding:
    """XLA's HloSharding: `replicated`, `manual`, `unreduced`, `unknown`, `maximal device=N` or a tiling.

    Build one with the class constructors (which normalise as XLA does) or
    `HloSharding.parse(text)`; `str()` prints XLA's text.
    """

    __slots__ = ("kind", "tile_assignment", "replicate_on_last_tile_dim", "subgroup_types", "device")

    def __init__(self, kind, tile_assignment=None, replicate_on_last_tile_dim=False, subgroup_types=(), device=None):
        self.kind = kind
        self.tile_assignment = tile_assignment
        self.replicate_on_last_tile_dim = bool(replicate_on_last_tile_dim)
        self.subgroup_types = tuple(subgroup_types)
        self.device = device

    # -- constructors (XLA's normalisation) -------------------------------------
    @classmethod
    def replicate(cls) -> "HloSharding":
        return cls("replicated")

    @classmethod
    def manual(cls) -> "HloSharding":
        return cls("manual")

    @classmethod
    def unreduced(cls) -> "HloSharding":
        return cls("unreduced")

    @classmethod
    def unknown(cls) -> "HloSharding":
        """A sharding left for the partitioner to choose (`{unknown}`); it places nothing."""
        return cls("unknown")

    @classmethod
    def maximal(cls, device: int) -> "HloSharding":
        """The whole array on one device (`{maximal device=N}`); N is an int64 device id >= 0, as in XLA."""
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)):
            raise TypeError(f"maximal device={device!r} must be an int device id.")
        if not 0 <= int(device) < 2**63:
            raise ValueError(
                f"maximal device={device} is not a device id: XLA's device ids are int64 values >= 0 "
                "(0 <= id < 2**63)."
            )
        return cls("maximal", device=int(device))

    @classmethod
    def tile(cls, tile_assignment: TileAssignment) -> "HloSharding":
        return cls("tiled", tile_assignment)

    @classmethod
    def partial_tile(cls, ta: TileAssignment) -> "HloSharding":
        """Tiled with the last tile dim replicated; devices of each replica group sorted (XLA's PartialTile)."""
        n, group = ta.num_elements, ta.dims[-1]
        if len(ta.dims) == 1 or group == n:
            return cls.replicate()
        if group == 1:
            return cls.tile(ta.reshape(ta.dims[:-1]))
        if ta.iota is not None and ta.iota[0][ta.iota[1][-1]] == group:
            return cls("tiled", ta, True)  # the minor reshape dim is the group: already sorted
        sorted_groups = np.sort(ta.array().reshape(-1, group), axis=1)
        if ta.iota is not None and _can_group_minor_iota(*ta.iota, group):
            return cls("tiled", ta.with_array(ta.dims, sorted_groups), True)
        return cls("tiled", TileAssignment(ta.dims, sorted_groups, None), True)

    @classmethod
    def subgroup(cls, ta: TileAssignment, subgroup_types: Sequence[str]) -> "HloSharding":
        """Tiled with trailing subgroup dims of the given types (XLA's `Subgroup`).

        Size-1 subgroup dims are dropped, dims of one type merged and the types
        ordered manual, unreduced, replicated.
        """
        types = tuple(_check_type(t) for t in subgroup_types)
        if not types:
            return cls.tile(ta)
        data_nd = len(ta.dims) - len(types)
        if data_nd < 0:
            raise ValueError(
                f"last_tile_dims lists {len(types)} subgroup types but the tile assignment "
                f"{list(ta.dims)} has only {len(ta.dims)} dims."
            )
        if len(set(types)) == 1 and math.prod(ta.dims[:data_nd]) == 1:
            return {"manual": cls.manual, "replicated": cls.replicate, "unreduced": cls.unreduced}[types[0]]()
        by_type: dict[str, list[int]] = {}
        needs_merging = False
        for i, t in enumerate(types):
            if ta.dims[data_nd + i] == 1:
                needs_merging = True
                continue
            needs_merging |= t in by_type
            by_type.setdefault(t, []).append(data_nd + i)
        needs_merging |= len(by_type) > 1
        if needs_merging:
            perm = list(range(data_nd))
            merged_dims = list(ta.dims[:data_nd])
            merged_types = []
            for t in SUBGROUP_TYPES:
                if t in by_type:
                    perm += by_type[t]
                    merged_dims.append(math.prod(ta.dims[d] for d in by_type[t]))
                    merged_types.append(t)
            perm += [d for d in range(data_nd, len(ta.dims)) if d not in perm]  # the size-1 dims
            moved = ta.array().transpose(perm)
            if ta.iota is not None and _iota_transpose_stays_iota(ta.dims, *ta.iota, perm):
                ta = ta.with_array(merged_dims, moved)
            else:
                ta = TileAssignment(merged_dims, moved, None)
            types = tuple(merged_types)
            if not types:  # every subgroup dim had size 1
                return cls.tile(ta)
        if len(types) == 1 and types[0] == "replicated":
            return cls.partial_tile(ta)
        if len(types) == 1 and types[0] == "manual" and ta.num_elements == ta.dims[-1]:
            return cls.manual()
        if types[-1] == "replicated":
            base = cls.partial_tile(ta)
            return cls("tiled", base.tile_assignment, False, types)
        return cls("tiled", ta, False, types)

    @classmethod
    def iota_tile(cls, dims, reshape_dims=None, transpose_perm=None, subgroup_types=()) -> "HloSharding":
        """As `xla_client.HloSharding.iota_tile`: tile dims `dims` over an iota of `reshape_dims`."""
        dims = tuple(int(d) for d in dims)
        if reshape_dims is None:
            reshape_dims = (math.prod(dims),)
        if transpose_perm is None:
            transpose_perm = tuple(range(len(reshape_dims)))
        ta = TileAssignment.from_iota(dims, reshape_dims, transpose_perm)
        return cls.subgroup(ta, subgroup_types) if subgroup_types else cls.tile(ta)

    @classmethod
    def parse(cls, text: str) -> "HloSharding":
        """Parse XLA's sharding text, e.g. `{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}`."""
        return _Parser(text).parse()

    # -- queries (names as in xla_client.HloSharding) --------------------------------
    def is_replicated(self) -> bool:
        return self.kind == "replicated"

    def is_manual(self) -> bool:
        return self.kind == "manual"

    def is_unreduced(self) -> bool:
        return self.kind == "unreduced"

    def is_unknown(self) -> bool:
        return self.kind == "unknown"

    def is_maximal(self) -> bool:
        return self.kind == "maximal"

    def is_tiled(self) -> bool:
        return self.kind == "tiled"

    def is_tile_assignment_iota(self) -> bool:
        return self.kind == "tiled" and self.tile_assignment.iota is not None

    @property
    def tile_assignment_dimensions(self) -> tuple[int, ...]:
        if self.kind == "maximal":
            return (1,)
        return self.tile_assignment.dims if self.kind == "tiled" else ()

    @property
    def tile_assignment_devices(self) -> np.ndarray:
        """The tile assignment's device ids in row-major order (int64 ndarray)."""
        if self.kind == "maximal":
            return np.array([self.device], dtype=np.int64)
        if self.kind != "tiled":
            return np.zeros((0,), dtype=np.int64)
        return self.tile_assignment.array().ravel()

    def num_devices(self) -> int:
        """Devices a tiled/maximal sharding names (0 for replicated/manual/unreduced: any number)."""
        if self.kind == "maximal":
            return 1
        return self.tile_assignment.num_elements if self.kind == "tiled" else 0

    @property
    def data_rank(self) -> int:
        """Number of array dimensions a tiled sharding describes."""
        if self.kind != "tiled":
            raise ValueError(f"{self} is not tiled; it fits arrays of any rank.")
        return len(self.tile_assignment.dims) - len(self.subgroup_types) - int(self.replicate_on_last_tile_dim)

    def num_tiles(self) -> tuple[int, ...]:
        """Tiles per array dimension of a tiled sharding (the data part of the tile dims)."""
        return self.tile_assignment.dims[: self.data_rank]

    # -- placement ------------------------------------------------------------------
    def shard_shape(self, global_shape) -> tuple[int, ...]:
        """Each device's block shape; IndivisibleError for an uneven cut (JAX's rule)."""
        shape = tuple(int(d) for d in global_shape)
        if self.kind != "tiled":
            return shape
        tiles = self.num_tiles()
        if len(tiles) != len(shape):
            raise ValueError(
                f"HloSharding {self} tiles {len(tiles)} dimensions but the shape {shape} has "
                f"{len(shape)}; pass a shape of rank {len(tiles)}."
            )
        return block_shape(lambda: f"HloSharding {self}", shape, tiles)

    def devices_indices_map(self, global_shape, device_assignment: Sequence[int] | None = None) -> dict[int, tuple]:
        """{device: tuple of slices}: the block of the global array each device holds.

        Logical id j is device `device_assignment[j]` (default: j itself). Replicated,
        manual and unreduced shardings name no devices, so they need `device_assignment`.
        Unsharded dims are `slice(None)`, as in JAX. Under manual/unreduced subgroups the
        index is that of the data tile the device holds its own value / partial sum of.
        """
        shape = tuple(int(d) for d in global_shape)
        full = (slice(None),) * len(shape)
        if self.kind == "unknown":
            raise ValueError(f"{self} does not place the array yet; resolve it to a concrete sharding first.")
        if self.kind in ("replicated", "manual", "unreduced"):
            if device_assignment is None:
                raise ValueError(
                    f"{self} does not say how many devices hold the array; pass "
                    "device_assignment=[device ids] (e.g. mesh.device_ids.ravel())."
                )
            return {int(d): full for d in device_assignment}
        ids = self.tile_assignment_devices
        if device_assignment is not None:
            assignment = np.asarray(device_assignment, dtype=np.int64).ravel()
            if ids.max() >= assignment.size:
                raise ValueError(
                    f"{self} uses logical device {int(ids.max())} but device_assignment has only "
                    f"{assignment.size} entries; pass one device id per logical device."
                )
            ids = assignment[ids]
        if self.kind == "maximal":
            return {int(ids[0]): full}
        block = self.shard_shape(shape)
        tiles = self.num_tiles()
        coords = np.indices(self.tile_assignment.dims).reshape(len(self.tile_assignment.dims), -1)[: len(tiles)]
        out = {}
        for dev, pos in zip(ids.tolist(), coords.T.tolist()):
            out[dev] = tuple(
                slice(None) if t == 1 else slice(p * b, (p + 1) * b) for p, b, t in zip(pos, block, tiles)
            )
        return out

    @property
    def is_fully_replicated(self) -> bool:
        """Every device holds the whole array (replicated, maximal, or a tiling into one data tile)."""
        if self.kind in ("replicated", "maximal"):
            return True
        return (self.kind == "tiled" and math.prod(self.num_tiles()) == 1
                and not set(self.subgroup_types) & {"manual", "unreduced"})

    @property
    def device_set(self) -> frozenset[int]:
        """The logical device ids a tiled/maximal sharding names (as device ids: no device assignment)."""
        if self.kind not in ("tiled", "maximal"):
            raise ValueError(f"{self} names no devices; it places an array on any device assignment.")
        return frozenset(self.tile_assignment_devices.tolist())

    def device_replica_id_map(self, global_shape=None, device_assignment: Sequence[int] | None = None
                              ) -> dict[int, int]:
        """{device: replica id}: a device's position among the devices holding the same data tile.

        Devices of one `last_tile_dim_replicate` / `replicated` subgroup hold replicas,
        numbered along that trailing tile dim; every other device is replica 0 (JAX's
        `device_replica_id_map` of the equivalent GSPMDSharding).
        """
        if self.kind in ("replicated", "manual", "unreduced"):
            index = self.devices_indices_map(global_shape or (), device_assignment)
            return {d: (k if self.kind == "replicated" else 0) for k, d in enumerate(index)}
        ids = self.tile_assignment_devices
        if device_assignment is not None:
            ids = np.asarray(device_assignment, dtype=np.int64).ravel()[ids]
        if self.kind == "maximal":
            return {int(ids[0]): 0}
        dims = self.tile_assignment.dims
        types = ["replicated"] if self.replicate_on_last_tile_dim else list(self.subgroup_types)
        coords = np.indices(dims).reshape(len(dims), -1)
        rid = np.zeros(coords.shape[1], dtype=np.int64)
        for k, t in enumerate(types):
            if t == "replicated":
                axis = len(dims) - len(types) + k
                rid = rid * dims[axis] + coords[axis]
        return dict(zip(ids.tolist(), rid.tolist()))

    def to_partition_spec(self, mesh):
        """The PartitionSpec on `mesh` whose NamedSharding has this HLO sharding (see `hlo_to_named`)."""
        return hlo_to_named(self, mesh).spec

    # -- identity and text ---------------------------------------------------------------
    def _key(self):
        ta = self.tile_assignment
        return (self.kind, self.device, self.replicate_on_last_tile_dim, self.subgroup_types, ta)

    def __eq__(self, other):
        """Equal when they place data the same way (an iota and an explicit list may be equal)."""
        return isinstance(other, HloSharding) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __str__(self):
        if self.kind == "maximal":
            return f"{{maximal device={self.device}}}"
        if self.kind != "tiled":
            return "{" + self.kind + "}"
        text = "{" + str(self.tile_assignment)
        if self.replicate_on_last_tile_dim:
            text += " last_tile_dim_replicate"
        if self.subgroup_types:
            text += " last_tile_dims={" + ", ".join(self.subgroup_types) + "}"
        return text + "}"

    def __repr__(self):
        return f"HloSharding({str(self)!r})"


def _check_type(t) -> str:
    name = getattr(t, "name", t)
    name = str(name).lower()
    if name not in _TYPE_ORDER:
        raise ValueError(
            f"subgroup type {t!r} is not one of {SUBGROUP_TYPES}; last_tile_dims takes "
            "manual, unreduced or replicated."
        )
    return name


def _can_group_minor_iota(reshape_dims, perm, group: int) -> bool:
    """Whether XLA keeps a partially replicated iota in iota form (GroupMinorIotaDimsSorted).

    True when the minor `group` devices are whole minor reshape dims, possibly
    with one dim split evenly.
    """
    for d in reversed(perm):
        size = reshape_dims[d]
        if size <= group:
            if group % size:
                return False
            group //= size
            if group == 1:
                return True
        else:
            return size % group == 0
    return True


def _prime_factors(n: int) -> list[int]:
    out, f = [], 2
    while f * f <= n:
        while n % f == 0:
            out.append(f)
            n //= f
        f += 1
    return out + ([n] if n > 1 else [])


def _iota_transpose_stays_iota(dims, reshape_dims, perm, tperm) -> bool:
    """Whether XLA's `IotaTileAssignment::Transpose(tperm)` keeps the iota form.

    XLA regroups the prime factors of the reshape dims (in transposed order) into
    the tile dims, allowing a swap of factors of one reshape dim; where that fails
    it falls back to an explicit device list even if an iota form exists. This only
    happens for device counts with odd prime factors.
    """
    nontrivial = [(d, t) for t, d in enumerate(tperm) if dims[d] != 1]
    if all(a[0] < b[0] for a, b in zip(nontrivial, nontrivial[1:])) or len(reshape_dims) == 1:
        return True  # a no-op/reshape-only transpose, or a single reshape dim
    non_one = [d for d in dims if d != 1]
    if len(non_one) <= len(reshape_dims) and all(
        reshape_dims[perm[i]] == d for i, d in enumerate(non_one)
    ) and len(non_one) == len(reshape_dims):
        return True  # a pure transpose of whole reshape dims
    factors = []  # [size, original reshape dim] in transposed order
    for r in perm:
        factors += [[f, r] for f in _prime_factors(reshape_dims[r])]
    i = 0
    for target in non_one:
        while i < len(factors):
            size, orig = factors[i]
            if target % size:
                swap = next((j for j in range(i + 1, len(factors))
                             if factors[j][1] == orig and target % factors[j][0] == 0), None)
                if swap is None:
                    break
                factors[i][0], factors[swap][0] = factors[swap][0], size
            target //= factors[i][0]
            i += 1
        if target != 1:
            return False
    return True


# ----------------------------------------------------------------------------- parser
class _Parser:
    """Recursive-descent parser for XLA's (non-tuple) sharding text; errors name the position."""

    _TOKEN = re.compile(r"\s*(devices=|device=|last_tile_dim_replicate|last_tile_dims=|<=|T\(|[{}\[\](),]|-?\d+|[A-Za-z_]+)")

    def __init__(self, text: str):
        if not isinstance(text, str):
            raise TypeError(f"HloSharding.parse takes a str, got {type(text).__name__}: {text!r}.")
        self.text = text
        self.pos = 0

    def _error(self, expected: str):
        rest = self.text[self.pos:].lstrip()
        at = len(self.text) - len(rest)
        got = repr(rest[:12]) if rest else "end of text"
        raise ValueError(
            f"Bad HloSharding text {self.text!r}: at position {at} expected {expected}, got {got}. "
            "Write e.g. '{devices=[2,4]<=[8]}', '{replicated}' or '{maximal device=0}'."
        )

    def _peek(self):
        m = self._TOKEN.match(self.text, self.pos)
        return m.group(1) if m else None

    def _take(self, expected: str, what: str | None = None) -> str:
        tok = self._peek()
        if tok != expected:
            self._error(what or repr(expected))
        self.pos = self._TOKEN.match(self.text, self.pos).end()
        return tok

    def _int(self, what: str = "an integer") -> int:
        tok = self._peek()
        if tok is None or not re.fullmatch(r"-?\d+", tok):
            self._error(what)
        self.pos = self._TOKEN.match(self.text, self.pos).end()
        return int(tok)

    def _int_list(self, open_: str, close: str, what: str) -> list[int]:
        self._take(open_)
        out = [self._int(what)]
        while self._peek() == ",":
            self._take(",")
            out.append(self._int(what))
        self._take(close, f"',' or {close!r}")
        return out

    def parse(self) -> HloSharding:
        self._take("{")
        tok = self._peek()
        if tok in ("replicated", "manual", "unreduced", "unknown"):
            self._take(tok)
            out = {"replicated": HloSharding.replicate, "manual": HloSharding.manual,
                   "unreduced": HloSharding.unreduced, "unknown": HloSharding.unknown}[tok]()
        elif tok == "maximal":
            self._take("maximal")
            self._take("device=")
            try:
                out = HloSharding.maximal(self._int("a device id"))
            except ValueError as e:
                raise ValueError(f"Bad HloSharding text {self.text!r}: {e}") from None
        elif tok == "devices=":
            out = self._tiled()
        elif tok == "{":
            self._error("a sharding keyword (tuple shardings are not supported; parse each element)")
        else:
            self._error("'replicated', 'manual', 'unreduced', 'unknown', 'maximal' or 'devices='")
        self._skip_metadata()
        self._take("}", "'}'")
        if self.text[self.pos:].strip():
            self._error("end of text")
        return out

    def _skip_metadata(self) -> None:
        """Skip XLA's ` metadata={op_name="..." source_file="..." source_line=12}` (one `{...}`, or
        `{{...}, {...}}` for several), which dumps print after the sharding: it names where the
        sharding came from and does not change it. Braces inside quoted strings do not count."""
        m = re.compile(r"\s*metadata=\{").match(self.text, self.pos)
        if not m:
            return
        depth, i, quoted = 1, m.end(), False
        while i < len(self.text) and depth:
            c = self.text[i]
            if quoted:
                if c == "\\":
                    i += 1
                elif c == '"':
                    quoted = False
            elif c == '"':
                quoted = True
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            i += 1
        if depth:
            self.pos = m.start()
            self._error("a metadata={...} block closed by '}'")
        self.pos = i

    def _tiled(self) -> HloSharding:
        self._take("devices=")
        dims = self._int_list("[", "]", "a tile dimension")
        if any(d < 1 for d in dims):
            self._error(f"positive tile dimensions (got {dims})")
        n = math.prod(dims)
        if self._peek() == "<=":
            self._take("<=")
            reshape = self._int_list("[", "]", "an iota reshape dimension")
            perm = list(range(len(reshape)))
            if self._peek() == "T(":
                if len(reshape) == 1:  # XLA prints and parses T(...) only for 2+ reshape dims
                    self._error(f"'}}' or a keyword: a single iota reshape dim {reshape} takes no transpose")
                perm = self._int_list("T(", ")", "a transpose index")
            elif len(reshape) > 1:
                self._error("'T(' to start the iota transpose perm")
            try:
                ta = TileAssignment.from_iota(dims, reshape, perm)
            except ValueError as e:
                raise ValueError(f"Bad HloSharding text {self.text!r}: {e}") from None
        else:
            ids = [self._int("a device id")]
            while self._peek() == ",":
                self._take(",")
                ids.append(self._int("a device id"))
            if n > MAX_LISTED_DEVICES or len(ids) != n:
                raise ValueError(
                    f"Bad HloSharding text {self.text!r}: devices={dims} needs {n} device ids, got "
                    f"{len(ids)}; list one id per tile."
                )
            if n < 2:
                raise ValueError(
                    f"Bad HloSharding text {self.text!r}: non-maximal shardings must have more than "
                    "one device assigned; write '{maximal device=N}' for one device."
                )
            if len(set(ids)) != n or min(ids) < 0:
                raise ValueError(f"Bad HloSharding text {self.text!r}: device ids {ids} must be distinct and >= 0.")
            ta = TileAssignment.from_array(np.array(ids).reshape(dims))
        tok = self._peek()
        if tok == "last_tile_dim_replicate":
            self._take(tok)
            return HloSharding.partial_tile(ta)
        if tok == "last_tile_dims=":
            self._take(tok)
            self._take("{")
            types = [self._type()]
            while self._peek() == ",":
                self._take(",")
                types.append(self._type())
            self._take("}", "',' or '}'")
            return HloSharding.subgroup(ta, types)
        return HloSharding.tile(ta)

    def _type(self) -> str:
        tok = self._peek()
        if tok not in SUBGROUP_TYPES:
            self._error("a subgroup type (manual, unreduced or replicated)")
        return self._take(tok)


# ----------------------------------------------------------------------------- NamedSharding <-> HLO
def named_to_hlo(sharding, ndim: int) -> HloSharding:
    """The HloSharding of a NamedSharding for rank `ndim`, by JAX's `named_sharding_to_xla_hlo_sharding`.

    Size-1 mesh axes are dropped; each array dim is tiled by its axes (major to
    minor); unused axes become trailing subgroup dims typed manual (Manual mesh
    axes), unreduced (`spec.unreduced`) or replicated. Device ids are positions
    in the mesh's flat device order, so the text does not depend on `device_ids`.
    """
    mesh, spec = sharding.mesh, sharding.spec
    if len(spec) > ndim:
        raise ValueError(
            f"Sharding {sharding!r} is only valid for values of rank at least {len(spec)}, but "
            f"to_hlo was called with ndim={ndim}; pass the array's rank."
        )
    kept = [k for k, s in enumerate(mesh.axis_sizes) if s != 1]
    names = [mesh.axis_names[k] for k in kept]
    sizes = [mesh.axis_sizes[k] for k in kept]
    pos = {n: i for i, n in enumerate(names)}
    dims = [1] * ndim
    perm: list[int] = []
    for d in range(ndim):
        for a in spec.axes_of(d):
            if a in pos:
                dims[d] *= sizes[pos[a]]
                perm.append(pos[a])
    manual = set(mesh.manual_axes)
    sharding_manual = sorted(manual & {names[i] for i in perm})
    if sharding_manual:  # JAX trips an assertion here; say what is wrong instead
        raise ValueError(
            f"{sharding!r} shards a dimension over Manual mesh axis {sharding_manual[0]!r}; an HLO "
            "sharding keeps Manual axes in a trailing `manual` subgroup. Drop the axis from the "
            "spec, or make it Auto/Explicit."
        )
    kinds = {"replicated": [], "manual": [], "unreduced": []}
    for i, n in enumerate(names):
        if i not in perm:
            kinds["manual" if n in manual else "unreduced" if n in spec.unreduced else "replicated"].append(i)
    if not kinds["manual"] and not kinds["unreduced"] and len(perm) == 0:
        return HloSharding.replicate()
    types = []
    for t in ("replicated", "manual", "unreduced"):  # JAX appends by OpSharding.Type value
        if kinds[t]:
            types.append(t)
            dims.append(int(np.prod([sizes[i] for i in kinds[t]])))
            perm.extend(kinds[t])
    return HloSharding.iota_tile(dims, sizes or (1,), perm or (0,), types)


def hlo_to_named(hlo: HloSharding, mesh):
    """The NamedSharding over `mesh` whose `to_hlo` equals `hlo`; ValueError if there is none.

    Each mesh axis (of size > 1) must vary along exactly one tile dimension;
    axes on one array dim are ordered major to minor by how slowly they vary.
    The candidate is checked by converting it back, so the answer is exact.
    """
    from refsim.layouts.named_sharding import NamedSharding
    from refsim.layouts.partition_spec import PartitionSpec

    if isinstance(hlo, str):
        hlo = HloSharding.parse(hlo)

    def fail(why: str):
        raise ValueError(
            f"No PartitionSpec on mesh {mesh!r} gives HloSharding {hlo}: {why}. Use a mesh whose "
            "axes match the sharding's tiles, or keep the HloSharding."
        )

    if hlo.kind == "maximal":
        fail("a maximal sharding puts the whole array on one device (use SingleDeviceSharding)")
    if hlo.kind == "unknown":
        fail("an unknown sharding places nothing yet")
    ndim, spec = 0, PartitionSpec()
    if hlo.kind == "unreduced":
        spec = PartitionSpec(unreduced={n for n, s in zip(mesh.axis_names, mesh.axis_sizes) if s > 1})
    elif hlo.kind == "tiled":
        ids = hlo.tile_assignment.array()
        if ids.size != mesh.size or ids.max() >= mesh.size:
            fail(f"it uses {ids.size} devices (ids up to {int(ids.max())}) but the mesh has {mesh.size}")
        coords = np.unravel_index(ids, mesh.axis_sizes)
        ndim = hlo.data_rank
        tile_types = [None] * ndim + (["replicated"] if hlo.replicate_on_last_tile_dim else list(hlo.subgroup_types))
        per_dim: list[list[tuple[int, str]]] = [[] for _ in tile_types]
        for k, (name, size) in enumerate(zip(mesh.axis_names, mesh.axis_sizes)):
            if size == 1:
                continue
            varies = [t for t in range(ids.ndim) if ids.shape[t] > 1 and np.any(np.diff(coords[k], axis=t))]
            if len(varies) != 1:
                fail(f"mesh axis {name!r} varies along tile dims {varies}, not exactly one")
            t = varies[0]
            line = np.moveaxis(coords[k], t, -1).reshape(-1, ids.shape[t])[0]
            step = int(np.argmax(line != line[0]))
            per_dim[t].append((step, name))
        entries = []
        for t in range(ndim):
            axes = tuple(n for _, n in sorted(per_dim[t], key=lambda x: -x[0]))
            entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
        unreduced = {n for t, ty in enumerate(tile_types) if ty == "unreduced" for _, n in per_dim[t]}
        spec = PartitionSpec(*entries, unreduced=unreduced)
    try:
        candidate = NamedSharding(mesh, spec)
    except ValueError as e:
        fail(f"the matching spec {spec!r} is not valid on this mesh ({e})")
    if named_to_hlo(candidate, ndim) != hlo:
        fail(f"the closest spec {spec!r} gives {named_to_hlo(candidate, ndim)} instead")
    return candidate
