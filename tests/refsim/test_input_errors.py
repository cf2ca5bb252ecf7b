"""Bad input gets JAX's exception class and a message naming the argument (issue 19's findings).

Where JAX has the same call, the test makes it too and checks that refsim raises the class JAX
raises (or a subclass); where JAX accepts the call, refsim's documented rule is checked
(docs/errors.md). Values JAX accepts and refsim used to get silently wrong are compared with
JAX's result. CLI and report findings are in tests/conformance/cli/test_cli_errors.py.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import refsim
import refsim.collectives as C
from refsim import AbstractMesh, HloSharding, Mesh, NamedSharding, P
from refsim import compat as _compat

MESH = Mesh((2, 4), ("x", "y"))
JMESH = jax.make_mesh((2, 4), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
JP = jax.sharding.PartitionSpec


def _raises_like_jax(refsim_call, jax_call, match):
    """refsim_call raises what jax_call raises (same class or a subclass), with `match` in the text."""
    with pytest.raises(Exception) as jerr:
        jax_call()
    with pytest.raises(Exception, match=match) as rerr:
        refsim_call()
    jcls, rcls = type(jerr.value), type(rerr.value)
    # DuplicateSpecError is defined by both (refsim cannot subclass JAX's private class): same name.
    assert issubclass(rcls, jcls) or rcls.__name__ == jcls.__name__, (
        f"refsim raised {rcls.__name__}: {rerr.value}\nJAX raised {jcls.__name__}: {jerr.value}")
    return rerr.value


# ---- silently different before: now as JAX --------------------------------------------------------

def test_psum_scatter_of_bool_is_a_type_error_as_in_jax():
    x = np.ones((8,), bool)
    prog = lambda a: jax.lax.psum_scatter(a, "y", tiled=True)  # noqa: E731
    _raises_like_jax(
        lambda: refsim.shard_map(prog, mesh=MESH, in_specs=P(), out_specs=P("y"))(x),
        lambda: jax.shard_map(prog, mesh=JMESH, in_specs=JP(), out_specs=JP("y"))(x),
        match="bool")
    # the direct API (no JAX tracing in between) follows the same rule
    with pytest.raises(TypeError, match="psum_scatter does not accept dtype bool"):
        C.psum_scatter(np.ones((1, 4, 8), bool), "y", tiled=True, mesh=MESH)


@pytest.mark.parametrize("value", [np.full(8, 2**40), np.arange(8.0) / 3, np.arange(8, dtype=np.uint64) * 2**33,
                                   np.arange(8) * (1 + 1j)], ids=["int64", "float64", "uint64", "complex128"])
def test_device_put_canonicalises_64_bit_values_as_jax(value):
    assert not jax.config.jax_enable_x64
    ours = refsim.device_put(value, NamedSharding(MESH, P("x")))
    theirs = jax.device_put(value, jax.sharding.NamedSharding(JMESH, JP("x")))
    assert ours.dtype == theirs.dtype and ours.dtype.itemsize == value.dtype.itemsize // 2
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    cb = refsim.make_array_from_callback((8,), NamedSharding(MESH, P("x")), lambda idx: value[idx])
    assert cb.dtype == theirs.dtype
    with pytest.warns(UserWarning, match=f"requested dtype {value.dtype} .* truncated to dtype {theirs.dtype}"):
        asked = refsim.make_array_from_callback((8,), NamedSharding(MESH, P("x")), lambda idx: value[idx],
                                                dtype=value.dtype)  # JAX canonicalises dtype= as well, and warns
    with pytest.warns(UserWarning, match="truncated"):
        jax_asked = jax.make_array_from_callback((8,), jax.sharding.NamedSharding(JMESH, JP("x")),
                                                 lambda idx: value[idx], dtype=value.dtype)
    assert asked.dtype == jax_asked.dtype
    np.testing.assert_array_equal(np.asarray(cb), np.asarray(theirs))


@pytest.mark.parametrize("value", [np.array(list("abcdefgh")), np.array([object()] * 8),
                                   np.arange(8).astype("datetime64[s]")], ids=["str", "object", "datetime64"])
def test_non_numeric_values_are_type_errors_as_in_jax(value):
    s, js = NamedSharding(MESH, P("x")), jax.sharding.NamedSharding(JMESH, JP("x"))
    _raises_like_jax(lambda: refsim.device_put(value, s), lambda: jax.device_put(value, js),
                     match=re.escape(f"x has dtype {value.dtype}.") + ".*not a valid JAX array type")
    if _compat.jax_version() < (0, 10):   # jax 0.9 takes the callback's value; PjRt refuses it (JaxRuntimeError)
        return
    _raises_like_jax(lambda: refsim.make_array_from_callback((8,), s, lambda i: value[i]),
                     lambda: jax.make_array_from_callback((8,), js, lambda i: value[i]),
                     match=r"data_callback\(.*not a valid JAX array type")


def test_a_string_program_argument_is_a_type_error_as_in_jax():
    prog = lambda a: a  # noqa: E731
    _raises_like_jax(lambda: refsim.shard_map(prog, mesh=MESH, in_specs=P(), out_specs=P())("abc"),
                     lambda: jax.shard_map(prog, mesh=JMESH, in_specs=JP(), out_specs=JP())("abc"),
                     match=r"a program argument has dtype <U3.* The argument: 'abc'")


def test_python_int_too_large_is_an_overflow_error_as_in_jax():
    _raises_like_jax(lambda: refsim.device_put(2**40, NamedSharding(MESH, P())),
                     lambda: jax.device_put(2**40, jax.sharding.NamedSharding(JMESH, JP())),
                     match=r"Python int x=1099511627776 too large to convert to int32")


def test_tiled_gather_and_scatter_over_an_empty_dimension_are_rejected_as_xla_does():
    x = np.ones((4, 0), np.float32)
    gather = lambda a: jax.lax.all_gather(a, "y", axis=1, tiled=True)  # noqa: E731
    _raises_like_jax(
        lambda: refsim.shard_map(gather, mesh=MESH, in_specs=P(), out_specs=P(), check_vma=False)(x),
        lambda: jax.shard_map(gather, mesh=JMESH, in_specs=JP(), out_specs=JP(), check_vma=False)(x),
        match="all_gather_dimension=1 has size 0")
    scatter = lambda a: jax.lax.psum_scatter(a, "y", scatter_dimension=1, tiled=True)  # noqa: E731
    _raises_like_jax(
        lambda: refsim.shard_map(scatter, mesh=MESH, in_specs=P(), out_specs=P(None, "y"))(x),
        lambda: jax.shard_map(scatter, mesh=JMESH, in_specs=JP(), out_specs=JP(None, "y"))(x),
        match="scatter_dimension=1 has size 0")
    # an untiled gather stacks a new dimension: an empty operand is fine on both
    untiled = lambda a: jax.lax.all_gather(a, "y", axis=0)  # noqa: E731
    ours = refsim.shard_map(untiled, mesh=MESH, in_specs=P(), out_specs=P(), check_vma=False)(np.ones((0,), np.float32))
    assert ours.shape == (4, 0)


def test_abstract_mesh_size_is_exact_beyond_int64():
    assert AbstractMesh((2**32, 2**32), ("a", "b")).size == 2**64
    assert jax.sharding.AbstractMesh((2**32, 2**32), ("a", "b")).size == 2**64


def test_axis_index_groups_may_be_a_generator_in_the_direct_api():
    x = np.arange(8.0).reshape(1, 4, 2) + 10 * np.arange(2).reshape(2, 1, 1)  # mesh-major: (x, y, local)
    as_list = C.psum(x, "y", axis_index_groups=[[0, 2], [1, 3]], mesh=MESH)
    from_gen = C.psum(x, "y", axis_index_groups=([i, i + 2] for i in range(2)), mesh=MESH)
    np.testing.assert_array_equal(from_gen, as_list)
    expected = x[:, [0, 1]] + x[:, [2, 3]]  # by hand: members 0+2 and 1+3
    np.testing.assert_array_equal(as_list[:, [0, 1]], expected)
    g = C.all_gather(x, "y", axis_index_groups=iter([[0, 1], [2, 3]]), mesh=MESH)
    assert g.shape[-2:] == (2, 2)


@pytest.mark.parametrize("in_axes,shape", [(-3, (8, 8)), (2, (8, 8)), (0, ())])
def test_pmap_in_axes_out_of_range_is_an_index_error_as_in_jax(in_axes, shape):
    x = np.ones(shape, np.float32)
    _raises_like_jax(lambda: refsim.pmap(lambda a: a, in_axes=in_axes)(x),
                     lambda: jax.pmap(lambda a: a, in_axes=in_axes)(x),
                     match=rf"pmap in_axes={in_axes} is out of range for an argument of rank {len(shape)}")
    ok = refsim.pmap(lambda a: a * 2, in_axes=-2)(np.arange(32.0, dtype=np.float32).reshape(8, 4))
    np.testing.assert_array_equal(np.asarray(ok), np.arange(32.0).reshape(8, 4) * 2)


# ---- internal errors before: now clear errors ------------------------------------------------------

def test_duplicate_axis_in_shard_map_specs_is_jax_duplicate_spec_error():
    err = _raises_like_jax(
        lambda: refsim.shard_map(lambda a: a, mesh=MESH, in_specs=P("x", "x"), out_specs=P("x"))(np.ones((8, 8))),
        lambda: jax.shard_map(lambda a: a, mesh=JMESH, in_specs=JP("x", "x"), out_specs=JP("x"))(np.ones((8, 8))),
        match=r"duplicate entries for `x` \(in refsim.shard_map in_specs")
    assert isinstance(err, refsim.DuplicateSpecError)
    with pytest.raises(refsim.DuplicateSpecError, match="out_specs"):
        refsim.shard_map(lambda a: a, mesh=MESH, in_specs=P("x"), out_specs=P(("x", "y"), "y"))


@pytest.mark.parametrize("text,spec", [("{devices=[2,4]<=[8]}", P("x", "y")),
                                       ("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", P("x")),
                                       ("{devices=[4,2]<=[2,4]T(1,0)}", P("y", "x"))])
def test_device_put_takes_an_hlo_sharding(text, spec):
    value = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    hlo = HloSharding.parse(text)
    ours = refsim.device_put(value, hlo)
    named = refsim.device_put(value, NamedSharding(MESH, spec))
    assert NamedSharding(MESH, spec).to_hlo(2) == hlo  # the same layout, written two ways
    assert {s.device_id: (s.index, s.replica_id) for s in ours.shards} == \
        {s.device_id: (s.index, s.replica_id) for s in named.shards}
    np.testing.assert_array_equal(np.asarray(ours), value)


@pytest.mark.parametrize("groups,match", [([], r"axis_index_groups=\(\) holds no group"),
                                          ([[], list(range(8))], "has an empty group at position 0")])
def test_empty_axis_index_groups_are_value_errors(groups, match):
    prog = lambda a: jax.lax.psum(a, "i", axis_index_groups=groups)  # noqa: E731
    with pytest.raises(ValueError, match=match):
        refsim.pmap(prog, axis_name="i")(np.ones(8, np.float32))
    if not groups:  # JAX: ValueError from the StableHLO verifier ([[]...] is an XLA runtime error)
        with pytest.raises(ValueError):
            jax.pmap(prog, axis_name="i")(np.ones(8, np.float32))
    with pytest.raises(ValueError, match=match.replace(r"\(\)", r"\[\]")):
        C.psum(np.ones((8, 1)), "i", axis_index_groups=groups, mesh=Mesh((8,), ("i",)))


@pytest.mark.parametrize("shape,bad", [((True, 8), "True of type bool"), ((2.0, 4), "2.0 of type float"),
                                       (("2", 4), "'2' of type str")])
def test_mesh_sizes_must_be_ints(shape, bad):
    with pytest.raises(TypeError, match=f"shape=.*contains {bad}; every axis size must be an int"):
        Mesh(shape, ("a", "b"))
    with pytest.raises(TypeError, match=f"axis_sizes=.*contains {bad}"):
        AbstractMesh(shape, ("a", "b"))
    with pytest.raises(ValueError, match=r"shape=\(0, 4\) contains 0; every axis size must be a positive int"):
        Mesh((0, 4), ("a", "b"))


def test_device_put_of_none_and_of_ragged_lists():
    s = NamedSharding(MESH, P())
    with pytest.raises(TypeError, match=r"refsim.device_put: x=None is not an array"):
        refsim.device_put(None, s)
    with pytest.raises(ValueError) as jerr:
        jnp.asarray([[1, 2], [3]])  # JAX's class for a ragged array-like
    with pytest.raises(type(jerr.value), match=r"x is not a rectangular array: .*same length"):
        refsim.device_put([[1, 2], [3]], s)


def test_huge_iota_tile_assignments_are_not_listed():
    text = "{devices=[65536,65536]<=[4294967296]}"
    h = HloSharding.parse(text)
    assert str(h) == text and h.num_devices() == 2**32 and h.tile_assignment_dimensions == (65536, 65536)
    assert h == HloSharding.parse(text) and hash(h) == hash(HloSharding.parse(text))
    assert h != HloSharding.parse("{devices=[65536,65536]<=[65536,65536]T(1,0)}")
    assert h.shard_shape((2**17, 2**16)) == (2, 1)
    with pytest.raises(ValueError, match="assigns 4294967296 devices"):
        h.devices_indices_map((2**17, 2**16))
    # a small iota lists its devices on demand, exactly as the explicit form
    small = HloSharding.parse("{devices=[4,2]<=[2,4]T(1,0)}")
    assert small == HloSharding.parse("{devices=[4,2]0,4,1,5,2,6,3,7}")
    assert small.tile_assignment_devices.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


@pytest.mark.parametrize("text,match", [
    ("{maximal device=99999999999999999999}", r"maximal device=99999999999999999999 is not a device id"),
    ("{maximal device=-1}", r"maximal device=-1 is not a device id"),
    ("{devices=[2]<=[2]T(0)}", r"single iota reshape dim \[2\] takes no transpose"),
    ("{devices=[2,2]<=[2,2]T(0,0)}", r"transpose perm \[0, 0\] is not a permutation"),
    ("{devices=[2,2]<=[2,2]T(0,1,2)}", r"transpose perm \[0, 1, 2\] is not a permutation"),
    ("{devices=[4]<=[0]}", r"reshape dims \[0\] must all be positive"),
])
def test_hlo_text_xla_rejects_is_rejected(text, match):
    with pytest.raises(ValueError, match=match):
        HloSharding.parse(text)


@pytest.mark.parametrize("name", ['a"b', "a\nb", "é", "a\\b", "a\tb", "x"])
def test_shardy_escapes_axis_names_as_jax_prints_them(name):
    ours = NamedSharding(AbstractMesh((2,), (name,)), P(name)).to_shardy(1, mesh_name=None)
    js = jax.sharding.NamedSharding(jax.sharding.AbstractMesh((2,), (name,)), JP(name))
    assert ours == _compat.jax_sdy_sharding_text(js, 1, False)
    assert "\n" not in ours and ours.isascii()


def test_every_internal_class_stays_out():
    """None of the calls above may surface an internal exception class (a meta-check on this module)."""
    internal = (AssertionError, AttributeError, IndexError, KeyError, MemoryError)
    calls = [
        lambda: refsim.device_put(np.ones((4, 4)), HloSharding.parse("{devices=[2,2]<=[4]}")),
        lambda: HloSharding.parse("{devices=[65536,65536]<=[4294967296]}").devices_indices_map((2**16, 2**16)),
        lambda: C.psum(np.ones((8, 1)), "i", axis_index_groups=[], mesh=Mesh((8,), ("i",))),
        lambda: Mesh((True, 8), ("a", "b")),
        lambda: refsim.device_put(None, NamedSharding(MESH, P())),
        lambda: refsim.shard_map(lambda a: a, mesh=MESH, in_specs=P("x", "x"), out_specs=P()),
    ]
    for call in calls:
        try:
            call()
        except internal as e:  # pragma: no cover - the failure message is the point
            pytest.fail(f"internal {type(e).__name__} reached the user: {e}")
        except Exception:
            pass


def test_wrong_kinds_of_names_and_pairs_name_the_argument():
    with pytest.raises(TypeError, match=r"axis_names=None must be a tuple of strings"):
        Mesh((2,), None)
    with pytest.raises(TypeError, match=r"ppermute: perm=\[0, 1\] must be a list of \(source, destination\) pairs"):
        C.ppermute(np.ones((2, 4, 1)), "y", [0, 1], mesh=MESH)
