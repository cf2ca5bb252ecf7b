"""PartitionSpec: entries, unreduced/reduced sets, and JAX's validation rules and messages."""
import pytest

from refsim import UNCONSTRAINED, AxisType, DuplicateSpecError, Mesh, NamedSharding, P
from refsim.layouts.partition_spec import validate_spec

E, A, M = AxisType.Explicit, AxisType.Auto, AxisType.Manual


def test_entries_normalise_like_jax():
    assert P(("x",)) == P("x")  # a one-name tuple is the name
    assert P(()) == P(None)
    assert P(["x", "y"]) == P(("x", "y"))
    assert P("x") != P("x", None)  # JAX's specs are distinct objects too
    assert repr(P("x")) == "P('x',)" and repr(P(("x", "y"), None)) == "P(('x', 'y'), None)"
    assert repr(P("x", unreduced={"y"})) == "P('x', unreduced={'y'})"
    assert P.UNCONSTRAINED is UNCONSTRAINED and repr(UNCONSTRAINED) == "UNCONSTRAINED"


def test_queries():
    s = P(("y", "x"), None, "z", reduced={"w"})
    assert s.axes_of(0) == ("y", "x") and s.axes_of(1) == () and s.axes_of(7) == ()
    assert s.used_axes() == ("y", "x", "z")
    assert s.padded(4) == P(("y", "x"), None, "z", None, reduced={"w"})


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(unreduced=["x"]), TypeError, "unreduced argument of PartitionSpec should be of type `frozenset` or `set`"),
    (dict(unreduced={None}), ValueError, "contains None"),
    (dict(unreduced={"x"}, reduced={"x"}), ValueError, "cannot overlap"),
])
def test_bad_sets(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        P(**kwargs)


def test_partition_overlapping_unreduced():
    with pytest.raises(ValueError, match="overlap with unreduced axes"):
        P("x", unreduced={"x"})


MESH = Mesh((2, 4), ("x", "y"))


@pytest.mark.parametrize("spec, dup", [
    (P("x", "x"), "`x`"),
    (P(("x", "y"), "x"), "`x`"),
    (P(("x", "y", "x")), "`x`"),
    (P("x", "y", ("x", "y")), "`x`, `y`"),
])
def test_axis_used_twice_is_duplicate_spec_error(spec, dup):
    with pytest.raises(DuplicateSpecError) as e:
        NamedSharding(MESH, spec)
    assert str(e.value) == (
        "A single NamedSharding spec specification can map every mesh axis to at most one "
        f"positional dimension, but {spec!r} has duplicate entries for {dup}"
    )


def test_unknown_axis_is_valueerror_with_jax_message():
    with pytest.raises(ValueError, match=r"Resource axis: z of P\(\('x', 'z'\),\) is not found in mesh: \('x', 'y'\)\."):
        NamedSharding(MESH, P(("x", "z")))
    with pytest.raises(ValueError, match=r"Unreduced axes q is not found in mesh.axis_names=\('x', 'y'\)"):
        validate_spec(P(unreduced={"q"}), MESH)


@pytest.mark.parametrize("kind", ["unreduced", "reduced"])
@pytest.mark.parametrize("axis_type", [A, M])
def test_unreduced_and_reduced_need_explicit_axes(kind, axis_type):
    mesh = Mesh((2, 4), ("x", "y"), axis_types=(axis_type, E))
    with pytest.raises(ValueError, match=f"{kind.capitalize()} axes can only refer to mesh axes that is of type `Explicit`"):
        NamedSharding(mesh, P(**{kind: {"x"}}))
    assert NamedSharding(mesh, P(**{kind: {"y"}})).spec == P(**{kind: {"y"}})


def test_unconstrained_needs_an_auto_axis():
    with pytest.raises(ValueError, match=r"cannot contain `P.UNCONSTRAINED` when no mesh axis_types are `Auto`"):
        NamedSharding(Mesh((2,), ("x",), axis_types=(E,)), P(UNCONSTRAINED))
    assert NamedSharding(Mesh((2, 2), ("x", "y"), axis_types=(E, A)), P(UNCONSTRAINED)).has_unconstrained


def test_spec_longer_than_rank_is_valueerror():
    s = NamedSharding(MESH, P("x", "y"))
    with pytest.raises(ValueError, match="only valid for values of rank at least 2, but was applied to a value of rank 1"):
        s.shard_shape((4,))


def test_jax_round_trip_including_unreduced():
    from jax.sharding import PartitionSpec as JP

    for spec in [P(), P("x", None, ("y", "z")), P(UNCONSTRAINED, "x"), P("x", unreduced={"y"}, reduced={"z"})]:
        j = spec.to_jax()
        assert isinstance(j, JP)
        assert P.from_jax(j) == spec


def test_set_text_is_a_sorted_set_literal():
    from refsim.layouts.partition_spec import set_text

    assert set_text({"y", "x", "z"}) == "{'x', 'y', 'z'}"
    assert set_text(("b",)) == "{'b'}"
    assert eval(set_text({"q", "p"})) == {"p", "q"}
