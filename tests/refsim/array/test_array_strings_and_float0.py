"""Values JAX places or passes that carry no numbers (issue 42, point 5): NumPy's StringDType arrays,
which `jax.device_put` places and reshards (a jit refuses them), and `jax.dtypes.float0` arrays,
the data-less tangents jit and pmap take as arguments. Expected layouts by hand."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from numpy.dtypes import StringDType

import refsim
from refsim import Mesh, NamedSharding, PartitionSpec as P

MESH = Mesh((2, 4), ("x", "y"))
WORDS = np.array(["a", "bc", "def", "", "ghij", "k", "lm", "nop"], dtype=StringDType())


def test_device_put_places_and_reshards_a_string_array():
    a = refsim.device_put(WORDS, NamedSharding(MESH, P("y")))
    # by hand: device (i, j) holds words 2j, 2j+1
    assert [s.data.tolist() for s in a.shards[:4]] == [["a", "bc"], ["def", ""], ["ghij", "k"], ["lm", "nop"]]
    assert [s.data.tolist() for s in a.shards[4:]] == [s.data.tolist() for s in a.shards[:4]]
    b = refsim.device_put(a, NamedSharding(MESH, P("x")))
    assert [b.shards[d].data.tolist() for d in (0, 4)] == [["a", "bc", "def", ""], ["ghij", "k", "lm", "nop"]]
    assert np.asarray(b).tolist() == WORDS.tolist()


def test_fixed_width_strings_stay_refused_as_jax_refuses_them():
    with pytest.raises(TypeError, match="Dtype <U1 is not a valid JAX array type"):
        refsim.device_put(np.array(["a", "b"]), NamedSharding(MESH, P()))


def test_a_float0_argument_flows_through_a_pmap():
    t = np.zeros((4, 3), dtype=jax.dtypes.float0)
    out, tan = refsim.pmap(lambda a, b: (a + 1, b), axis_name="i")(np.arange(12, dtype=np.int32).reshape(4, 3), t)
    np.testing.assert_array_equal(np.asarray(out), np.arange(12).reshape(4, 3) + 1)
    assert tan.dtype == jax.dtypes.float0 and tan.shape == (4, 3)
