"""compare's fast paths (one bytes comparison per shard, every device of a sum policy checked
at once, SumBound.from_terms on all devices at once) against hand-computed verdicts and
reports: a difference in one bit of one replica on one device, a zero's sign, NaN payloads,
bfloat16, a sum inside and outside its bound, on either side, in any device order."""

import copy

import ml_dtypes
import numpy as np
import pytest

import refsim
from conformance.strategies.sharded import ErrorBound
from conformance.verdict.compare import EXACT, Exact, SumBound, Ulp, compare
from fake_arrays import Arr, Sh
from refsim import Mesh, NamedSharding, PartitionSpec as P, Shard

MESH = Mesh((2, 2), ("x", "y"))                     # device d at position (d // 2, d % 2)


def put(x, spec=P("x")):
    """A refsim Array of `x` on MESH: with P("x") devices 0, 1 hold rows 0:2 and 2, 3 rows 2:4."""
    return refsim.device_put(np.asarray(x), NamedSharding(MESH, spec))


def with_shard(arr, dev, data):
    """`arr` with device `dev`'s block replaced by `data` (the other blocks unchanged)."""
    shards = [Shard(s.device_id, s.index, np.asarray(data) if s.device_id == dev else s.data)
              for s in arr.shards]
    return refsim.Array(arr.shape, arr.dtype, arr.sharding, shards)


def flip_bit(a, loc, bit=0):
    """A copy of `a` with one bit of element `loc` flipped."""
    out = np.array(a, copy=True)
    v = out.view(f"u{out.dtype.itemsize}")
    v[loc] ^= np.array(1 << bit, v.dtype)
    return out


def test_one_bit_on_one_replica_of_one_device_fails_with_its_report():
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    want = put(x)
    block = np.asarray(want.shard(3).data)              # device 3: rows 2:4, a replica of device 2's
    got = with_shard(want, 3, flip_bit(block, (1, 2)))
    assert compare(want, put(x)).ok
    res = compare(want, got)
    assert not res.ok and len(res.mismatches) == 1
    m = res.mismatches[0]
    assert (m.output, m.kind, m.device_id, m.position, m.count, m.size) == (0, "values", 3, (1, 1), 1, 8)
    assert m.elements == (((1, 2), (3, 2), 14.0, 14.0 + 2.0 ** -20, None),)   # 0x41600000 -> 0x41600001
    assert m.classes == ("1-ulp",)
    assert m.render().splitlines()[0] == ("output 0, device 3 (mesh position (1, 1)), index [2:4, :]: "
                                          "values differ in 1 of 8 elements")


def test_each_differing_device_is_reported_in_device_order():
    x = np.arange(16, dtype=np.int32).reshape(4, 4)
    want = put(x, P("x", "y"))                          # four 2x2 blocks
    got = with_shard(with_shard(want, 2, np.asarray(want.shard(2).data) + 1), 0,
                     np.asarray(want.shard(0).data) * 0 + np.array([[0, 1], [4, 6]], np.int32))
    res = compare(want, got)
    assert [(m.device_id, m.count) for m in res.mismatches] == [(0, 1), (2, 4)]
    assert res.mismatches[0].elements[0][:4] == ((1, 1), (1, 1), 5, 6)


def test_a_wrong_index_and_wrong_values_keep_device_order():
    x = np.arange(8, dtype=np.int32)
    want = Arr((8,), np.dtype(np.int32), [Sh(d, (slice(2 * d, 2 * d + 2),), x[2 * d:2 * d + 2]) for d in range(4)])
    got = Arr((8,), np.dtype(np.int32), [
        Sh(0, (slice(0, 2),), np.array([0, 9], np.int32)),
        Sh(1, (slice(4, 6),), x[2:4]),                                  # a wrong index
        Sh(2, (slice(4, 6),), np.array([4, 7], np.int32)),
        Sh(3, (slice(6, 8),), x[6:8])])
    res = compare(want, got)
    assert [(m.kind, m.device_id) for m in res.mismatches] == [("values", 0), ("index", 1), ("values", 2)]
    assert res.mismatches[1].message == "index: refsim [2:4], xla [4:6]"
    assert res.devices == 3 and res.elements == 6


def test_zero_signs_and_nan_payloads():
    z = np.zeros((4, 2), np.float32)
    nz = z.copy()
    nz[3, 1] = -0.0
    res = compare(put(z), put(nz))
    assert [(m.device_id, m.classes) for m in res.mismatches] == [(2, ("signed-zero",)), (3, ("signed-zero",))]
    assert compare(put(z), put(nz), tolerances=Exact(signed_zero=False)).ok
    nan_a = np.full((4, 2), np.nan, np.float32)
    nan_b = nan_a.view(np.uint32).copy()
    nan_b[0, 0] |= 1                                    # another NaN payload: the same NaN to `same`
    assert compare(put(nan_a), put(nan_b.view(np.float32))).ok
    assert compare(put(nan_a), put(nan_b.view(np.float32)), tolerances=Ulp(0)).ok


def test_bfloat16_one_ulp():
    x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]], ml_dtypes.bfloat16)
    y = flip_bit(x, (0, 1))                             # 2.0 -> 2.015625 (one bfloat16 ulp)
    res = compare(put(x), put(y))
    assert [(m.device_id, m.count, m.classes) for m in res.mismatches] == [(0, 1, ("1-ulp",)), (1, 1, ("1-ulp",))]
    assert res.mismatches[0].elements[0][2:4] == (2.0, 2.015625)
    assert compare(put(x), put(y), tolerances=Ulp(1)).ok
    assert compare(put(x), put(x.copy())).ok


# -- sums ---------------------------------------------------------------------------------
ONE_UP = float(np.float32(1 + 2.0 ** -23))             # the float32 after 1.0


def sum_case(order=(0, 1, 2, 3)):
    """Four devices, each summing 1 + 2**-24 + 2**-24 (float32): exact 1 + 2**-23, which the
    additions round (q = -24, p = 24, sum|x| >= 2**0), so the bound (3 terms: about
    2*2**-24 * sum|x| = 2**-23 and a little) admits 1.0 and 1 + 2**-22 but not 1 + 3*2**-23."""
    t = np.array([[1.0], [2.0 ** -24], [2.0 ** -24]], np.float32)
    return SumBound.from_terms({d: t.copy() for d in order}, signed_zero=True)


def one_shard(dev, v):
    return Sh(dev, (slice(dev, dev + 1),), np.array([v], np.float32))


def arr(values):
    return Arr((4,), np.dtype(np.float32), [one_shard(d, v) for d, v in enumerate(values)])


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (3, 1, 0, 2)])
def test_sum_bound_inside_and_outside(order):
    tol = sum_case(order)
    refsim_out = arr([ONE_UP] * 4)
    assert compare(refsim_out, arr([ONE_UP, 1.0, 1.0 + 2.0 ** -22, ONE_UP]), tolerances=tol).ok
    res = compare(refsim_out, arr([ONE_UP, ONE_UP, 1.0 + 3 * 2.0 ** -23, ONE_UP]), tolerances=tol)
    assert [(m.kind, m.device_id, m.side, m.count) for m in res.mismatches] == [("bound", 2, "xla", 1)]
    (loc, glob, exact, got, bound), = res.mismatches[0].elements
    assert (loc, glob, exact, got) == ((0,), (2,), 1 + 2.0 ** -23, 1 + 3 * 2.0 ** -23)
    assert 2.0 ** -23 < bound < 2.0 ** -22
    assert res.applied == ("sum of n=3: exact in 0 of 4 element(s) (no order of additions rounds), gamma bound in 4",)


def test_sum_bound_checks_refsim_too_when_both_sides_agree():
    tol = sum_case()
    bad = [ONE_UP, ONE_UP, ONE_UP, 1.0 + 3 * 2.0 ** -23]
    res = compare(arr(bad), arr(bad), tolerances=tol)
    assert [(m.device_id, m.side) for m in res.mismatches] == [(3, "xla"), (3, "refsim")]


def test_sum_exact_elements_per_device_and_a_mutated_mapping():
    # device d sums d+1 twice: exact (integers), 2d + 2, each device its own value
    tol = SumBound.from_terms({d: np.full((2, 1), d + 1, np.float32) for d in (2, 0, 3, 1)}, signed_zero=True)
    want = arr([2.0, 4.0, 6.0, 8.0])
    res = compare(want, want, tolerances=tol)
    assert res.ok and res.applied[0].startswith("sum of n=2: exact in 4 of 4 element(s)")
    res = compare(want, arr([2.0, 4.0, 6.0, 8.000001]), tolerances=tol)
    assert [(m.device_id, m.elements[0][2]) for m in res.mismatches] == [(3, 8.0)]
    copied = copy.deepcopy(tol)
    copied.exact[2][0] = 7.0                            # in place, in a deep copy's own arrays
    res = compare(want, want, tolerances=copied)
    assert [(m.device_id, m.side, m.elements[0][2]) for m in res.mismatches] == [(2, "xla", 7.0), (2, "refsim", 7.0)]
    tol.exact[1] = np.array([5.0])                      # the mapping changed after from_terms
    res = compare(want, want, tolerances=tol)
    assert [(m.device_id, m.side, m.elements[0][2]) for m in res.mismatches] == [(1, "xla", 5.0), (1, "refsim", 5.0)]


def test_sum_zero_sign_is_checked_on_every_device():
    tol = SumBound.from_terms({d: np.array([[-0.0], [-0.0]], np.float32) for d in range(4)}, signed_zero=True)
    res = compare(arr([-0.0] * 4), arr([-0.0, -0.0, 0.0, -0.0]), tolerances=tol)
    assert [(m.device_id, m.classes) for m in res.mismatches] == [(2, ("signed-zero",))]


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (2, 0, 3, 1)])
def test_complex_sum_nan_in_one_part(order):
    # per device: (nan + 1j) + (2 + 3j): the real part is NaN, the imaginary part exactly 4;
    # device 0's terms are (1 + 1j) + (2 + 3j) instead, with no NaN allowed anywhere
    t = np.array([[complex(np.nan, 1)], [2 + 3j]], np.complex64)
    t0 = np.array([[1 + 1j], [2 + 3j]], np.complex64)
    tol = SumBound.from_terms({d: (t0 if d == 0 else t).copy() for d in order})
    good = np.array([complex(np.nan, 4)], np.complex64)
    good0 = np.array([3 + 4j], np.complex64)
    want = Arr((4,), np.dtype(np.complex64), [Sh(d, (slice(d, d + 1),), good0 if d == 0 else good) for d in range(4)])
    assert compare(want, want, tolerances=tol).ok
    bad = np.array([complex(np.nan, np.nan)], np.complex64)
    for dev in (0, 1):
        got = Arr((4,), np.dtype(np.complex64),
                  [Sh(d, (slice(d, d + 1),), bad if d == dev else good0 if d == 0 else good) for d in range(4)])
        res = compare(want, got, tolerances=tol)
        assert [(m.device_id, m.side, m.count) for m in res.mismatches] == [(dev, "xla", 1)]


def test_a_policy_with_its_own_arrays():
    # ErrorBound builds its arrays itself (refsim's value, a constant bound): stacked per device
    want = put(np.array([[1.0], [2.0], [3.0], [4.0]], np.float32))
    tol = ErrorBound.around(want, 0.5)
    assert compare(want, put(np.array([[1.25], [2.0], [3.0], [3.5]], np.float32)), tolerances=tol).ok
    res = compare(want, put(np.array([[1.0], [2.0], [3.75], [4.0]], np.float32)), tolerances=tol)
    assert [(m.device_id, m.side, m.elements[0][2:]) for m in res.mismatches] == [(2, "xla", (3.0, 3.75, 0.5)),
                                                                                 (3, "xla", (3.0, 3.75, 0.5))]


def test_from_terms_stacked_equals_hand_values():
    # two devices, three float32 terms each; hand-computed exact sums, |x| sums and masks
    t0 = np.array([[1.0, -0.0], [2.0, -0.0], [4.0, -0.0]], np.float32)
    t1 = np.array([[1.0, np.inf], [2.0 ** -30, 1.0], [-1.0, np.nan]], np.float32)
    tol = SumBound.from_terms({7: t0, 5: t1}, signed_zero=True)
    assert list(tol.exact) == [7, 5]
    e7, e5 = tol.exact[7], tol.exact[5]
    assert e7[0] == 7.0 and e7[1] == 0.0 and np.signbit(e7[1])          # -0 + -0 + -0 is -0
    assert e5[0] == 2.0 ** -30 and np.isnan(e5[1])
    assert tol.abs_sum[7].tolist() == [7.0, 0.0] and tol.abs_sum[5][0] == 2.0 + 2.0 ** -30
    assert tol.exact_mask[7].tolist() == [True, True]
    # element 0 of device 5: multiples of 2**-30 with sum|x| = 2 + 2**-30 >= 2**(-30 + 24): rounds;
    # element 1: the finite term 1.0 alone, exact (non-finite terms are judged by the IEEE masks)
    assert tol.exact_mask[5].tolist() == [False, True]
    assert tol.inf_terms[5].tolist() == [0, 1 | 4] and tol.inf_terms[7].tolist() == [0, 0]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.complex64, np.int32])
@pytest.mark.parametrize("shape", [(), (1,), (3,), (2, 1, 3)])
def test_from_terms_all_devices_at_once_equals_one_device_at_a_time(dtype, shape):
    # Terms whose float64 sums round (exponents 2**-40 .. 2**40), so a different order of the
    # additions would change bits; each device alone (one device: the loop) must give the same.
    rng = np.random.default_rng(len(shape) * 7 + np.dtype(dtype).itemsize)
    n, ndev = 6, 5
    with np.errstate(all="ignore"):
        x = rng.standard_normal((ndev, n) + shape) * np.exp2(rng.integers(-40, 40, (ndev, n) + shape))
        x[rng.random(x.shape) < 0.1] = np.inf
        x = (x + 1j * x[::-1] if np.dtype(dtype).kind == "c" else x).astype(dtype)
    for mean in (False, True):
        together = SumBound.from_terms({d: x[d] for d in range(ndev)}, mean=mean)
        for d in range(ndev):
            alone = SumBound.from_terms({d: x[d]}, mean=mean)
            for f in ("exact", "abs_sum", "exact_mask", "pos_sum", "neg_sum", "inf_terms"):
                a, b = np.asarray(getattr(together, f)[d]), np.asarray(getattr(alone, f)[d])
                assert a.dtype == b.dtype and a.shape == b.shape
                assert np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a.real), np.signbit(b.real)), f
