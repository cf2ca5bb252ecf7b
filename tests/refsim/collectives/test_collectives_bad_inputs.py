"""Bad collective inputs that refsim used to accept where JAX fails (issue 28, point 7). Each test
makes the same call on XLA (xla_backend, the installed JAX) and checks that refsim raises the class
JAX raises, or agrees with JAX where this JAX accepts the call."""
import jax
import numpy as np
import pytest
from jax._src.lax import parallel as lax_parallel

import refsim
import xla_backend
from refsim import Mesh, P
from refsim import compat

MESH = Mesh((8,), ("i",))
XC = (np.arange(8) + 1j * np.arange(8)[::-1]).astype(np.complex64)


def _both(fn, x, in_specs=P("i"), out_specs=P("i")):
    """(refsim's outcome, XLA's outcome): the result, or the exception raised."""
    out = []
    for lib in (refsim, xla_backend):
        try:
            out.append(np.asarray(lib.shard_map(fn, mesh=MESH, in_specs=in_specs, out_specs=out_specs)(x)))
        except Exception as e:  # noqa: BLE001 - the exception is the outcome
            out.append(e)
    return out


@pytest.mark.parametrize("name, fn", [
    ("pmax", lambda v: jax.lax.pmax(v, "i")),
    ("pmin", lambda v: jax.lax.pmin(v, "i")),
    ("pmax", lambda v: lax_parallel.pargmax(v, "i")),
])
def test_complex_max_and_min_reductions_fail_as_on_xla(name, fn):
    ref, xla = _both(fn, XC)
    assert isinstance(xla, jax.errors.JaxRuntimeError) and "UNIMPLEMENTED" in str(xla), xla
    assert isinstance(ref, jax.errors.JaxRuntimeError), ref
    assert str(ref).startswith(f"UNIMPLEMENTED: {name} of complex64 values over ('i',): XLA has no all-reduce")
    assert "jnp.abs(x)" in str(ref)  # the fix


def test_complex_pmax_in_pmap_fails_as_in_jax():
    with pytest.raises(jax.errors.JaxRuntimeError, match="UNIMPLEMENTED"):
        jax.pmap(lambda v: jax.lax.pmax(v, "i"), axis_name="i")(XC)
    with pytest.raises(jax.errors.JaxRuntimeError, match="UNIMPLEMENTED: pmax of complex64"):
        refsim.pmap(lambda v: jax.lax.pmax(v, "i"), axis_name="i")(XC)


def test_complex_psum_and_real_pmax_still_agree():
    for fn, x in ((lambda v: jax.lax.psum(v, "i"), XC), (lambda v: jax.lax.pmax(v, "i"), XC.real.copy())):
        ref, xla = _both(fn, x, out_specs=P())
        np.testing.assert_array_equal(ref, xla)


X = np.arange(8 * 16 * 2, dtype=np.float32).reshape(128, 2)


@pytest.mark.parametrize("name, fn", [
    ("scatter_dimension=-2", lambda v: jax.lax.psum_scatter(v, "i", scatter_dimension=-2, tiled=True)),
    ("split_axis=-2", lambda v: jax.lax.all_to_all(v, "i", -2, -2, tiled=True)),
])
def test_a_negative_dimension_is_refused_or_counted_as_this_jax_does(name, fn):
    ref, xla = _both(fn, X)
    if compat.binds_nonnegative_collective_dims():  # jax >= 0.11 normalises it when it binds the primitive
        np.testing.assert_array_equal(ref, xla)
    else:  # jax 0.9 and 0.10 bind it as given; their lowering refuses it (StableHLO's verifier)
        assert isinstance(xla, ValueError) and "non-negative" in str(xla), xla
        assert isinstance(ref, ValueError), ref
        assert name in str(ref) and "must be non-negative" in str(ref) and "x.ndim - 2" in str(ref)


def test_eager_psum_scatter_counts_a_negative_dimension_from_the_end():
    from refsim.collectives import psum_scatter

    x = np.arange(8 * 16, dtype=np.float32).reshape(8, 16, 1)  # device-stacked, local (16, 1)
    a = psum_scatter(x, "i", scatter_dimension=-2, tiled=True, mesh=MESH)
    b = psum_scatter(x, "i", scatter_dimension=0, tiled=True, mesh=MESH)
    np.testing.assert_array_equal(a, b)
