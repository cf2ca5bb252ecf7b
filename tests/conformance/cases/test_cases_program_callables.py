"""conformance.cases.program: one entry callable per case structure, never a stale one.

Expected values are hand computed from the layouts (device d at mesh position p holds the
block the spec gives p)."""
import dataclasses

import numpy as np
import pytest

import refsim
import xla_backend
from conformance.cases.program import Program
from refsim import NamedSharding, P

SRC_SCALE = "def f(a):\n    return a * (1 + jax.lax.axis_index('i'))\n"
SRC_SHIFT = "def f(a):\n    return a + (1 + jax.lax.axis_index('i'))\n"


def _case(mesh, args, *, source=SRC_SCALE, in_specs=(P("i"),), out_specs=P("i"), **kw):
    return Program("t", source, "shard_map", mesh, args, in_specs=in_specs, out_specs=out_specs, **kw)


def _blocks(arr):
    return {s.device_id: s.data.tolist() for s in arr.shards}


def test_cases_that_differ_only_in_data_share_one_callable():
    mesh = xla_backend.mesh((8,), ("i",))
    a = _case(mesh, (np.arange(8, dtype=np.int32),))
    b = dataclasses.replace(a, args=(np.arange(8, 16, dtype=np.int32),))
    for api in (xla_backend, refsim):
        assert a.entry_callable(api) is b.entry_callable(api)
    assert a.entry_callable(xla_backend) is not a.entry_callable(refsim)
    # device k multiplies its element by k + 1
    assert _blocks(b.run(xla_backend)) == {k: [(8 + k) * (k + 1)] for k in range(8)}
    assert _blocks(b.run(refsim)) == {k: [(8 + k) * (k + 1)] for k in range(8)}


def test_a_changed_structure_gets_its_own_callable():
    mesh = xla_backend.mesh((8,), ("i",))
    x = (np.arange(8, dtype=np.int32),)
    base = _case(mesh, x)
    base.run(xla_backend)
    # device order: position k is device 7 - k, holding element k, multiplied by k + 1
    rev = _case(xla_backend.mesh((8,), ("i",), order="reversed"), x)
    assert _blocks(rev.run(xla_backend)) == {7 - k: [k * (k + 1)] for k in range(8)}
    # source: added, not multiplied
    shift = _case(mesh, x, source=SRC_SHIFT)
    assert _blocks(shift.run(xla_backend)) == {k: [k + k + 1] for k in range(8)}
    # in_specs: every device gets the whole array; out_specs P('i') stacks the 8 blocks
    whole = _case(mesh, x, in_specs=(P(),))
    out = whole.run(xla_backend)
    assert out.shape == (64,) and _blocks(out)[3] == [4 * v for v in range(8)]
    # out_specs: a replicated result (the function gives every device the same value)
    psum = "def f(a):\n    return jax.lax.psum(a, 'i')\n"
    stacked = _case(mesh, x, source=psum, out_specs=P("i"))
    out = stacked.run(xla_backend)
    assert out.shape == (8,) and _blocks(out) == {k: [28] for k in range(8)}
    same = _case(mesh, x, source=psum, out_specs=P())
    out = same.run(xla_backend)
    assert out.shape == (1,) and _blocks(out) == {k: [28] for k in range(8)}
    # a tuple equals the PartitionSpec P('i'), but it is no spec (a pytree node): JAX's error,
    # not the callable built for P('i')
    tup = _case(mesh, x, in_specs=(("i",),))
    with pytest.raises(ValueError, match="not a pytree prefix"):
        tup.run(xla_backend)


def test_jit_cases_keyed_by_their_shardings():
    mesh = xla_backend.mesh((2, 4), ("x", "y"))
    x = (np.arange(8, dtype=np.float32),)
    src = "def f(a):\n    return a * 2\n"
    by_x = Program("t", src, "jit", mesh, x, in_shardings=(NamedSharding(mesh, P("x")),),
                   out_shardings=NamedSharding(mesh, P("x")))
    by_y = dataclasses.replace(by_x, out_shardings=NamedSharding(mesh, P("y")))
    ox, oy = by_x.run(xla_backend), by_y.run(xla_backend)
    assert ox.sharding.spec == P("x") and oy.sharding.spec == P("y")
    # P('x') on 2x4: device at position (i, j) holds elements 4i..4i+3; P('y'): 2j..2j+1
    for (i, j), d in np.ndenumerate(mesh.device_ids):
        assert ox.shard(int(d)).data.tolist() == [2.0 * v for v in range(4 * i, 4 * i + 4)]
        assert oy.shard(int(d)).data.tolist() == [2.0 * v for v in range(2 * j, 2 * j + 2)]


def test_an_unhashable_field_runs_uncached():
    mesh = xla_backend.mesh((8,), ("i",))
    case = _case(mesh, (np.arange(8, dtype=np.int32),), axis_names={"i"})  # a set: no key
    assert case.entry_callable(xla_backend) is not case.entry_callable(xla_backend)
    assert _blocks(case.run(xla_backend)) == {k: [k * (k + 1)] for k in range(8)}
    # a list field is keyed element by element, apart from the equal tuple: JAX refuses a list
    # where the arguments are a tuple, and so must the case, after the tuple case ran
    tup = _case(mesh, case.args)
    tup.run(xla_backend)
    lst = _case(mesh, case.args, in_specs=[P("i")])
    assert lst.entry_callable(xla_backend) is lst.entry_callable(xla_backend)
    assert lst.entry_callable(xla_backend) is not tup.entry_callable(xla_backend)
    with pytest.raises(ValueError, match="pytree structure"):
        lst.run(xla_backend)
