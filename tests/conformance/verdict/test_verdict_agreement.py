"""Property: a reproducer's element check and conformance.compare give the same verdict, element by
element, on drawn data.

The reproducer side is run as a reproducer runs it: the element check is the text cut out of a
template (`conformance.cases.repro._MAIN`) and executed alone, and a sum's arrays are written the way
each template writes them (`conformance.cases.repro` as source text, `conformance.oracle.reproduce` as
an .npz) and read back. Dtypes: float16/32/64, bfloat16, float8_e4m3fn (no infinity),
complex64/128; data: special values (NaN, ±inf, ±0, subnormals, the largest finite) among
exact-friendly and random values, results near and at the edge of a sum's bound, and complex
results whose parts are drawn apart.
"""
import io

import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.cases import repro
from conformance.verdict import compare as cmp
from conformance.verdict import elements
from fake_arrays import Arr, Sh

DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16),
          np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(np.complex64), np.dtype(np.complex128))


def _reproducer_check() -> dict:
    start = repro._MAIN.index("# -- the element check:")
    ns = {"__name__": "reproducer"}
    exec(compile(repro._MAIN[start:repro._MAIN.index("\ndef check(", start)], "<reproducer>", "exec"), ns)
    return ns


REPRO = _reproducer_check()


def one_element_per_device(a: np.ndarray) -> Arr:
    """Device d holds element d, so compare's mismatches name the elements that differ."""
    return Arr(a.shape, a.dtype, [Sh(d, (slice(d, d + 1),), a[d:d + 1]) for d in range(a.shape[0])])


def compare_bad(want: np.ndarray, have: np.ndarray, policy) -> set:
    res = cmp.compare(one_element_per_device(want), one_element_per_device(have), tolerances=policy)
    assert all(m.kind in ("values", "ulp", "bound") for m in res.mismatches), res.report()
    return {m.device_id for m in res.mismatches if m.side == "xla"}


# -- drawing values ----------------------------------------------------------------------------------
def real_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(f"f{dt.itemsize // 2}") if dt.kind == "c" else dt


def specials(rd: np.dtype) -> list:
    fi = ml_dtypes.finfo(rd) if rd.kind == "V" else np.finfo(rd)
    sub = float(fi.smallest_subnormal)
    return [np.nan, np.inf, -np.inf, 0.0, -0.0, sub, -sub, 2 * sub, float(fi.tiny), float(fi.max), -float(fi.max),
            1.0, -1.0, 0.5, 3.0]


def cast(values, rd: np.dtype) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values, np.float64).astype(rd)


@st.composite
def components(draw, rd: np.dtype, size: int, mode: str | None = None) -> np.ndarray:
    """`size` values of the real dtype `rd`: exact-friendly (small integers), random, or special."""
    width = 64 if rd.itemsize == 8 else 32
    kinds = {"exact": st.integers(-8, 8).map(float),
             "random": st.floats(allow_nan=False, allow_infinity=False, width=width),
             "special": st.sampled_from(specials(rd))}
    one = kinds[mode] if mode else st.one_of(*kinds.values())
    return cast(draw(st.lists(one, min_size=size, max_size=size)), rd)


def bump(x: np.ndarray, steps: int) -> np.ndarray:
    """`x` moved `steps` representable values along its bit pattern (one ulp each, away from zero
    for positive steps)."""
    u = np.dtype(f"u{x.dtype.itemsize}")
    bits = x.view(u).copy()
    bits += u.type(steps % (1 << (8 * u.itemsize)))        # wraps around, as unsigned arithmetic does
    return bits.view(x.dtype)


def as_dtype(comps: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Real components laid out as `dt` (a complex value takes two: real, imaginary)."""
    return np.ascontiguousarray(comps, real_dtype(dt)).view(dt)


# -- exact and ulp rules -----------------------------------------------------------------------------
@settings(max_examples=300)
@given(data=st.data(), dt=st.sampled_from(DTYPES), k=st.integers(1, 6),
       policy=st.sampled_from([cmp.EXACT, cmp.Exact(signed_zero=False), cmp.Ulp(0), cmp.Ulp(1), cmp.Ulp(3)]))
def test_exact_and_ulp_checks_agree_with_compare(data, dt, k, policy):
    rd = real_dtype(dt)
    parts = 2 if dt.kind == "c" else 1
    want_c = data.draw(components(rd, k * parts))
    have_c = want_c.copy()
    for i in range(have_c.size):               # each part of a complex value changes on its own
        how = data.draw(st.sampled_from(["keep", "keep", "negate", "bump", "special", "random"]))
        if how == "negate":
            have_c[i] = -have_c[i]
        elif how == "bump":
            have_c[i] = bump(have_c[i:i + 1], data.draw(st.sampled_from([-3, -2, -1, 1, 2, 3])))[0]
        elif how in ("special", "random"):
            have_c[i] = data.draw(components(rd, 1, how))[0]
    want, have = as_dtype(want_c, dt), as_dtype(have_c, dt)
    rule = cmp.element_rule(policy, dt)
    if rule == "ulp":
        ok = REPRO["within_ulp"](have, want, policy.ulps)
    else:
        ok = REPRO["same"](have, want, rule == "exact")
    assert set(np.flatnonzero(~ok).tolist()) == compare_bad(want, have, policy)


# -- sums with bounds --------------------------------------------------------------------------------
def through_source(packed):
    return eval(repro._packed_source(packed), {"np": np, "nan_": float("nan"), "inf_": float("inf")})


def through_npz(packed):
    buf = io.BytesIO()
    np.savez_compressed(buf, **{f"sum0_dev0_{k}": v for k, v in packed.items()})
    data = np.load(io.BytesIO(buf.getvalue()), allow_pickle=False)
    return {f: data[f"sum0_dev0_{f}"] for f in REPRO["SUM_CHECK_FIELDS"]}


def ref_components(ref: np.ndarray) -> list:
    return [ref.real, ref.imag] if ref.dtype.kind == "c" else [ref]


@settings(max_examples=300)
@given(data=st.data(), dt=st.sampled_from(DTYPES), k=st.integers(1, 4), n=st.integers(1, 5), mean=st.booleans(),
       mode=st.sampled_from([None, "exact", "random", "special"]), store=st.sampled_from([through_source, through_npz]))
def test_sum_checks_agree_with_compare(data, dt, k, n, mean, mode, store):
    rd = real_dtype(dt)
    parts = 2 if dt.kind == "c" else 1
    terms = {d: as_dtype(data.draw(components(rd, n * parts, mode)), dt).reshape(n, 1) for d in range(k)}
    tol = cmp.SumBound.from_terms(terms, mean=mean)
    want_c, have_c = [], []
    for d in range(k):
        arrays = tol.check_arrays(d, dt)
        order = data.draw(st.permutations(range(n)))
        with np.errstate(over="ignore", invalid="ignore"):
            ordered = terms[d][order[0]].copy()
            for i in order[1:]:                # one order of additions, in the dtype's own arithmetic
                ordered = (ordered + terms[d][i]).astype(dt)
            if mean:
                ordered = (ordered / np.asarray(n, rd)).astype(dt)
        ordered_c = ordered.view(rd)
        for c, (r, o) in enumerate(zip(ref_components(arrays["ref"]), np.ravel(ordered_c))):
            r, b = r[0], arrays["bound"][0]
            with np.errstate(over="ignore", invalid="ignore"):
                rounded = np.asarray(r).astype(np.float64).astype(rd)
                edge = np.asarray(r + data.draw(st.sampled_from([-1, 1])) * b).astype(np.float64).astype(rd)
            how = data.draw(st.sampled_from(["ordered", "rounded", "bump", "edge", "special", "random"]))
            value = {"ordered": o, "rounded": rounded, "edge": edge}.get(how)
            if how == "bump":
                value = bump(np.atleast_1d(rounded), data.draw(st.sampled_from([-2, -1, 1, 2])))[0]
            elif how == "edge":
                value = bump(np.atleast_1d(edge), data.draw(st.sampled_from([-1, 0, 0, 1])))[0]
            elif how in ("special", "random"):
                value = data.draw(components(rd, 1, how))[0]
            have_c.append(value)
            want_c.append(rounded)
    want, have = as_dtype(cast(want_c, rd), dt), as_dtype(np.array(have_c, rd), dt)
    ok = [bool(REPRO["sum_ok_packed"](have[d:d + 1], store(elements.pack_sum_check(**tol.check_arrays(d, dt))))[0][0])
          for d in range(k)]
    assert {d for d in range(k) if not ok[d]} == compare_bad(want, have, tol)
