"""The element check inside both reproducer templates (`conformance.cases.repro`, `conformance.oracle.reproduce`)
holds a complex number part by part, as `conformance.verdict.compare` does: NaN in one part only and the
sign of an imaginary zero are differences; a float zero's sign counts for bfloat16 too."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from conformance.cases import repro
from conformance.oracle import reproduce


def _template_same(module):
    """The `same` function the module's reproducer template defines, run as a reproducer runs it:
    the embedded element check, cut from the template's text up to its `def check(`."""
    start = module._MAIN.index("# -- the element check:")
    src = module._MAIN[start:module._MAIN.index("\ndef check(", start)]
    ns = {}
    exec(src, ns)
    return ns["same"]


@pytest.mark.parametrize("module", [repro, reproduce], ids=["repro", "oracle.reproduce"])
def test_template_element_check_is_part_by_part(module):
    same = _template_same(module)
    nan = float("nan")
    have = np.array([complex(nan, 1), complex(1, -0.0), complex(nan, nan), 2 + 3j], np.complex64)
    want = np.array([complex(nan, 2), complex(1, 0.0), complex(nan, nan), 2 + 3j], np.complex64)
    # by hand: imaginary 1 vs 2 differs; -0 vs +0 imaginary differs under exact; NaN == NaN; equal
    np.testing.assert_array_equal(same(have, want, True), [False, False, True, True])
    np.testing.assert_array_equal(same(have, want, False), [False, True, True, True])
    bf = np.array([-0.0, 0.0, nan, 1.5], ml_dtypes.bfloat16)
    np.testing.assert_array_equal(same(bf, np.array([0.0, 0.0, nan, 1.5], ml_dtypes.bfloat16), True),
                                  [False, True, True, True])
    ints = np.array([1, 2, 3], np.int32)
    np.testing.assert_array_equal(same(ints, np.array([1, 0, 3], np.int32), True), [True, False, True])
