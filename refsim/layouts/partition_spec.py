"""`PartitionSpec`: which mesh axes shard each array dimension.

Entry i of a spec says how array dimension i is cut: `None` (not cut), a mesh
axis name, or a tuple of names (cut by all of them, major to minor), or
`PartitionSpec.UNCONSTRAINED` (left to the compiler). `unreduced` / `reduced`
name mesh axes over which the value is a partial sum / known replicated, as in
JAX's `P(..., unreduced={...}, reduced={...})`.
"""
from __future__ import annotations



class _Unconstrained:
    """The singleton `PartitionSpec.UNCONSTRAINED` (prints as JAX's)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self):
        return "UNCONSTRAINED"

    def __reduce__(self):
        return (_Unconstrained, ())


UNCONSTRAINED = _Unconstrained()


def _as_axis_set(arg, value) -> frozenset:
    if not isinstance(value, (set, frozenset)):  # JAX rejects lists and tuples too
        raise TypeError(
            f"{arg} argument of PartitionSpec should be of type `frozenset` or `set`, "
            f"got {value!r} of type {type(value).__name__}; write e.g. {arg}={{'x'}}."
        )
    out = frozenset(value)
    if None in out:
        raise ValueError(f"{arg}={set(out)!r} contains None; it must contain only mesh axis names.")
    return out


def set_text(names) -> str:
    """A set literal of `names` in sorted order, e.g. ``{'x', 'y'}``: the same text in every
    process (a set's own repr follows string hashing, which ``PYTHONHASHSEED`` changes)."""
    return "{" + ", ".join(repr(n) for n in sorted(names)) + "}"


class PartitionSpec(tuple):
    """A tuple of per-dimension entries, with JAX's `unreduced`/`reduced` axis sets."""

    UNCONSTRAINED = UNCONSTRAINED

    def __new__(cls, *partitions, unreduced=frozenset(), reduced=frozenset()):
        parts = []
        for p in partitions:
            if isinstance(p, list):
                p = tuple(p)
            if isinstance(p, tuple):
                p = tuple(p)
                if len(p) == 1:
                    p = p[0]  # P(('x',)) is P('x'), as in JAX
                elif len(p) == 0:
                    p = None
            parts.append(p)
        unreduced = _as_axis_set("unreduced", unreduced)
        reduced = _as_axis_set("reduced", reduced)
        if unreduced & reduced:
            raise ValueError(
                f"`unreduced` and `reduced` of PartitionSpec cannot overlap: unreduced="
                f"{set(unreduced)!r}, reduced={set(reduced)!r}; an axis is one or the other."
            )
        used = {a for p in parts for a in _entry_axes(p)}
        for name, s in (("unreduced", unreduced), ("reduced", reduced)):
            if used & s:
                raise ValueError(
                    f"partitions {tuple(parts)!r} overlap with {name} axes {set(s)!r}; an axis "
                    f"cannot both shard a dimension and be {name}."
                )
        obj = super().__new__(cls, parts)
        obj.unreduced = unreduced
        obj.reduced = reduced
        return obj

    def __repr__(self):
        body = ", ".join(repr(p) for p in self)
        if len(self) == 1:
            body += ","
        extra = []
        if self.unreduced:
            extra.append(f"unreduced={set_text(self.unreduced)}")
        if self.reduced:
            extra.append(f"reduced={set_text(self.reduced)}")
        if extra:
            body = ", ".join([body.rstrip(",")] * bool(len(self)) + extra)
        return f"P({body})"

    __str__ = __repr__

    def __eq__(self, other):
        if isinstance(other, PartitionSpec):
            return (
                tuple.__eq__(self, other)
                and self.unreduced == other.unreduced
                and self.reduced == other.reduced
            )
        if isinstance(other, tuple):
            return not self.unreduced and not self.reduced and tuple.__eq__(self, tuple(PartitionSpec(*other)))
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash((tuple(_strip_trailing_none(self)), self.unreduced, self.reduced))

    def __reduce__(self):
        return (_rebuild, (tuple(self), self.unreduced, self.reduced))

    # -- queries -------------------------------------------------------------
    def axes_of(self, dim: int) -> tuple[str, ...]:
        """Mesh axes sharding array dimension `dim`, major to minor (() if none)."""
        return _entry_axes(self[dim]) if dim < len(self) else ()

    def used_axes(self) -> tuple[str, ...]:
        """Every mesh axis named by a dimension entry, in order of appearance."""
        return tuple(a for p in self for a in _entry_axes(p))

    def padded(self, ndim: int) -> "PartitionSpec":
        """This spec with trailing `None`s up to `ndim` entries."""
        return PartitionSpec(*self, *([None] * (ndim - len(self))), unreduced=self.unreduced, reduced=self.reduced)

    def update(self, partitions=None, unreduced=None, reduced=None) -> "PartitionSpec":
        """A copy with the given parts replaced (`None` keeps them), as `jax.P.update`."""
        return PartitionSpec(*(self if partitions is None else partitions),
                             unreduced=self.unreduced if unreduced is None else unreduced,
                             reduced=self.reduced if reduced is None else reduced)

    @classmethod
    def from_jax(cls, jax_spec) -> "PartitionSpec":
        # `.partitions`, not iteration: a JAX spec with unreduced/reduced axes refuses `iter`.
        raw = jax_spec.partitions if hasattr(jax_spec, "partitions") else tuple(jax_spec)
        parts = [UNCONSTRAINED if type(p).__name__ == "UnconstrainedSingleton" else p for p in raw]
        return cls(*parts, unreduced=getattr(jax_spec, "unreduced", frozenset()),
                   reduced=getattr(jax_spec, "reduced", frozenset()))

    def to_jax(self):
        """The equivalent `jax.sharding.PartitionSpec`."""
        from jax.sharding import PartitionSpec as JP

        parts = [JP.UNCONSTRAINED if p is UNCONSTRAINED else p for p in self]
        kw = {}
        if self.unreduced:
            kw["unreduced"] = set(self.unreduced)
        if self.reduced:
            kw["reduced"] = set(self.reduced)
        return JP(*parts, **kw)


def _rebuild(parts, unreduced, reduced):
    return PartitionSpec(*parts, unreduced=unreduced, reduced=reduced)


def _strip_trailing_none(spec) -> tuple:
    parts = list(spec)
    while parts and parts[-1] is None:
        parts.pop()
    return tuple(parts)


def _entry_axes(entry) -> tuple[str, ...]:
    if entry is None or entry is UNCONSTRAINED:
        return ()
    if isinstance(entry, tuple):
        return entry
    return (entry,)


def check_no_duplicate_axes(spec, *, what: str = "NamedSharding", where: str = "") -> dict:
    """{axis: uses} of `spec`; DuplicateSpecError (JAX's class and text) if an axis is used twice.

    `where` names the argument the spec came from, appended to JAX's text.
    """
    from refsim.errors import DuplicateSpecError

    counts: dict = {}
    for entry in spec:
        for a in _entry_axes(entry):
            counts[a] = counts.get(a, 0) + 1
    dupes = [a for a, c in counts.items() if c > 1]
    if dupes:
        shown = ", ".join(sorted(f"`{a}`" for a in dupes))
        raise DuplicateSpecError(
            f"A single {what} spec specification can map every mesh axis to at most "
            f"one positional dimension, but {spec!r} has duplicate entries for {shown}"
            + (f" (in {where}; name each mesh axis in at most one dimension)" if where else "")
        )
    return counts


def validate_spec(spec: PartitionSpec, mesh, *, what: str = "NamedSharding") -> None:
    """Check `spec` against a mesh the way JAX's `NamedSharding` (`check_pspec`) does.

    `mesh` is a refsim Mesh/AbstractMesh, or just its axis names (then the axis-type
    rules are skipped). Raises ValueError for an entry that is not a mesh axis,
    DuplicateSpecError for a mesh axis used by two entries (or twice in one), and
    ValueError for `unreduced`/`reduced` axes that are not `Explicit` or for
    `UNCONSTRAINED` on a mesh with no `Auto` axis (JAX 0.10 and 0.12 agree on all four).
    """
    names = tuple(getattr(mesh, "axis_names", mesh))
    types = getattr(mesh, "axis_types", None)
    counts = check_no_duplicate_axes(spec, what=what)
    for a in counts:
        if not isinstance(a, str) or a not in names:
            raise ValueError(
                f"Resource axis: {a} of {spec!r} is not found in mesh: {names!r}. "
                "Use one of the mesh's axis names, None, or a tuple of names."
            )
    for kind in ("unreduced", "reduced"):
        for a in sorted(getattr(spec, kind, ()), key=str):
            if a not in names:
                raise ValueError(
                    f"{kind.capitalize()} axes {a} is not found in mesh.axis_names={names!r}. "
                    f"Got pspec={spec!r}"
                )
            if types is not None and types[names.index(a)].name != "Explicit":
                raise ValueError(
                    f"{kind.capitalize()} axes can only refer to mesh axes that is of type "
                    f"`Explicit`. Got {kind} axes: {set(getattr(spec, kind))!r} and mesh: {mesh!r}. "
                    f"Build the mesh with axis_types=AxisType.Explicit for axis {a!r}."
                )
    if types is not None and any(p is UNCONSTRAINED for p in spec):
        if all(t.name != "Auto" for t in types):
            raise ValueError(
                f"{spec!r} cannot contain `P.UNCONSTRAINED` when no mesh axis_types are `Auto`. "
                f"Got mesh axis_types: {tuple(types)!r}. Use None for the dimension instead."
            )
