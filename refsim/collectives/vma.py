"""The manual-axis type rules (varying / invariant / unreduced / reduced) of JAX's shard_map.

A value inside shard_map is, per mesh axis, in one of four states (JAX's
`core.ManualAxisType`): *varying* (devices hold different values), *invariant*
(all hold the same), *unreduced* (the logical value is the sum of the per-device
values) or *reduced* (invariant, but its cotangent is unreduced). The casts between
states are no-ops on data; only the type changes. This module states which
conversions JAX allows (`jax._src.lax.parallel`, `core.pvary`) and raises the same
ValueError for the others. On data, every cast here is the identity.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from refsim.collectives.groups import normalize_axis_name


@dataclass(frozen=True)
class Mat:
    """Manual axis type of a value: the axes it is varying / unreduced / reduced over."""

    varying: frozenset = field(default_factory=frozenset)
    unreduced: frozenset = field(default_factory=frozenset)
    reduced: frozenset = field(default_factory=frozenset)

    def __post_init__(self):
        for name in ("varying", "unreduced", "reduced"):
            object.__setattr__(self, name, frozenset(getattr(self, name)))
        both = (self.varying & self.unreduced) | (self.varying & self.reduced) | (
            self.unreduced & self.reduced)
        if both:
            raise ValueError(f"Mat: axes {sorted(both)} are in two states at once in {self}.")

    def state(self, axis) -> str:
        if axis in self.varying:
            return "varying"
        if axis in self.unreduced:
            return "unreduced"
        if axis in self.reduced:
            return "reduced"
        return "invarying"


def _axes(axis_name) -> frozenset:
    return frozenset(normalize_axis_name(axis_name))


def state_of(mat: Mat, axis_name, api: str) -> str:
    """The one state of `axis_name` in `mat` (JAX's `_get_from`); ValueError if mixed."""
    states = {mat.state(a) for a in normalize_axis_name(axis_name)}
    if len(states) != 1:
        raise ValueError(
            f"{api} can only accept axis_name which corresponds to one of varying, unreduced, "
            f"reduced or invarying state of the input. Got input type: {mat}, axes: "
            f"{tuple(normalize_axis_name(axis_name))} and input state: {sorted(states)}"
        )
    return states.pop()


def _no_unreduced_or_reduced(mat: Mat, axes: frozenset, name: str):
    if mat.unreduced & axes:
        raise ValueError(f"{name} cannot accept args which are unreduced. Got {mat} and axes={set(axes)}")
    if mat.reduced & axes:
        raise ValueError(f"{name} cannot accept args which are reduced. Got {mat} and axes={set(axes)}")


def pvary_type(mat: Mat, axis_name) -> Mat:
    """pvary: invariant -> varying (core.pvary_p's abstract eval)."""
    axes = _axes(axis_name)
    _no_unreduced_or_reduced(mat, axes, "pvary")
    if mat.varying & axes:
        raise ValueError(
            "pvary is a invariant->variant collective. This means that the axis names mentioned "
            f"in `axes` passed to `pvary` must not be present in `jax.typeof(inp).mat.varying`. "
            f"Got axes={tuple(sorted(axes))} and varying={set(mat.varying)}")
    return Mat(mat.varying | axes, mat.unreduced, mat.reduced)


def psum_invariant_type(mat: Mat, axis_name) -> Mat:
    """psum (check_vma=True), pmax, pmin: varying -> invariant."""
    axes = _axes(axis_name)
    if not axes & mat.varying:
        raise ValueError(
            "psum is a variant->invariant collective. This means that the axis names mentioned "
            "in `axes` passed to `psum` must be present in `jax.typeof(inp).mat.varying`. Got "
            f"axes={tuple(sorted(axes))} and varying={set(mat.varying)}")
    _no_unreduced_or_reduced(mat, axes, "psum")
    return Mat(mat.varying - axes, mat.unreduced, mat.reduced)


def collective_type(mat: Mat, axis_name, api: str) -> Mat:
    """all_gather, all_to_all, ppermute, reduce_scatter, pbroadcast: varying -> varying."""
    axes = _axes(axis_name)
    _no_unreduced_or_reduced(mat, axes, api)
    if not axes <= mat.varying:
        raise ValueError(
            f"Collective {api} must be applied to a device-varying type, but got "
            f"{set(mat.varying)} for collective acting over axis name {tuple(sorted(axes))}.")
    return mat


def all_gather_invariant_type(mat: Mat, axis_name) -> Mat:
    """all_gather_invariant: varying -> invariant over `axis_name`."""
    axes = _axes(axis_name)
    _no_unreduced_or_reduced(mat, axes, "all_gather_invariant")
    return Mat(mat.varying - axes, mat.unreduced, mat.reduced)


def all_gather_reduced_type(mat: Mat, axis_name) -> Mat:
    """all_gather_reduced: varying -> reduced."""
    axes = _axes(axis_name)
    if not mat.varying or not mat.varying & axes:
        raise ValueError(
            "all_gather_reduced is a Varying -> Reduced collective. This means that the "
            f"axis_name={tuple(sorted(axes))} passed to `all_gather_reduced` must be present in "
            f"jax.typeof(x).mat.varying={set(mat.varying)}")
    if mat.reduced & axes:
        raise ValueError("all_gather_reduced's input cannot be reduced across the axis_name "
                         f"provided. Got x={mat} and axis_name={tuple(sorted(axes))}")
    return Mat(mat.varying - axes, mat.unreduced, mat.reduced | axes)


def _unreduced_in(mat: Mat, axes: frozenset, name: str, to: str):
    if not mat.unreduced or not mat.unreduced & axes:
        raise ValueError(
            f"{name} is a Unreduced -> {to} collective. This means that the "
            f"axes={tuple(sorted(axes))} passed to `{name}` must be present in "
            f"jax.typeof(x).mat.unreduced={set(mat.unreduced)}")
    if mat.varying & axes:
        raise ValueError(f"{name}'s input cannot be varying across the axis_name provided. "
                         f"Got x={mat} and axes={tuple(sorted(axes))}")


def unreduced_psum_type(mat: Mat, axis_name, name: str = "unreduced_psum") -> Mat:
    """unreduced_psum (and unreduced_pmax/pmin): unreduced -> invariant."""
    axes = _axes(axis_name)
    _unreduced_in(mat, axes, name, "Invariant")
    return Mat(mat.varying, mat.unreduced - axes, mat.reduced)


def unreduced_reduce_scatter_type(mat: Mat, axis_name) -> Mat:
    """unreduced_psum_scatter: unreduced -> varying."""
    axes = _axes(axis_name)
    _unreduced_in(mat, axes, "unreduced_psum_scatter", "Varying")
    return Mat(mat.varying | axes, mat.unreduced - axes, mat.reduced)


def preduced_type(mat: Mat, axis_name) -> Mat:
    """preduced: invariant -> reduced (no-op cast)."""
    axes = _axes(axis_name)
    if mat.varying & axes:
        raise ValueError(
            "preduced is a Invariant->Reduced collective. This means that the axis names "
            "mentioned in `axes` passed to `preduced` must not be present in "
            f"`jax.typeof(inp).mat.varying`. Got axes={tuple(sorted(axes))} and "
            f"varying={set(mat.varying)}")
    if mat.reduced & axes:
        raise ValueError(f"preduced input cannot be reduced across the axis_name provided. "
                         f"Got x={mat} and axis_name={tuple(sorted(axes))}")
    return Mat(mat.varying, mat.unreduced, mat.reduced | axes)


def vary_unreduced_cast_type(mat: Mat, axis_name) -> Mat:
    """vary_unreduced_cast: varying -> unreduced (no-op cast)."""
    axes = _axes(axis_name)
    _no_unreduced_or_reduced(mat, axes, "vary_unreduced_cast")
    if not mat.varying or not mat.varying & axes:
        raise ValueError(
            "vary_unreduced_cast is a Varying->Unreduced collective. This means that the axis "
            "names mentioned in `axes` passed to `vary_unreduced_cast` must be present in "
            f"`jax.typeof(x).mat.varying`. Got axes={tuple(sorted(axes))} and "
            f"varying={set(mat.varying)}")
    return Mat(mat.varying - axes, mat.unreduced | axes, mat.reduced)


def reduced_vary_cast_type(mat: Mat, axis_name) -> Mat:
    """reduced_vary_cast: reduced -> varying (no-op cast)."""
    axes = _axes(axis_name)
    if not mat.reduced or not mat.reduced & axes:
        raise ValueError(
            "reduced_vary_cast is a Reduced->Varying collective. This means that the axis names "
            "mentioned in `axes` passed to `reduced_vary_cast` must be present in "
            f"`jax.typeof(x).mat.reduced`. Got axes={tuple(sorted(axes))} and "
            f"reduced={set(mat.reduced)}")
    if mat.varying & axes:
        raise ValueError(f"reduced_vary_cast input cannot be varying across the axis_name "
                         f"provided. Got x={mat} and axis_name={tuple(sorted(axes))}")
    return Mat(mat.varying | axes, mat.unreduced, mat.reduced - axes)


PCAST = {
    ("invarying", "varying"): ("pvary", pvary_type),
    ("invarying", "reduced"): ("preduced", preduced_type),
    ("varying", "unreduced"): ("vary_unreduced_cast", vary_unreduced_cast_type),
    ("reduced", "varying"): ("reduced_vary_cast", reduced_vary_cast_type),
}


def pcast_type(mat: Mat, axis_name, to: str) -> tuple[str, Mat]:
    """jax.lax.pcast: which no-op cast primitive JAX binds, and the result type.

    Allowed: invarying->varying (pvary), invarying->reduced (preduced),
    varying->unreduced (vary_unreduced_cast), reduced->varying (reduced_vary_cast).
    Anything else raises ValueError("Unsupported pcast from=..., to=...") as JAX does.
    """
    if isinstance(axis_name, (set, frozenset)):
        raise TypeError(f"axis_name={axis_name!r} must be a tuple or a str. Got {axis_name}")
    if to not in ("unreduced", "reduced", "varying"):
        raise ValueError("Got unexpected `to` value. Allowed `to` values are: "
                         "{'unreduced', 'reduced', 'varying'}" f" (got to={to!r})")
    frm = state_of(mat, axis_name, "jax.lax.pcast")
    entry = PCAST.get((frm, to))
    if entry is None:
        raise ValueError(f"Unsupported pcast from={frm}, to={to!r}")
    prim, rule = entry
    return prim, rule(mat, axis_name)


def identity_cast(x, *, mesh, axes):
    """pvary / preduced / vary_unreduced_cast / reduced_vary_cast on data: the identity.

    Only the names are checked (NameError for an axis not in the mesh); an invariant
    value keeps its size-1 mesh dims, which already stand for "same on every device".
    """
    from refsim.collectives.groups import GroupLayout

    GroupLayout(mesh, axes, "pcast")
    return x
