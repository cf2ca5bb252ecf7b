"""conformance.verdict.compare.bits_equal, compare's fast path: equal bits pass every element
check, and any difference (one bit, a NaN payload, a zero's sign) sends the output to the
element analysis, whose verdict and mismatch text are unchanged."""

import ml_dtypes
import numpy as np
import pytest

from conformance.verdict import compare as C
from conformance.verdict.compare import EXACT, Exact, SumBound, Ulp, bits_equal, compare
from fake_arrays import Arr, Sh


def one(a):
    a = np.asarray(a)
    return Arr(a.shape, a.dtype, [Sh(0, tuple(slice(None) for _ in a.shape), a)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8, np.uint64,
                                   np.complex64, np.complex128, bool])
def test_equal_bits_by_dtype(dtype):
    a = (np.arange(24).reshape(2, 3, 4) % 3).astype(dtype)
    assert bits_equal(a, a.copy())
    b = a.copy()
    b[1, 2, 3] = (not b[1, 2, 3]) if dtype is bool else a[1, 2, 3] + 1
    assert b[1, 2, 3] != a[1, 2, 3]
    assert not bits_equal(a, b)


def test_signed_zero_and_nan_payload_differ_in_bits():
    assert not bits_equal(np.array([0.0], np.float32), np.array([-0.0], np.float32))
    nan1 = np.array([0x7FC00000], np.uint32).view(np.float32)
    nan2 = np.array([0x7FC00001], np.uint32).view(np.float32)
    assert not bits_equal(nan1, nan2)
    assert bits_equal(nan1, nan1.copy())
    # a differing zero sign under an unsigned-zero policy is still equal: the element check decides
    assert compare(one(np.array([0.0], np.float32)), one(np.array([-0.0], np.float32)),
                   tolerances=Exact(signed_zero=False)).ok
    assert not compare(one(np.array([0.0], np.float32)), one(np.array([-0.0], np.float32))).ok
    assert compare(one(nan1), one(nan2)).ok                    # NaN payloads are ignored by `same`


def test_shape_dtype_and_unviewable_dtypes():
    a = np.zeros((4,), np.float32)
    assert not bits_equal(a, a.reshape(2, 2))
    assert not bits_equal(a, a.astype(np.float64))
    ld = np.zeros(3, np.longdouble)
    assert not bits_equal(ld, ld.copy())                       # padding bytes: no bit view


def test_blocks_and_strided_views(monkeypatch):
    monkeypatch.setattr(C, "_BITS_BLOCK", 64)                 # many blocks on a small array
    a = np.arange(4 * 50 * 3, dtype=np.float32).reshape(4 * 50, 3)
    assert bits_equal(a, a.copy())
    b = a.copy()
    b[-1, -1] += 1
    assert not bits_equal(a, b)
    t = np.ascontiguousarray(a.T)
    assert bits_equal(a.T, t)                                  # a transposed view against its copy
    assert not bits_equal(b.T, t)
    assert bits_equal(np.broadcast_to(a[:1], (7, 3)), np.repeat(a[:1], 7, axis=0))


def test_compare_verdicts_unchanged_by_fast_path():
    x = np.linspace(-3, 3, 40, dtype=np.float32).reshape(8, 5)
    y = x.copy()
    y[3, 1] = np.nextafter(y[3, 1], np.float32(9))
    for tol in (EXACT, Ulp(0)):
        assert compare(one(x), one(x.copy()), tolerances=tol).ok
        res = compare(one(x), one(y), tolerances=tol)
        assert not res.ok and res.mismatches[0].count == 1
    assert compare(one(x), one(y), tolerances=Ulp(1)).ok


def test_count_true_and_zero_within():
    assert C._count_true(np.broadcast_to(False, (1000, 1000))) == 0
    assert C._count_true(np.broadcast_to(True, (10, 10))) == 100
    assert C._count_true(np.array([True, False, True])) == 2
    assert C._zero_is_within(np.broadcast_to(np.float64(0.0), (5,)), np.broadcast_to(False, (5,)))
    assert not C._zero_is_within(np.broadcast_to(np.float64(np.nan), (5,)), np.broadcast_to(False, (5,)))
    # a NaN bound on an element held exactly does not matter
    assert C._zero_is_within(np.array([1.0, np.nan]), np.array([False, True]))
    assert not C._zero_is_within(np.array([-1.0, 1.0]), np.array([False, False]))


def test_sum_bound_fast_path_keeps_a_nan_bound_failing():
    """A reference equal in bits to XLA's value but a NaN bound: sum_ok fails the element, and so must compare."""

    class NanBound(SumBound):
        def check_arrays(self, device_id, out_dtype):
            ref = np.asarray(self.exact[device_id])
            no = np.broadcast_to(False, ref.shape)
            return {"ref": ref.copy(), "bound": np.broadcast_to(np.float64(np.nan), ref.shape), "exact": no,
                    "pinf": no, "ninf": no, "nan": no, "signed_zero": np.zeros(ref.shape, bool)}

    x = np.array([1.0, 2.0], np.float32)
    tol = NanBound(n=1, exact={0: x}, abs_sum={0: np.float64(2.0)})
    assert not compare(one(x), one(x.copy()), tolerances=tol).ok
