"""Device meshes without devices: `Mesh`, `AbstractMesh` and `AxisType`.

A `Mesh` is an n-dimensional grid of integer device ids with one name per grid
dimension, as `jax.sharding.Mesh` is a grid of devices. Device ids are plain
integers, so a mesh of any size exists without any device behind it; the ids of
a real JAX mesh are its devices' `.id` (`Mesh.from_jax`).
"""
from __future__ import annotations

import enum
from collections import OrderedDict
from typing import Sequence

import numpy as np


class AxisType(enum.Enum):
    """How a mesh axis is treated by sharding propagation (as `jax.sharding.AxisType`).

    Auto: the compiler chooses shardings; Explicit: shardings are part of the
    array types; Manual: the axis is inside a `shard_map`/`pmap` manual region.
    """

    Auto = "Auto"
    Explicit = "Explicit"
    Manual = "Manual"

    def __repr__(self):
        return self.value


def _normalize_names(axis_names) -> tuple[str, ...]:
    if isinstance(axis_names, str):
        axis_names = (axis_names,)
    try:
        names = tuple(axis_names)
    except TypeError:
        raise TypeError(f"axis_names={axis_names!r} must be a tuple of strings, e.g. ('x', 'y').") from None
    for n in names:
        if not isinstance(n, str):
            raise TypeError(
                f"axis_names must be strings, got {n!r} of type {type(n).__name__} "
                f"in axis_names={names!r}; pass names like ('x', 'y')."
            )
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(
            f"axis_names={names!r} names axis {dupes[0]!r} more than once; "
            "every mesh axis needs a distinct name."
        )
    return names


def _normalize_axis_types(axis_types, n: int) -> tuple[AxisType, ...]:
    if axis_types is None:
        return (AxisType.Auto,) * n
    if isinstance(axis_types, (AxisType, str)) or hasattr(axis_types, "name") and not isinstance(
        axis_types, (tuple, list)
    ):
        axis_types = (axis_types,) * n
    out = []
    for t in axis_types:
        if isinstance(t, AxisType):
            out.append(t)
        elif isinstance(t, str) and t in AxisType.__members__:
            out.append(AxisType[t])
        elif hasattr(t, "name") and t.name in AxisType.__members__:  # jax's own AxisType
            out.append(AxisType[t.name])
        else:
            raise TypeError(
                f"axis_types entry {t!r} is not an AxisType; use AxisType.Auto, "
                "AxisType.Explicit or AxisType.Manual."
            )
    if len(out) != n:
        raise ValueError(
            f"axis_types={tuple(out)!r} has {len(out)} entries but the mesh has {n} axes; "
            "give one AxisType per axis name."
        )
    return tuple(out)


def _check_sizes(sizes, arg: str) -> tuple[int, ...]:
    """Axis sizes as Python ints: TypeError for a non-int (bool, float, str), ValueError for < 1.

    JAX's AbstractMesh stores whatever it is given (`True`, `2.0`) and `jax.make_mesh`
    converts them; refsim is stricter, as NumPy's `reshape` is: a size must be an integer.
    """
    try:
        sizes = tuple(sizes)
    except TypeError:
        raise TypeError(f"{arg}={sizes!r} must be a tuple of ints, e.g. (2, 4).") from None
    for s in sizes:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)):
            raise TypeError(
                f"{arg}={sizes!r} contains {s!r} of type {type(s).__name__}; every axis size must be "
                f"an int, e.g. {arg}=(2, 4)."
            )
        if s < 1:
            raise ValueError(f"{arg}={sizes!r} contains {s!r}; every axis size must be a positive int.")
    return tuple(int(s) for s in sizes)


_MAX_DEVICES = 2**31  # device ids are listed in an int64 array: 16 GiB at this bound


def _default_ids(shape: tuple) -> np.ndarray:
    """The ids 0..n-1 in row-major order, or ValueError naming the size when this machine cannot hold
    them: 8 bytes per device for the int64 ids and as much again for the first copy a query makes
    (JAX raises ValueError for a mesh it cannot build, never a MemoryError)."""
    from refsim import resources

    n = _prod(shape)
    need = 16 * n
    free = resources.available_memory()
    hint = "use refsim.AbstractMesh(shape, axis_names) for a mesh without ids, or a smaller shape."
    if free is not None and need > free:
        raise ValueError(
            f"Mesh shape={shape} has {n} devices; its device ids need {resources.format_bytes(need)} (8 bytes per "
            f"id, twice), more than the {resources.format_bytes(free)} of memory available here; {hint}")
    try:
        return np.arange(n, dtype=np.int64).reshape(shape)
    except MemoryError:
        raise ValueError(f"Mesh shape={shape} has {n} devices, whose device ids "
                         f"({resources.format_bytes(8 * n)}) cannot be allocated here; {hint}") from None


def _checked_ids(device_ids, shape: tuple) -> np.ndarray:
    """`device_ids` as an int64 array of the mesh shape; TypeError / ValueError when they are not
    integers, not of that shape, negative or repeated."""
    ids = np.asarray(device_ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(
            f"device_ids must be integers, got dtype {ids.dtype}; pass device ids "
            "(for JAX devices use Mesh.from_jax or [d.id for d in devices])."
        )
    if ids.shape != shape:
        raise ValueError(
            f"device_ids has shape {ids.shape} but the mesh shape is {shape}; "
            "reshape device_ids to the mesh shape."
        )
    ids = ids.astype(np.int64)
    flat = ids.ravel()
    if flat.size and flat.min() < 0:
        raise ValueError(f"device_ids contains negative id {int(flat.min())}; ids must be >= 0.")
    uniq, counts = np.unique(flat, return_counts=True)
    if uniq.size != flat.size:
        dup = int(uniq[counts > 1][0])
        raise ValueError(
            f"device_ids are not unique: id {dup} appears {int(counts[counts > 1][0])} times; "
            "each device may appear in a mesh once."
        )
    return ids


def _prod(sizes) -> int:
    """Exact product of axis sizes (Python ints: no int64 overflow for huge abstract meshes)."""
    out = 1
    for s in sizes:
        out *= int(s)
    return out


class AbstractMesh:
    """Axis names, sizes and types of a mesh, with no device ids.

    Programs are traced against an AbstractMesh, so tracing never needs devices.
    """

    def __init__(self, axis_sizes: Sequence[int], axis_names, axis_types=None):
        names = _normalize_names(axis_names)
        sizes = _check_sizes(axis_sizes, "axis_sizes")
        if len(sizes) != len(names):
            raise ValueError(
                f"axis_sizes={sizes!r} has {len(sizes)} entries but axis_names={names!r} has "
                f"{len(names)}; give one size per axis name."
            )
        self._axis_sizes = tuple(int(s) for s in sizes)
        self._axis_names = names
        self._axis_types = _normalize_axis_types(axis_types, len(names))

    # -- basic facts -------------------------------------------------------
    @property
    def axis_names(self) -> tuple[str, ...]:
        return self._axis_names

    @property
    def axis_sizes(self) -> tuple[int, ...]:
        return self._axis_sizes

    @property
    def axis_types(self) -> tuple[AxisType, ...]:
        return self._axis_types

    @property
    def shape(self) -> "OrderedDict[str, int]":
        """Axis name -> size, in mesh order."""
        return OrderedDict(zip(self._axis_names, self._axis_sizes))

    @property
    def shape_tuple(self) -> tuple[tuple[str, int], ...]:
        return tuple(zip(self._axis_names, self._axis_sizes))

    @property
    def size(self) -> int:
        return _prod(self._axis_sizes)

    @property
    def ndim(self) -> int:
        return len(self._axis_names)

    @property
    def empty(self) -> bool:
        return self.ndim == 0

    def axis_size(self, name: str) -> int:
        return self._axis_sizes[self.axis_index(name)]

    def axis_index(self, name: str) -> int:
        """Position of axis `name` in the mesh; NameError (as JAX's unbound axis) if absent."""
        try:
            return self._axis_names.index(name)
        except ValueError:
            raise NameError(
                f"unbound axis name: {name!r}. The mesh has axes {self._axis_names!r}; "
                "use one of them or add the axis to the mesh."
            ) from None

    @property
    def abstract_mesh(self) -> "AbstractMesh":
        return AbstractMesh(self._axis_sizes, self._axis_names, self._axis_types)

    def update_axis_types(self, axis_types) -> "AbstractMesh":
        """A copy with some axis types replaced: `axis_types` maps names to AxisType."""
        types = list(self._axis_types)
        for name, t in dict(axis_types).items():
            types[self.axis_index(name)] = _normalize_axis_types((t,), 1)[0]
        return self._replace(axis_types=tuple(types))

    def _replace(self, **kw):
        return AbstractMesh(
            kw.get("axis_sizes", self._axis_sizes),
            kw.get("axis_names", self._axis_names),
            kw.get("axis_types", self._axis_types),
        )

    @property
    def manual_axes(self) -> tuple[str, ...]:
        return tuple(n for n, t in zip(self._axis_names, self._axis_types) if t is AxisType.Manual)

    @property
    def explicit_axes(self) -> tuple[str, ...]:
        return tuple(n for n, t in zip(self._axis_names, self._axis_types) if t is AxisType.Explicit)

    def to_jax(self):
        """The equivalent `jax.sharding.AbstractMesh` (needs JAX, not devices)."""
        from refsim import compat

        return compat.make_abstract_mesh(self._axis_sizes, self._axis_names, self._axis_types)

    # -- identity ------------------------------------------------------------
    def _key(self):
        return (type(self).__name__, self._axis_sizes, self._axis_names, self._axis_types)

    def __eq__(self, other):
        return type(other) is type(self) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def _axes_repr(self):
        inner = ", ".join(f"'{n}': {s}" for n, s in zip(self._axis_names, self._axis_sizes))
        types = ", ".join(t.value for t in self._axis_types)
        comma = "," if len(self._axis_types) == 1 else ""
        return f"{inner}, axis_types=({types}{comma})"

    def __repr__(self):
        return f"AbstractMesh({self._axes_repr()})"


class Mesh(AbstractMesh):
    """A named grid of integer device ids, like `jax.sharding.Mesh` without devices.

    `Mesh((2, 4), ('x', 'y'))` holds ids 0..7 in row-major order; `device_ids=`
    gives any arrangement of distinct non-negative integers of that shape.
    """

    def __init__(self, shape, axis_names, device_ids=None, axis_types=None):
        if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
            shape = (int(shape),)
        shape = _check_sizes(shape, "shape")
        names = _normalize_names(axis_names)
        if len(shape) != len(names):
            raise ValueError(
                f"Mesh requires one axis name per mesh dimension, but got shape={shape} "
                f"({len(shape)} dims) and axis_names={names!r} ({len(names)} names)."
            )
        if device_ids is None:
            if _prod(shape) > _MAX_DEVICES:  # ids are materialised; an AbstractMesh holds none
                raise ValueError(
                    f"Mesh shape={shape} has {_prod(shape)} devices, more than the {_MAX_DEVICES} whose "
                    "ids a Mesh lists; use refsim.AbstractMesh(shape, axis_names) for a mesh without ids."
                )
            ids = _default_ids(shape)  # 0..n-1: distinct and non-negative, no check (or sort) needed
        else:
            ids = _checked_ids(device_ids, shape)
        super().__init__(shape, names, axis_types)
        ids.setflags(write=False)
        self._device_ids = ids

    @classmethod
    def from_jax(cls, jax_mesh) -> "Mesh":
        """The refsim Mesh with the same names, shape, axis types and device ids as a JAX Mesh."""
        devs = np.asarray(jax_mesh.devices)
        ids = np.vectorize(lambda d: d.id, otypes=[np.int64])(devs) if devs.size else devs.astype(np.int64)
        return cls(devs.shape, tuple(jax_mesh.axis_names), device_ids=ids,
                   axis_types=tuple(getattr(jax_mesh, "axis_types", None) or ()) or None)

    @property
    def device_ids(self) -> np.ndarray:
        """Read-only int64 ndarray of the mesh shape."""
        return self._device_ids

    @property
    def devices(self) -> np.ndarray:
        """Alias of `device_ids` (JAX's Mesh calls its grid `devices`)."""
        return self._device_ids

    @property
    def device_set(self) -> frozenset[int]:
        return frozenset(int(i) for i in self._device_ids.ravel())

    def device_position(self, device_id: int) -> tuple[int, ...]:
        """The mesh coordinates of `device_id`."""
        pos = np.argwhere(self._device_ids == device_id)
        if pos.size == 0:
            raise ValueError(f"device id {device_id} is not in this mesh (ids {sorted(self.device_set)}).")
        return tuple(int(p) for p in pos[0])

    def _replace(self, **kw):
        return Mesh(
            kw.get("axis_sizes", self._axis_sizes),
            kw.get("axis_names", self._axis_names),
            device_ids=kw.get("device_ids", self._device_ids),
            axis_types=kw.get("axis_types", self._axis_types),
        )

    def _key(self):
        # Kept once built: every dict lookup keyed by a mesh or a sharding over it hashes this,
        # and the ids are read-only (set in __init__, never replaced).
        key = self.__dict__.get("_key_cached")
        if key is None:
            key = self.__dict__["_key_cached"] = super()._key() + (self._device_ids.tobytes(),)
        return key

    def __repr__(self):
        default = np.array_equal(self._device_ids.ravel(), np.arange(self.size))
        ids = "" if default else f", device_ids={self._device_ids.tolist()}"
        return f"Mesh({self._axes_repr()}{ids})"
