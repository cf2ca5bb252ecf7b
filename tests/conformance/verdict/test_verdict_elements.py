"""conformance.verdict: one element check (NumPy only) behind compare and both reproducer
templates; the old module paths; hand-computed cases of the complex sum check."""
import ast
import io
import pathlib

import numpy as np
import pytest

import conformance.verdict
from conformance.cases import repro
from conformance.oracle import reproduce
from conformance.verdict import ELEMENT_CHECK, elements
from conformance.verdict.compare import SumBound, compare
from fake_arrays import Arr, Sh

ROOT = pathlib.Path(__file__).resolve().parents[3]
NAN, INF = float("nan"), float("inf")


def one(values, dtype):
    a = np.asarray(values, dtype)
    return Arr(a.shape, a.dtype, [Sh(0, (slice(None),) * a.ndim, a)])


def embedded():
    """The element check as a reproducer has it: the text pasted into a template, executed alone."""
    start = repro._MAIN.index("# -- the element check:")
    text = repro._MAIN[start:repro._MAIN.index("\ndef check(", start)]
    ns = {"__name__": "reproducer"}
    exec(compile(text, "<reproducer>", "exec"), ns)
    return ns


def through_source(packed):
    """A packed sum check written as conformance.cases.repro writes BOUNDS, read back as a reproducer reads it."""
    return eval(repro._packed_source(packed), {"np": np, "nan_": NAN, "inf_": INF})


def through_npz(packed):
    """A packed sum check stored as conformance.oracle.reproduce stores it (.npz), read back."""
    buf = io.BytesIO()
    np.savez_compressed(buf, **{f"sum0_dev0_{k}": v for k, v in packed.items()})
    data = np.load(io.BytesIO(buf.getvalue()), allow_pickle=False)
    return {f: data[f"sum0_dev0_{f}"] for f in elements.SUM_CHECK_FIELDS}


# -- one source ------------------------------------------------------------------------------------
def test_both_templates_embed_the_element_module_source():
    body = "\n".join(pathlib.Path(elements.__file__).read_text().splitlines()[1:])
    assert "def sum_ok(" in ELEMENT_CHECK and body.split('"""\n', 1)[1].strip() in ELEMENT_CHECK
    assert ELEMENT_CHECK in repro._MAIN and ELEMENT_CHECK in reproduce._MAIN
    assert repro.ELEMENT_CHECK is conformance.verdict.ELEMENT_CHECK


def test_the_element_module_imports_numpy_and_the_standard_library_only():
    # the module, and the text pasted mid-file (so no `from __future__`, legal only at a file's top)
    for text in (pathlib.Path(elements.__file__).read_text(), ELEMENT_CHECK):
        tree = ast.parse(text)
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert names == ["numpy"], names


def test_old_module_paths_are_the_verdict_modules():
    import conformance.compare
    import conformance.platform_models
    import conformance.xfails
    from conformance.verdict import compare as c, platform_models as pm, xfails as xf

    assert conformance.compare is c and conformance.xfails is xf and conformance.platform_models is pm
    from conformance.compare import (EXACT, ComparisonResult, Exact, Mismatch, SumBound, Ulp,  # noqa: F401
                                     as_outputs, element_classes, gamma, ulp_distance, unit_roundoff)
    from conformance.platform_models import MODELS, check, flush_subnormals  # noqa: F401
    from conformance.xfails import (CLASSES, Entry, XfailList, comparison_failure, default_path,  # noqa: F401
                                    exception_failure, load, parse)
    # xfails/<platform>.txt is still found at the project root
    assert pathlib.Path(default_path("cpu")) == ROOT / "xfails" / "cpu.txt"
    assert load(None, platform="cpu").entries


# -- the complex psum of [1+2j, 3+4j] ----------------------------------------------------------------
@pytest.mark.parametrize("store", [through_source, through_npz], ids=["repro", "oracle.reproduce"])
def test_complex_psum_is_checked_part_by_part_in_reproducers_as_in_compare(store):
    """psum of 1+2j and 3+4j over 2 devices (complex64). By hand: exactly 4+6j (small integers,
    every partial sum representable), so 4+6j passes and 4+99j fails, in compare and in the
    reproducer. The old templates wrote the bound as float64 of the complex reference (4.0) and
    took have.astype(float64) (4.0), so their check passed 4+99j."""
    tol = SumBound.from_terms({0: np.array([[1 + 2j], [3 + 4j]], np.complex64)})
    ns = embedded()
    packed = store(ns["pack_sum_check"](**tol.check_arrays(0, np.complex64)))
    want = one([4 + 6j], np.complex64)
    for value, agree in ((4 + 6j, True), (4 + 99j, False), (complex(4, np.nextafter(np.float32(6), 7)), False),
                         (3 + 6j, False)):
        got = one([value], np.complex64)
        assert compare(want, got, tolerances=tol).ok is agree, value
        ok, ref, bound = ns["sum_ok_packed"](np.array([value], np.complex64), packed)
        assert bool(ok.all()) is agree, value
    assert ref[0] == 4 + 6j and bound[0] == 0


@pytest.mark.parametrize("mean, value, agree", [
    # psum adds the parts apart: nan+1j and 2+3j give nan+4j, and only the real part may be NaN
    (False, complex(NAN, 4), True), (False, complex(NAN, NAN), False), (False, complex(3, 4), False),
    # pmean divides by n as a complex number: nan*0 makes the imaginary part NaN too (XLA:CPU)
    (True, complex(NAN, NAN), True), (True, complex(NAN, 2), True), (True, complex(1, NAN), False),
])
def test_complex_nan_allowances_survive_the_reproducer(mean, value, agree):
    tol = SumBound.from_terms({0: np.array([[complex(NAN, 1)], [2 + 3j]], np.complex64)}, mean=mean)
    ns = embedded()
    assert compare(one([complex(NAN, 2 if mean else 4)], np.complex64), one([value], np.complex64),
                   tolerances=tol).ok is agree
    for store in (through_source, through_npz):
        packed = store(ns["pack_sum_check"](**tol.check_arrays(0, np.complex64)))
        assert bool(ns["sum_ok_packed"](np.array([value], np.complex64), packed)[0].all()) is agree


@pytest.mark.parametrize("terms, signed, want_negative", [
    # by hand, IEEE 754 round to nearest: -0 + -0 = -0; -0 + +0 = +0; 1 + -1 = +0
    ([-0.0, -0.0], True, True), ([-0.0, 0.0], True, False), ([1.0, -1.0], True, False),
    ([-0.0, -0.0], False, None),            # a reduce's zero sign (init values interspersed): open
])
@pytest.mark.parametrize("mean", [False, True])
def test_a_sums_zero_sign_counts_where_the_spec_defines_it(terms, signed, want_negative, mean):
    """StableHLO all_reduce: the schedule's leaves are the operands, so a sum (and pmean's
    quotient) is -0 exactly when every term is -0; compare and both reproducers agree."""
    tol = SumBound.from_terms({0: np.array([[t] for t in terms], np.float32)}, mean=mean, signed_zero=signed)
    ns = embedded()
    for value in (0.0, -0.0):
        agree = want_negative is None or bool(np.signbit(value)) == want_negative
        refsim_side = one([-0.0 if want_negative else 0.0], np.float32)   # both sides are held to the rule
        assert compare(refsim_side, one([value], np.float32), tolerances=tol).ok is agree, value
        for store in (through_source, through_npz):
            packed = store(ns["pack_sum_check"](**tol.check_arrays(0, np.float32)))
            assert bool(ns["sum_ok_packed"](np.array([value], np.float32), packed)[0].all()) is agree, value
    # a complex sum part by part: (-0-0j) + (-0+0j) = -0+0j
    ctol = SumBound.from_terms({0: np.array([[complex(-0.0, -0.0)], [complex(-0.0, 0.0)]], np.complex64)},
                               signed_zero=True)
    ref = ctol.check_arrays(0, np.complex64)["ref"]
    assert np.signbit(ref.real[0]) and not np.signbit(ref.imag[0])


def test_an_old_reproducers_sum_record_without_the_sign_mask_still_reads():
    tol = SumBound.from_terms({0: np.array([[-0.0], [-0.0]], np.float32)}, signed_zero=True)
    packed = {k: v for k, v in elements.pack_sum_check(**tol.check_arrays(0, np.float32)).items()
              if k != "signed_zero"}
    assert elements.sum_ok_packed(np.array([0.0], np.float32), packed)[0].all()   # sign unchecked


def test_a_float64_sum_reference_travels_in_full_precision():
    """compare sums float64 terms in long double; the reproducer keeps that reference bit for bit
    (also beyond float64's range), so it does not turn the bound's edge into a disagreement."""
    big = np.finfo(np.float64).max
    terms = np.array([[1.0, big], [2.0 ** -60, big]], np.float64)       # exact: 1 + 2**-60, 2*max
    tol = SumBound.from_terms({0: terms})
    arrays = tol.check_arrays(0, np.float64)
    for store in (through_source, through_npz):
        packed = store(elements.pack_sum_check(**arrays))
        back = elements.unpack(str(packed["ref_precision"]), packed["ref"])
        assert back.dtype == arrays["ref"].dtype
        np.testing.assert_array_equal(back, arrays["ref"])
        bound = elements.unpack(str(packed["bound_precision"]), packed["bound"])
        np.testing.assert_array_equal(bound, arrays["bound"])
    if np.finfo(np.longdouble).nmant > 52:                                # x86 / aarch64
        assert arrays["ref"][1] > big and np.isfinite(arrays["ref"][1])
        assert arrays["ref"][0] == np.longdouble(1) + np.longdouble(2.0) ** -60


@pytest.mark.parametrize("x", [
    np.array([0.0, -0.0, 1.5, -2.0 ** -1074, 2.0 ** -1022, NAN, INF, -INF, 1e308]),
    np.array([complex(-0.0, 0.0), complex(NAN, -INF), complex(1e-320, -0.0)]),
    np.array([3.25, -1e-40, 0.0], np.float32),
])
def test_pack_and_unpack_keep_every_bit(x):
    name, parts = elements.pack(x)
    assert parts.dtype == np.float64
    back = elements.unpack(name, parts)
    want = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
    assert back.dtype == want.dtype
    for p, q in ((back.real, want.real), (back.imag, want.imag)):
        np.testing.assert_array_equal(p, q)
        np.testing.assert_array_equal(np.signbit(p), np.signbit(q))


def test_close_holds_a_complex_number_part_by_part():
    """The corpus check (`suites.programs._close`) used np.allclose on astype(float64), which drops
    the imaginary part: 1+5j and 1+9j were close. By hand with rtol = atol = 0.1."""
    a = np.array([1 + 5j, 1 + 5j, complex(NAN, 1)], np.complex64)
    b = np.array([1 + 9j, 1.05 + 5j, complex(NAN, 1)], np.complex64)
    np.testing.assert_array_equal(elements.close(a, b, 0.1, 0.1), [False, True, True])
    np.testing.assert_array_equal(elements.close(a, b, 0.1, 0.1, equal_nan=False), [False, True, False])


def test_abs_diff_is_the_larger_part_difference():
    a = np.array([1 + 1j, 0j, 1 + 0j], np.complex64)
    b = np.array([4 + 5j, 0j, complex(1, NAN)], np.complex64)
    d = elements.abs_diff(a, b)
    assert d[0] == 4 and d[1] == 0 and np.isnan(d[2])


def test_combine_partials_folds_left_to_right_by_kind():
    from conformance.verdict.elements import combine_partials

    a = np.array([1.0, -2.0, 0.5], np.float32)
    b = np.array([3.0, 2.0, 0.25], np.float32)
    c = np.array([-1.0, 7.0, np.nan], np.float32)
    # by hand: the sums, maxima and minima of the three partial values, element by element
    assert combine_partials([a, b, c]).tolist()[:2] == [3.0, 7.0] and np.isnan(combine_partials([a, b, c])[2])
    assert combine_partials([a, b], "max").tolist() == [3.0, 2.0, 0.5]
    assert combine_partials([a, b], "min").tolist() == [1.0, -2.0, 0.25]
    assert combine_partials([a, b]).dtype == np.float32
    # in the parts' own dtype, left to right: (2**24 + 1) + 1 rounds twice in float32
    big = [np.float32(2 ** 24), np.float32(1), np.float32(1)]
    assert float(combine_partials(big)) == 2.0 ** 24
    assert combine_partials([np.int32([5]), np.int32([-7])]).tolist() == [-2]


def test_combine_partials_gives_ieee_signed_zeros_for_max_and_min():
    from conformance.verdict.elements import combine_partials

    neg, pos = np.float32([-0.0]), np.float32([0.0])
    assert not np.signbit(combine_partials([neg, pos], "max"))[0]       # max(-0, +0) = +0 in either order
    assert not np.signbit(combine_partials([pos, neg], "max"))[0]
    assert np.signbit(combine_partials([pos, neg], "min"))[0]           # min(+0, -0) = -0 in either order
    assert np.signbit(combine_partials([neg, pos], "min"))[0]
    assert np.signbit(combine_partials([neg, neg]))[0]                  # -0 + -0 = -0
    with pytest.raises(ValueError, match="kind='prod'"):
        combine_partials([pos], "prod")
