"""HloSharding: text forms, XLA's normalisation, placement, and NamedSharding <-> HLO."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refsim
from refsim import HloSharding, IndivisibleError, Mesh, NamedSharding, P
from refsim import compat as _compat
from refsim.layouts.hlo_sharding import hlo_to_named, named_to_hlo

# -- text forms -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "{replicated}", "{manual}", "{unreduced}", "{unknown}", "{maximal device=3}",
    "{devices=[2,4]<=[8]}",
    "{devices=[4,2]<=[2,4]T(1,0)}",
    "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}",
    "{devices=[2,2]3,1,0,2}",
    "{devices=[2,2,2]<=[2,2,2]T(1,0,2) last_tile_dims={manual, replicated}}",
    "{devices=[1,2,4]<=[8] last_tile_dims={unreduced, replicated}}",
    "{devices=[2,2,2]<=[2,2,2]T(1,0,2) last_tile_dims={manual, unreduced}}",
    "{devices=[1,1]<=[1]}",
])
def test_canonical_text_round_trips(text):
    assert str(HloSharding.parse(text)) == text


# Normalisation, expected texts as printed by XLA's own parser (xla_client.HloSharding.from_string).
@pytest.mark.parametrize("text, expected", [
    ("{devices=[2,4]<=[2,4]T(0,1)}", "{devices=[2,4]<=[8]}"),  # identity transpose merges
    ("{devices=[2,2]1,0,3,2 last_tile_dim_replicate}", "{devices=[2,2]0,1,2,3 last_tile_dim_replicate}"),
    ("{devices=[1,4]<=[4] last_tile_dim_replicate}", "{replicated}"),
    ("{devices=[4,1]<=[4] last_tile_dim_replicate}", "{devices=[4]<=[4]}"),
    ("{devices=[2,4]<=[8] last_tile_dims={replicated}}", "{devices=[2,4]<=[8] last_tile_dim_replicate}"),
    ("{devices=[2,2,2]<=[8] last_tile_dims={replicated, manual}}",
     "{devices=[2,2,2]<=[2,2,2]T(0,2,1) last_tile_dims={manual, replicated}}"),
    ("{devices=[2,2,2]<=[8] last_tile_dims={manual, manual}}", "{devices=[2,4]<=[8] last_tile_dims={manual}}"),
    ("{devices=[1,8]<=[8] last_tile_dims={manual}}", "{manual}"),
    ("{devices=[2,4]<=[2,4]T(1,0) last_tile_dim_replicate}",
     "{devices=[2,4]<=[2,2,2]T(1,0,2) last_tile_dim_replicate}"),  # each replica group sorted
    ("{devices=[2,4]<=[2,2,2]T(2,0,1) last_tile_dim_replicate}", "{devices=[2,4]<=[4,2]T(1,0) last_tile_dim_replicate}"),
    ("{ replicated }", "{replicated}"),
])
def test_normalisation_as_xla(text, expected):
    assert str(HloSharding.parse(text)) == expected


def test_iota_tile_assignment_is_reshape_transpose_of_arange():
    h = HloSharding.parse("{devices=[4,2]<=[2,2,2]T(2,1,0)}")
    # arange(8).reshape(2,2,2).transpose(2,1,0): element [i,j,k] = 4k + 2j + i
    expected = [4 * k + 2 * j + i for i in range(2) for j in range(2) for k in range(2)]
    assert h.tile_assignment_devices.tolist() == expected == [0, 4, 2, 6, 1, 5, 3, 7]
    assert h.tile_assignment_dimensions == (4, 2)
    assert h.is_tile_assignment_iota() and h.is_tiled()
    assert isinstance(h.tile_assignment_devices, np.ndarray)


def test_iota_and_explicit_forms_are_equal_shardings():
    assert HloSharding.parse("{devices=[2,2]<=[2,2]T(1,0)}") == HloSharding.parse("{devices=[2,2]0,2,1,3}")
    assert str(HloSharding.parse("{devices=[2,2]0,2,1,3}")) == "{devices=[2,2]0,2,1,3}"


def test_constructors_match_xla_client_names():
    h = HloSharding.iota_tile([4, 1, 2], [2, 4], [1, 0], ["replicated"])
    assert str(h) == "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert str(HloSharding.maximal(5)) == "{maximal device=5}"
    assert HloSharding.replicate().is_replicated() and HloSharding.manual().is_manual()


@pytest.mark.parametrize("text, match", [
    ("{devices=[2,4]<=[2,4]}", r"at position 21 expected 'T\(' to start the iota transpose perm"),
    ("{devices=[2,2]0,1,2}", r"devices=\[2, 2\] needs 4 device ids, got 3"),
    ("{devices=[1]0}", "non-maximal shardings must have more than one device assigned"),
    ("{devices = [2,2] <=[4]}", r"at position 1 expected 'replicated', 'manual', 'unreduced', 'unknown', 'maximal' or 'devices='"),
    ("{replicated", r"at position 11 expected '}', got end of text"),
    ("{maximal device=x}", "at position 16 expected a device id"),
    ("{devices=[2,2]<=[4] last_tile_dims={bogus}}", "expected a subgroup type"),
    ("{devices=[2,2]<=[2,2]T(0,0)}", "not a permutation"),
    ("{devices=[2,2]<=[8]}", "products must match"),
    ("{devices=[2,2]0,0,1,2}", "must be distinct"),
    ("{replicated} x", "expected end of text"),
    ("{{replicated}, {manual}}", "tuple shardings are not supported"),
])
def test_bad_text_is_valueerror_naming_position(text, match):
    with pytest.raises(ValueError, match=match):
        HloSharding.parse(text)


# -- differential test against XLA's own parser -----------------------------------------------


@st.composite
def sharding_texts(draw):
    dims = draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=4))
    n = int(np.prod(dims))
    if draw(st.booleans()):
        reshape, rest = [], n
        while rest > 1:  # a random factorisation of n
            f = draw(st.sampled_from([d for d in (2, 3, 4, 6, 8, 12) if rest % d == 0] or [rest]))
            reshape.append(f)
            rest //= f
        reshape = reshape or [1]
        perm = draw(st.permutations(range(len(reshape))))
        body = "<=[" + ",".join(map(str, reshape)) + "]"
        if len(reshape) > 1:
            body += "T(" + ",".join(map(str, perm)) + ")"
    else:
        if n < 2:
            dims, n = dims + [2], n * 2
        body = ",".join(map(str, draw(st.permutations(range(n)))))
    text = "{devices=[" + ",".join(map(str, dims)) + "]" + body
    tail = draw(st.sampled_from(["", "rep", "types"]))
    if tail == "rep":
        text += " last_tile_dim_replicate"
    elif tail == "types":
        k = draw(st.integers(1, len(dims)))
        types = draw(st.lists(st.sampled_from(["manual", "replicated", "unreduced"]), min_size=k, max_size=k))
        text += " last_tile_dims={" + ", ".join(types) + "}"
    return text + "}"


@settings(max_examples=150, deadline=None)
@given(sharding_texts())
def test_parse_and_print_match_xla(text):
    xla = _compat.xla_parse_hlo_sharding(text)
    ours = HloSharding.parse(text)
    assert str(ours) == str(xla)
    if ours.is_tiled():
        assert ours.tile_assignment_devices.tolist() == list(xla.tile_assignment_devices())
        assert list(ours.tile_assignment_dimensions) == list(xla.tile_assignment_dimensions())
        assert ours.is_tile_assignment_iota() == xla.is_tile_assignment_iota()
    # Printing then parsing is not always the identity in XLA either ({devices=[2]0,1
    # last_tile_dims={unreduced}} re-parses as {unreduced}); match XLA's re-parse.
    if ours.tile_assignment_dimensions != ():  # XLA prints `devices=[]<=[1]`, which it cannot parse
        assert str(HloSharding.parse(str(ours))) == str(_compat.xla_parse_hlo_sharding(str(xla)))


# -- placement ------------------------------------------------------------------------------------


def test_devices_indices_map_partial_replication():
    h = HloSharding.parse("{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}")
    got = h.devices_indices_map((4, 6))
    # tile row 0 -> devices {0,2}; tile row 1 -> {1,3}; dim 1 is not cut
    assert got == {0: (slice(0, 2), slice(None)), 2: (slice(0, 2), slice(None)),
                   1: (slice(2, 4), slice(None)), 3: (slice(2, 4), slice(None))}
    assert h.shard_shape((4, 6)) == (2, 6)


def test_devices_indices_map_with_device_assignment():
    h = HloSharding.parse("{devices=[2,2]<=[4]}")
    got = h.devices_indices_map((2, 4), device_assignment=[7, 5, 3, 1])
    assert got == {7: (slice(0, 1), slice(0, 2)), 5: (slice(0, 1), slice(2, 4)),
                   3: (slice(1, 2), slice(0, 2)), 1: (slice(1, 2), slice(2, 4))}


def test_devices_indices_map_replicated_maximal_and_errors():
    full = (slice(None), slice(None))
    assert HloSharding.replicate().devices_indices_map((2, 2), [4, 9]) == {4: full, 9: full}
    assert HloSharding.maximal(1).devices_indices_map((2, 2), [4, 9]) == {9: full}
    with pytest.raises(ValueError, match="pass device_assignment"):
        HloSharding.replicate().devices_indices_map((2, 2))
    with pytest.raises(IndivisibleError, match="array axis 0 is partitioned 2 times, but the dimension size is 3"):
        HloSharding.parse("{devices=[2,1]0,1}").devices_indices_map((3, 2))
    with pytest.raises(ValueError, match="tiles 2 dimensions but the shape"):
        HloSharding.parse("{devices=[2,1]0,1}").devices_indices_map((4,))


# -- NamedSharding <-> HloSharding ------------------------------------------------------------


def test_named_to_hlo_jax_docstring_example():
    # jax/_src/named_sharding.py: mesh {'a','b','c','d'} of 2s, P(None, ('d','b'), 'c'), rank 4:
    # dims [1,4,2,1,2], reshape [2,2,2,2], perm [3,1,2,0], one replicated subgroup; XLA prints
    # the canonical iota (reshape dims 1 and 2 stay adjacent, so they merge), as JAX 0.10/0.12 do.
    mesh = Mesh((2, 2, 2, 2), ("a", "b", "c", "d"))
    h = NamedSharding(mesh, P(None, ("d", "b"), "c")).to_hlo(4)
    assert h == HloSharding.iota_tile([1, 4, 2, 1, 2], [2, 2, 2, 2], [3, 1, 2, 0], ["replicated"])
    assert str(h) == "{devices=[1,4,2,1,2]<=[2,4,2]T(2,1,0) last_tile_dim_replicate}"


@pytest.mark.parametrize("shape, names, spec, ndim, expected", [
    ((2, 4), ("x", "y"), P("x", "y"), 2, "{devices=[2,4]<=[8]}"),
    ((2, 4), ("x", "y"), P("y", "x"), 2, "{devices=[4,2]<=[2,4]T(1,0)}"),
    ((2, 4), ("x", "y"), P(("y", "x")), 2, "{devices=[8,1]<=[2,4]T(1,0)}"),
    ((2, 4), ("x", "y"), P(), 2, "{replicated}"),
    ((1, 4), ("a", "b"), P("a"), 2, "{replicated}"),  # size-1 axes are dropped
    ((2, 4), ("x", "y"), P(None, "x"), 3, "{devices=[1,2,1,4]<=[8] last_tile_dim_replicate}"),
])
def test_named_to_hlo_examples(shape, names, spec, ndim, expected):
    assert str(named_to_hlo(NamedSharding(Mesh(shape, names), spec), ndim)) == expected


def test_named_to_hlo_ignores_device_ids():
    ids = np.array([[3, 1, 0, 2], [7, 6, 5, 4]])
    s = NamedSharding(Mesh((2, 4), ("x", "y"), device_ids=ids), P("y"))
    assert str(s.to_hlo(2)) == "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"


def test_named_to_hlo_manual_and_unreduced_subgroups():
    M, E, A = refsim.AxisType.Manual, refsim.AxisType.Explicit, refsim.AxisType.Auto
    m = Mesh((2, 2, 2), ("a", "b", "c"), axis_types=(M, A, A))
    assert str(NamedSharding(m, P("b")).to_hlo(1)) == "{devices=[2,2,2]<=[2,2,2]T(1,0,2) last_tile_dims={manual, replicated}}"
    m = Mesh((2, 4), ("x", "y"), axis_types=(M, M))
    assert str(NamedSharding(m, P()).to_hlo(1)) == "{manual}"
    m = Mesh((2, 4), ("x", "y"), axis_types=(E, E))
    assert str(NamedSharding(m, P(None, unreduced={"x"})).to_hlo(1)) == "{devices=[1,2,4]<=[8] last_tile_dims={unreduced, replicated}}"
    assert str(NamedSharding(m, P(unreduced={"x", "y"})).to_hlo(1)) == "{unreduced}"


def test_hlo_to_named_recovers_spec():
    mesh = Mesh((2, 2, 2), ("a", "b", "c"), device_ids=np.array([5, 4, 7, 6, 1, 0, 3, 2]).reshape(2, 2, 2))
    h = HloSharding.parse("{devices=[1,4,2]<=[4,2]T(1,0) last_tile_dim_replicate}")
    assert h.to_partition_spec(mesh) == P(None, ("c", "a"))
    assert hlo_to_named(HloSharding.parse("{replicated}"), mesh).spec == P()
    assert hlo_to_named("{devices=[2,4]<=[8]}", Mesh((2, 4), ("x", "y"))).spec == P("x", "y")


@pytest.mark.parametrize("text, match", [
    ("{devices=[2,2,2]0,1,2,3,4,5,6,7}", "uses 8 devices"),
    ("{maximal device=0}", "maximal sharding"),
    ("{devices=[2,2]0,3,1,2}", "varies along tile dims"),  # no axis order gives this tiling
    ("{devices=[2,2]<=[4] last_tile_dims={manual}}", "not valid on this mesh|gives"),  # axes not Manual
])
def test_hlo_to_named_without_a_spec_is_valueerror(text, match):
    with pytest.raises(ValueError, match=f"No PartitionSpec on mesh .* gives HloSharding .*({match})"):
        hlo_to_named(HloSharding.parse(text), Mesh((2, 2), ("x", "y")))
