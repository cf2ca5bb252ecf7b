"""refsim.pmap maps over JAX's devices, as jax.pmap does (issue 28, point 7: 9 rows ran on 9
virtual devices where JAX, with 8 CPU devices, raises). `devices=` still names any virtual ids."""
import jax
import numpy as np
import pytest

import refsim
from refsim import IndivisibleError


def _psum(v):
    return jax.lax.psum(v, "i")


@pytest.mark.parametrize("n", [9, 12, 16])
def test_more_rows_than_devices_raise_what_jax_raises(n):
    count = jax.device_count()
    assert count == 8  # tests/conftest.py: 8 virtual CPU devices
    x = np.arange(float(n))
    with pytest.raises(ValueError) as jerr:
        jax.pmap(_psum, axis_name="i")(x)
    with pytest.raises(ValueError) as rerr:
        refsim.pmap(_psum, axis_name="i")(x)
    # JAX: IndivisibleError when 8 does not divide n, another ValueError when it does
    assert (type(jerr.value).__name__ == "IndivisibleError") == (n % count != 0)
    assert isinstance(rerr.value, IndivisibleError) == (n % count != 0)
    assert str(rerr.value).startswith(f"pmap got a mapped axis of size {n}, but JAX has 8 devices here")


def test_up_to_the_device_count_agrees_with_jax():
    for n in (1, 4, 8):
        x = np.arange(float(n))
        np.testing.assert_array_equal(np.asarray(refsim.pmap(_psum, axis_name="i")(x)),
                                      np.asarray(jax.pmap(_psum, axis_name="i")(x)))


def test_devices_name_virtual_ids_of_any_count():
    out = refsim.pmap(_psum, axis_name="i", devices=range(9))(np.arange(9.0))
    assert np.asarray(out).tolist() == [36.0] * 9
    assert sorted(s.device_id for s in out.shards) == list(range(9))
