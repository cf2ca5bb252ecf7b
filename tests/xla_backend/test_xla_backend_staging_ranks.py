"""An argument of lower rank than its spec, as a Python list gives (each element is an argument
of its own), is a ValueError naming the argument and the spec, as JAX raises for the same call
(issue 28, point 7: it was a bare IndexError / AssertionError from inside JAX)."""
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import conformance
import refsim
import xla_backend

MESH = refsim.Mesh((8,), ("i",))
JMESH = xla_backend.jax_mesh(MESH)
LIST = [float(i) for i in range(8)]


def _ident(v):
    return v


def test_shard_map_of_a_list_raises_what_jax_raises():
    with pytest.raises(ValueError, match=r"(?s)in_specs entry which is too long .* args\[0\]\[0\]"):
        jax.jit(jax.shard_map(_ident, mesh=JMESH, in_specs=P("i"), out_specs=P("i")))(LIST)
    for call in (lambda: xla_backend.shard_map(_ident, mesh=MESH, in_specs=P("i"), out_specs=P("i"))(LIST),
                 lambda: conformance.check(_ident, LIST, mesh=JMESH, in_specs=P("i"), out_specs=P("i"))):
        with pytest.raises(ValueError, match=r"^in_specs entry P\('i',\) has length 1, but args\[0\]\[0\] "
                                             r"has shape \(\), of rank 0 \(0 < 1\).*A Python list or tuple is a "
                                             r"pytree.*np.asarray"):
            call()


def test_jit_of_a_list_raises_what_jax_raises():
    sharding = jax.NamedSharding(JMESH, P("i"))
    with pytest.raises(ValueError, match=r"pytree key path v\[0\] is incompatible"):
        jax.jit(_ident, in_shardings=sharding)(LIST)
    for call in (lambda: xla_backend.jit(_ident, in_shardings=refsim.NamedSharding(MESH, P("i")))(LIST),
                 lambda: conformance.check(_ident, LIST, in_shardings=sharding)):
        with pytest.raises(ValueError, match=r"^in_shardings entry of spec P\('i',\) has length 1, but "
                                             r"args\[0\]\[0\] has shape \(\), of rank 0"):
            call()


def test_a_scalar_under_a_spec_is_named_without_the_list_hint():
    with pytest.raises(ValueError, match=r"args\[0\] has shape \(\), of rank 0 \(0 < 1\): a spec names at most one "
                                         r"mesh axis group per dimension of its argument\.$"):
        xla_backend.shard_map(_ident, mesh=MESH, in_specs=P("i"), out_specs=P("i"))(np.float32(1))


def test_arrays_of_enough_rank_are_placed_as_before():
    out = xla_backend.shard_map(_ident, mesh=MESH, in_specs=P("i"), out_specs=P("i"))(np.asarray(LIST))
    assert np.asarray(out).tolist() == LIST
