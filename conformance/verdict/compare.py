"""The comparison policy (docs/comparison.md): refsim's result against XLA's, output by output, device by device.

* Layout: both sides hold the same device ids, and each device the same index, shape and dtype.
* `Exact` (data movement, integers, bool, min/max): bit-exact, except that NaN equals NaN
  (payloads and the quiet bit are ignored); the sign of a zero counts (max/min too: StableHLO's
  maximum / minimum are IEEE 754-2019's, +0 > -0). With ``signed_zero=False`` (where the spec
  leaves the sign of a zero open: a sum from `reduce`, which intersperses +0 init values)
  +0 equals -0.
* `SumBound` (floating psum / pmean / psum_scatter), element by element:
  - *exact* where no order of the additions can round (every partial sum of the terms is
    representable: all terms are multiples of 2**q and sum|x_i| < 2**(q+p) for p significand
    bits) and, for a mean, the quotient is representable: then the result must be that value;
  - otherwise inside the rigorous recursive-summation bound
    ``|y - S| <= ((1+u)**(n-1) - 1) * sum|x_i|`` (<= gamma(n-1) * sum|x_i|, Higham, "Accuracy and
    Stability of Numerical Algorithms", Thm 4.3; it holds for any order and tree shape), with S
    computed in higher precision and that reference's own error added;
  - an infinity is accepted where some order of the additions can overflow to it (and NaN
    where both signs can, or where the dtype has no infinity); NaN/inf terms give the IEEE
    result, which no order changes; with ``signed_zero`` (psum / pmean / psum_scatter) the
    sign of an exact zero counts: StableHLO's all_reduce gives -0 only where every term is -0,
    as refsim does (XLA:CPU's +0 start is the platform model ``xla-cpu-arith``).
* `Ulp(k)` (transcendentals and other ops with a stated accuracy): at most k units in the
  last place of the output dtype apart; NaN positions and infinities must match.

Every mismatch says which policy applied to its elements and why (`Mismatch.policy`), and
classifies the differing elements (`Mismatch.classes`: "nan-dropped", "subnormal-flushed",
...), which is what an xfails signature (`conformance.verdict.xfails`) matches.

The element checks themselves live in `conformance.verdict.elements` (NumPy only), whose source
every reproducer embeds: this module decides which check applies (`element_rule`) and builds
its arrays (`SumBound.check_arrays`). `conformance.compare` is this module under its old name.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import ml_dtypes
import numpy as np

from conformance.verdict.elements import is_float as _is_float
from conformance.verdict.elements import same, sum_ok, ulp_distance, within_ulp
from refsim.values import complex_from_parts

__all__ = ["EXACT", "ComparisonResult", "Exact", "Mismatch", "SumBound", "Ulp", "as_outputs", "bits_equal",
           "compare", "element_classes", "element_rule", "gamma", "mismatch_lines", "ulp_distance", "unit_roundoff"]

_MAX_ELEMENTS = 5  # differing elements listed per mismatch


# -- policies -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Exact:
    """Bit-exact equality; NaN equals NaN; ±0 must match unless `signed_zero` is False."""

    signed_zero: bool = True

    def describe(self) -> str:
        return "exact" if self.signed_zero else "exact (+0 == -0)"

    def why(self) -> str:
        return ("exact: the result is representable, so any correct implementation gives these bits"
                + ("" if self.signed_zero else "; +0 == -0 because the spec leaves the sign of this zero open"))


EXACT = Exact()


@dataclasses.dataclass(frozen=True)
class Ulp:
    """At most `ulps` units in the last place apart (in the output dtype); NaN only matches NaN
    and an infinity only itself. `reason` says where the bound comes from (an op's documented
    accuracy, e.g. ``refsim.interpreter.accuracy``); integers and bools stay exact."""

    ulps: int = 1
    reason: str = ""

    def __post_init__(self):
        if not isinstance(self.ulps, int) or isinstance(self.ulps, bool) or self.ulps < 0:
            raise ValueError(f"Ulp(ulps={self.ulps!r}): pass a non-negative int (0 is bit-exact up to NaN payloads).")

    def describe(self) -> str:
        return f"within {self.ulps} ulp" + (f" ({self.reason})" if self.reason else "")

    def why(self) -> str:
        return f"ulp bound: {self.describe()}"


def _finfo(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        dtype = np.dtype(f"f{dtype.itemsize // 2}")
    if dtype.kind == "f" and dtype.type.__module__ == "numpy":
        return np.finfo(dtype)
    return ml_dtypes.finfo(dtype)  # bfloat16, float8_*: numpy's finfo does not know them


def _real_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    return np.dtype(f"f{dtype.itemsize // 2}") if dtype.kind == "c" else dtype


def unit_roundoff(dtype) -> float:
    """u = 2**-p for a floating dtype with p significand bits (float32: 2**-24; bfloat16: 2**-8)."""
    return float(_finfo(dtype).eps) / 2


def gamma(k: int, u: float) -> float:
    """Higham's gamma(k) = k*u / (1 - k*u); requires k*u < 1."""
    if k * u >= 1:
        raise ValueError(f"gamma(k={k}, u={u}) is undefined: k*u must be < 1 (too many summands for this dtype).")
    return k * u / (1 - k * u)


def _growth(k: int, u: float) -> float:
    """(1+u)**k - 1: the relative error of k roundings in a row; <= gamma(k) and defined for every k
    (float8 sums over many devices have k*u >= 1)."""
    return float(np.expm1(k * np.log1p(u)))


def _significand_bits(dtype) -> int:
    return int(_finfo(dtype).nmant) + 1


def _has_inf(dtype) -> bool:
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isinf(np.array(np.inf).astype(_real_dtype(dtype)).astype(np.float64)))


def _overflow_threshold(dtype) -> float:
    """The smallest magnitude that rounds to infinity (or NaN) in `dtype`: max + half an ulp of max."""
    fi = _finfo(dtype)
    big = float(fi.max)
    return big + 2.0 ** (int(np.floor(np.log2(big))) - _significand_bits(dtype))


def _reference_dtype(dtype) -> np.dtype:
    """The precision the exact sum is computed in: float64, or longdouble for 64-bit floats."""
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return np.dtype(np.clongdouble if dtype.itemsize >= 16 else np.complex128)
    return np.dtype(np.longdouble if dtype.itemsize >= 8 and dtype.kind == "f" else np.float64)


def _lowest_bit_exponent(x: np.ndarray) -> np.ndarray:
    """For finite float64 `x`, the exponent of its lowest set significand bit (x is a multiple
    of 2**that); +inf for zeros and non-finite values."""
    x = np.asarray(x, np.float64)
    ok = np.isfinite(x) & (x != 0)
    m, e = np.frexp(np.where(ok, x, 1.0))
    ints = np.abs(m * 2.0 ** 53).astype(np.int64)
    low = ints & -ints
    return np.where(ok, e - 53 + np.log2(low.astype(np.float64)), np.inf)


def _sum_is_exact(terms: np.ndarray, p: int, axis: int = 0) -> np.ndarray:
    """Per element of the (n, ...) real `terms`: no partial sum in any order rounds with p bits.

    Every term is a multiple of 2**q (q the lowest set bit over all terms), so every partial
    sum is; a multiple of 2**q below 2**(q+p) in magnitude has at most p significant bits.
    """
    t = np.asarray(terms, np.float64)
    q = _lowest_bit_exponent(t).min(axis=axis)
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.abs(np.where(np.isfinite(t), t, 0.0)).sum(axis=axis)
        return (total == 0) | (np.isfinite(q) & (total < np.exp2(np.minimum(q + p, 1e4))))


def _terms_record(t: np.ndarray, axis: int, integer: bool, ref: np.dtype, divisor: int, mean: bool,
                  dtype) -> tuple:
    """`SumBound.from_terms`' arrays (exact, abs_sum, exact_mask, pos_sum, neg_sum, inf_terms) of
    the terms `t`, summed along `axis` (0: one device's (n, ...) terms; 1: all devices' stacked)."""
    with np.errstate(invalid="ignore", over="ignore"):
        tr = t.astype(ref)
        total = _with_negative_zeros(tr, tr.sum(axis=axis), axis)
        exact = _divide_parts(total, divisor)
        if tr.dtype.kind == "c":
            # the modulus of the finite parts: a NaN / inf part is judged by the IEEE masks
            # below and must not make the other part's bound NaN / inf
            re, im = (np.where(np.isfinite(c), c, 0) for c in (tr.real, tr.imag))
            abs_sum = np.hypot(re, im).sum(axis=axis)
        else:
            abs_sum = np.abs(tr).sum(axis=axis)
        parts = (tr.real, tr.imag) if tr.dtype.kind == "c" else (tr,)
        if integer:
            mask = np.ones(exact.shape, bool)
        elif ref.itemsize > 8 and ref.kind == "f" or ref.kind == "c" and ref.itemsize > 16:
            mask = np.zeros(exact.shape, bool)   # 64-bit inputs: no wider exact reference
        else:
            p = _significand_bits(dtype)
            mask = np.logical_and.reduce([_sum_is_exact(c, p, axis) for c in parts])
        if mean and divisor > 1:
            # the quotient itself must be exact for the mean to have no rounding at all
            mask &= ~np.isfinite(total) | (exact * ref.type(divisor) == total)
        # A complex sum adds its parts separately: each part keeps its own overflow and
        # non-finite record (a leading axis of 2), so a NaN in one part allows no NaN in the other.
        fin = [np.where(np.isfinite(c), c, 0) for c in parts]
        per_part = lambda xs: np.stack(xs) if len(xs) > 1 else xs[0]  # noqa: E731
        pos = per_part([np.where(c > 0, c, 0).sum(axis=axis) for c in fin])
        neg = per_part([np.where(c < 0, -c, 0).sum(axis=axis) for c in fin])
        infs = per_part([(np.isposinf(c).any(axis=axis) * 1 | np.isneginf(c).any(axis=axis) * 2
                          | np.isnan(c).any(axis=axis) * 4).astype(np.int8) for c in parts])
    return exact, abs_sum, mask, pos, neg, infs


@dataclasses.dataclass(frozen=True)
class SumBound:
    """The policy for a floating sum, or (``mean=True``) a mean ``fl(sum / divisor)``, of n terms.

    `exact[d]` is device d's exact sum of its n terms (higher precision), `abs_sum[d]` the sum
    of their magnitudes; `integer_terms` marks sums of integers (exact; only pmean's final
    division rounds). `exact_mask[d]` marks the elements no order of additions can round;
    `pos_sum[d]` / `neg_sum[d]` (the finite positive terms and the magnitudes of the negative
    ones) and `inf_terms[d]` (bit 1: a +inf term, 2: a -inf term, 4: a NaN term) say which
    overflows and non-finite results are possible. With `signed_zero` the sign of an exact zero
    result counts: StableHLO's all_reduce / reduce_scatter schedules have the operands as their
    only leaves, and in IEEE 754 (round to nearest) a sum is -0 exactly when every term is -0
    (`exact` holds that -0), so a psum / pmean / psum_scatter defines it; a reduce's interspersed
    init values do not. Build it with `SumBound.from_terms`.
    """

    #: Not a field. compare checks every device of an output at once (their arrays stacked)
    #: when a subclass's own class body sets this to True: its overrides of check_arrays,
    #: reference_and_bound, exact_elements and allowed_nonfinite build each element from the
    #: same element of `exact`, `abs_sum`, ... (and scalars) only, and reference_and_bound's
    #: reference is a new array (never an output's own shard). SumBound's own methods do.
    elementwise_arrays: ClassVar[bool] = True

    n: int
    exact: Mapping[int, np.ndarray]
    abs_sum: Mapping[int, np.ndarray]
    divisor: int = 1
    integer_terms: bool = False
    reference_u: float = 2.0 ** -53
    mean: bool = False
    exact_mask: Mapping[int, np.ndarray] | None = None
    pos_sum: Mapping[int, np.ndarray] | None = None
    neg_sum: Mapping[int, np.ndarray] | None = None
    inf_terms: Mapping[int, np.ndarray] | None = None
    signed_zero: bool = False

    def describe(self) -> str:
        what = "mean" if self.mean else "sum"
        return f"{what} of n={self.n}: exact where no order rounds, else within gamma(n-1)*sum|x|"

    def why(self, exact: bool) -> str:
        what = "mean" if self.mean else "sum"
        if exact:
            return (f"exact {what}: every partial sum of these n={self.n} terms is representable"
                    + (" and so is the quotient" if self.mean else "") + ", so no order of additions rounds")
        return (f"{what} bound: these n={self.n} terms round when summed, so the result must lie within "
                f"((1+u)^(n-1) - 1) * sum|x| of the exact {what}")

    @classmethod
    def from_terms(cls, terms: Mapping[int, np.ndarray], *, mean: bool = False,
                   signed_zero: bool = False) -> "SumBound":
        """`terms[d]` has shape (n, *shard_shape): the n values device d's output sums (or
        averages, with `mean`), per element; `signed_zero`: the sum's zero sign counts."""
        terms = {int(d): np.asarray(t) for d, t in terms.items()}
        if not terms:
            raise ValueError("terms is empty; pass one (n, ...) array per device.")
        ns = {t.shape[0] for t in terms.values()}
        if len(ns) != 1:
            raise ValueError(f"every device must sum the same number of terms, got {sorted(ns)}.")
        sample = next(iter(terms.values()))
        integer = sample.dtype.kind in "iub"
        ref = _reference_dtype(np.float64 if integer else sample.dtype)
        divisor = sample.shape[0] if mean else 1
        fields = ("exact", "abs_sum", "exact_mask", "pos_sum", "neg_sum", "inf_terms")
        rec = {f: {} for f in fields}
        devs = list(terms)
        ts = list(terms.values())
        stacked = None
        if len(ts) > 1 and all(t.shape == sample.shape and t.dtype == sample.dtype and t.flags.c_contiguous
                               for t in ts):
            # Every device at once, the devices stacked on a leading axis: the same operations
            # along axis 1 on C-contiguous blocks, element for element and in the same order of
            # additions as one device's along axis 0 (the loop below), so the same bits.
            stacked = _terms_record(np.stack(ts), 1, integer, ref, divisor, mean, sample.dtype)
            for f, x in zip(fields, stacked):
                # a complex sum's per-part records (pos, neg, inf) lead with the part axis
                per_part = sample.dtype.kind == "c" and f in ("pos_sum", "neg_sum", "inf_terms")
                for i, d in enumerate(devs):
                    rec[f][d] = x[:, i] if per_part else x[i]
        else:
            for d, t in terms.items():
                for f, x in zip(fields, _terms_record(t, 0, integer, ref, divisor, mean, sample.dtype)):
                    rec[f][d] = x
        out = cls(n=ns.pop(), divisor=int(divisor), integer_terms=integer, reference_u=unit_roundoff(ref), mean=mean,
                  signed_zero=signed_zero, **rec)
        if stacked is not None:
            # compare's stacked check (`_stacked_policy_arrays`) reads these instead of stacking
            # the mappings again, while every entry is still the view stored here.
            object.__setattr__(out, "_stacked_record", (tuple(devs), dict(zip(fields, stacked)),
                                                        {f: [rec[f][d] for d in devs] for f in fields}))
        return out

    def exact_elements(self, device_id: int, out_dtype) -> np.ndarray:
        """The elements of device `device_id`'s output that must equal the exact value bit for bit."""
        ex = np.asarray(self.exact[device_id])
        if self.exact_mask is None:
            return np.zeros(ex.shape, bool)
        m = np.asarray(self.exact_mask[device_id]).copy()
        with np.errstate(invalid="ignore", over="ignore"):
            finite = np.isfinite(ex)
            rt = _roundtrip(ex, out_dtype)
            m &= ~finite | (rt == ex) | (np.isnan(rt) & np.isnan(ex))  # the (mean's) exact value is representable
        return m

    def reference_and_bound(self, device_id: int, out_dtype) -> tuple[np.ndarray, np.ndarray]:
        """(exact value, allowed |result - exact|) for one device's output of dtype `out_dtype`;
        the bound is 0 on `exact_elements`."""
        out_dtype = np.dtype(out_dtype)
        u = unit_roundoff(out_dtype)
        ur = self.reference_u
        k = max(self.n - 1, 0)
        ex = np.asarray(self.exact[device_id])
        a = np.asarray(self.abs_sum[device_id])
        g = 0.0 if self.integer_terms else _growth(k, u)
        gr = 0.0 if self.integer_terms else gamma(k, ur)
        # Each of the n-1 additions may also underflow by half the smallest subnormal.
        tiny = float(_finfo(out_dtype).smallest_subnormal) * self.n
        with np.errstate(invalid="ignore", over="ignore"):
            err_sum = (g + gr) * a + tiny
            if not self.mean:
                bound = err_sum
            else:
                # fl(s/n) = (s/n)(1+d), |d| <= u: the sum's error shrinks by n, the division (or, for
                # integer inputs, the conversion to float, even when n == 1) adds u*|s|/n.
                bound = (err_sum * (1 + u) + (u + ur) * (np.abs(ex) * self.divisor + err_sum)) / self.divisor
            bound = np.asarray(bound * (1 + 2.0 ** -40))  # margin for rounding in the bound itself
        exact = self.exact_elements(device_id, out_dtype)
        return ex, np.where(exact, 0.0, bound)

    def check_arrays(self, device_id: int, out_dtype) -> dict:
        """The arrays `conformance.verdict.elements.sum_ok` holds device `device_id`'s output of
        dtype `out_dtype` to: ref, bound (`reference_and_bound`), exact (`exact_elements`), pinf,
        ninf, nan (`allowed_nonfinite`). compare and the reproducers check the same arrays."""
        ref, bound = self.reference_and_bound(device_id, out_dtype)
        pinf, ninf, nan = self.allowed_nonfinite(device_id, out_dtype)
        exact = self.exact_elements(device_id, out_dtype)
        return {"ref": ref, "bound": bound, "exact": exact, "pinf": pinf, "ninf": ninf, "nan": nan,
                "signed_zero": exact if self.signed_zero else np.zeros(exact.shape, bool)}

    def allowed_nonfinite(self, device_id: int, out_dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(+inf allowed, -inf allowed, NaN allowed) per element: what IEEE arithmetic gives from
        non-finite terms, and what some order of additions can overflow to. For a complex sum each
        mask has a leading axis of 2: the real part's, then the imaginary part's."""
        ex = np.asarray(self.exact[device_id])
        if ex.dtype.kind == "c":
            masks = [self._allowed_nonfinite_part(device_id, out_dtype, part) for part in (0, 1)]
            pinf, ninf, nan = (np.stack(m) for m in zip(*masks))
            if self.mean:
                # pmean divides the complex sum by n as a complex number ((a+bi)/(n+0i) with
                # inf*0 and nan*0 terms): a non-finite part makes the other part NaN. jax 0.10.2 /
                # 0.12 on XLA:CPU: pmean of (nan+1j, 2+3j) is nan+nanj, psum nan+4j.
                nan = nan | (pinf | ninf | nan)[::-1]
            return pinf, ninf, nan
        return self._allowed_nonfinite_part(device_id, out_dtype, None)

    def _allowed_nonfinite_part(self, device_id: int, out_dtype, part):
        """`allowed_nonfinite` of a real sum, or of one part (0 real, 1 imaginary) of a complex one."""
        pick = (lambda a: np.asarray(a)) if part is None else (lambda a: np.asarray(a)[part])  # noqa: E731
        if self.pos_sum is None:
            x = np.asarray(self.exact[device_id])
            x = x if part is None else (x.real, x.imag)[part]
            return np.isposinf(x), np.isneginf(x), np.isnan(x)
        u = unit_roundoff(out_dtype)
        grow = 1 + _growth(max(self.n - 1, 0), u)
        thr = _overflow_threshold(out_dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            pos, neg = pick(self.pos_sum[device_id]), pick(self.neg_sum[device_id])
            over_p = pos * grow / max(self.divisor, 1) >= thr
            over_n = neg * grow / max(self.divisor, 1) >= thr
            if not self.mean:
                over_p = pos * grow >= thr
                over_n = neg * grow >= thr
            else:
                # psum overflows before the division when the sum itself passes the threshold
                over_p = over_p | (pos * grow >= thr)
                over_n = over_n | (neg * grow >= thr)
        f = pick(self.inf_terms[device_id])
        pinf_t, ninf_t, nan_t = (f & 1) > 0, (f & 2) > 0, (f & 4) > 0
        nan = nan_t | (pinf_t & ninf_t) | (pinf_t & over_n) | (ninf_t & over_p) | (over_p & over_n)
        pinf = ~nan_t & ~ninf_t & (pinf_t | over_p)
        ninf = ~nan_t & ~pinf_t & (ninf_t | over_n)
        if not _has_inf(out_dtype):
            nan, pinf, ninf = nan | pinf | ninf, np.zeros_like(pinf), np.zeros_like(ninf)
        return pinf, ninf, nan


def _roundtrip(x: np.ndarray, dtype) -> np.ndarray:
    """`x` rounded to `dtype` and back to x's own dtype (via float64 / complex128)."""
    x = np.asarray(x)
    dtype = np.dtype(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        if x.dtype.kind == "c" and dtype.kind != "c":
            return complex_from_parts(_roundtrip(x.real, dtype), _roundtrip(x.imag, dtype), x.dtype)
        wide = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
        return wide.astype(dtype).astype(wide.dtype).astype(x.dtype)


def element_classes(expected: np.ndarray, actual: np.ndarray, bad: np.ndarray, dtype) -> tuple:
    """How the `bad` elements of `actual` differ from `expected` (values, or exact sums in
    higher precision), as the sorted set of: "nan-dropped" (expected NaN, got a number),
    "nan-introduced", "inf" (an infinity on one side only), "subnormal-flushed" (expected a
    nonzero subnormal of `dtype`, got zero), "signed-zero", "1-ulp" (one ulp apart), "value"."""
    if not bad.any():
        return ()
    if np.asarray(actual).dtype.kind in "TUSO":   # strings: no numeric classes
        return ("value",)
    e = np.asarray(expected)[bad]
    a = np.asarray(actual)[bad]
    if e.dtype.kind == "c" or a.dtype.kind == "c":
        e, a = np.concatenate([np.real(e), np.imag(e)]), np.concatenate([np.real(a), np.imag(a)])
    with np.errstate(invalid="ignore", over="ignore"):
        e = e.astype(np.float64)
        a = a.astype(np.float64)
    out = set()
    en, an = np.isnan(e), np.isnan(a)
    out.update(["nan-dropped"] * bool((en & ~an).any()) + ["nan-introduced"] * bool((an & ~en).any()))
    rest = ~en & ~an
    inf = rest & (np.isinf(e) != np.isinf(a))
    if inf.any():
        out.add("inf")
    rest &= ~inf & ~(np.isinf(e) & np.isinf(a) & (e == a))
    rest &= ~((e == a) & (np.signbit(e) == np.signbit(a)))      # equal elements of a mixed row
    tiny = float(_finfo(dtype).tiny) if _is_float(dtype) else 0.0
    flushed = rest & (a == 0) & (e != 0) & (np.abs(e) < tiny)
    if flushed.any():
        out.add("subnormal-flushed")
    zero = rest & (a == 0) & (e == 0)
    if zero.any():
        out.add("signed-zero")
    other = rest & ~flushed & ~zero
    if other.any() and _is_float(dtype):
        rd = _real_dtype(dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            d = ulp_distance(e[other].astype(rd), a[other].astype(rd))
        out.update(["1-ulp"] * bool((d <= 1).any()) + ["value"] * bool((d > 1).any()))
    elif other.any():
        out.add("value")
    return tuple(sorted(out))


# -- results --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One disagreement: which output, device and check, and the first differing elements.

    kind is one of "outputs", "shape", "dtype", "memory kind", "devices", "index", "shard shape",
    "shard dtype", "values", "bound", "ulp". `elements` lists (local index, global index,
    refsim value, `side`'s value, None) or, for "bound", (..., exact value, `side`'s value,
    allowed error); `count` of `size` elements differ. `policy` says which rule those elements
    were held to and why; `classes` how they differ (`element_classes`).
    """

    output: int
    kind: str
    message: str
    device_id: int | None = None
    position: tuple | None = None
    index: tuple | None = None
    elements: tuple = ()
    count: int = 0
    size: int = 0
    side: str = "xla"
    policy: str = ""
    classes: tuple = ()

    def render(self) -> str:
        where = f"output {self.output}"
        if self.device_id is not None:
            where += f", device {self.device_id}"
            if self.position is not None:
                where += f" (mesh position {self.position})"
        if self.index is not None:
            where += f", index {_fmt_index(self.index)}"
        lines = [f"{where}: {self.message}"]
        if self.policy:
            lines.append(f"    policy: {self.policy}")
        if self.classes:
            lines.append(f"    differences: {', '.join(self.classes)}")
        for loc, glob, exp, act, tol in self.elements:
            extra = "" if tol is None else f", |diff| {abs(_to_float(act) - _to_float(exp))!r} > bound {tol!r}"
            ref = "exact" if tol is not None else "refsim"
            lines.append(f"    element {loc} (global {glob}): {ref} {exp!r}, {self.side} {act!r}{extra}")
        if self.count > len(self.elements):
            lines.append(f"    ... {self.count - len(self.elements)} more of {self.size} elements differ")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class ComparisonResult:
    """The outcome of `compare`: `ok`, the mismatches, what was checked, and a text report."""

    mismatches: tuple
    outputs: int
    devices: int
    elements: int
    policies: tuple = ()
    case: Any = None
    applied: tuple = ()

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def classes(self) -> tuple:
        """Every element class of the value mismatches (see `element_classes`)."""
        return tuple(sorted({c for m in self.mismatches for c in m.classes}))

    def __bool__(self) -> bool:
        return self.ok

    def report(self, max_mismatches: int = 8) -> str:
        """A readable block: the case (program, mesh, device order, specs, dtype), then each mismatch."""
        head = "MATCH" if self.ok else f"MISMATCH ({len(self.mismatches)} found)"
        cid = getattr(self.case, "case_id", None)
        lines = [f"{head}: {cid}" if cid else head]
        if self.case is not None and hasattr(self.case, "describe"):
            lines += ["  " + ln for ln in self.case.describe().splitlines()]
        pol = "; ".join(self.applied) if self.applied else ", ".join(p.describe() for p in self.policies)
        lines.append(f"  checked {self.outputs} output(s), {self.devices} device shard(s), "
                     f"{self.elements} element(s); policy: {pol or 'exact'}")
        lines += mismatch_lines(self.mismatches, max_mismatches)
        return "\n".join(lines)

    __str__ = report

    def raise_if_mismatch(self) -> None:
        if not self.ok:
            raise AssertionError(self.report())


# -- the comparator --------------------------------------------------------------------------
def mismatch_lines(mismatches, most: int) -> list[str]:
    """The report lines of the first `most` mismatches (indented two spaces), then how many more."""
    lines = ["  " + ln for m in mismatches[:most] for ln in m.render().splitlines()]
    if len(mismatches) > most:
        lines.append(f"  ... {len(mismatches) - most} more mismatches")
    return lines


def as_outputs(x) -> list:
    """A result as a list of Arrays (an Array, or a tuple/list/pytree-leaf list of them)."""
    if hasattr(x, "shards"):
        return [x]
    if isinstance(x, (list, tuple)):
        out = []
        for item in x:
            out.extend(as_outputs(item))
        return out
    if isinstance(x, dict):
        return [a for k in sorted(x) for a in as_outputs(x[k])]
    raise TypeError(f"expected a refsim.Array (anything with .shards) or a sequence of them, got {type(x).__name__}.")


def compare(expected, actual, *, tolerances=None, case=None, ulp: int | None = None) -> ComparisonResult:
    """Compare refsim's result (`expected`) with XLA's (`actual`) by the policy of docs/comparison.md.

    tolerances: one policy (`Exact`, `SumBound`, `Ulp`) for every output, or one per output; by
    default ``case.tolerances()`` when a case is given, else `EXACT`. ulp: shorthand for
    ``tolerances=Ulp(ulp)`` on every output (floating outputs; integers stay exact).
    The result's `applied` says, per output, which policy held how many elements and why.
    With a `case` (whose program states its outputs' placement), each output's memory kind is
    compared too (``pinned_host`` / ``device``; None counts as ``device``): placement, as values,
    is part of what a program computes. Without one (the oracle's own programs) it is not, since
    refsim does not model the memory kind XLA gives an output no out_sharding states.
    """
    exp, act = as_outputs(expected), as_outputs(actual)
    if ulp is not None:
        if tolerances is not None:
            raise ValueError("pass either tolerances= or ulp=, not both; ulp=k means tolerances=Ulp(k).")
        tolerances = Ulp(ulp)
    if tolerances is None:
        tolerances = case.tolerances() if case is not None else [EXACT] * len(exp)
    elif isinstance(tolerances, (Exact, SumBound, Ulp)):
        tolerances = [tolerances] * len(exp)
    tolerances = list(tolerances)
    if len(tolerances) != len(exp):
        raise ValueError(f"got {len(tolerances)} tolerances for {len(exp)} outputs; give one per output.")
    found: list[Mismatch] = []
    applied: list[str] = []
    ndev = nel = 0
    if len(exp) != len(act):
        found.append(Mismatch(-1, "outputs", f"refsim returned {len(exp)} outputs, xla {len(act)}"))
    for k, (e, a, tol) in enumerate(zip(exp, act, tolerances)):
        if case is not None:
            _compare_memory_kind(k, e, a, found)
        d, n, note = _compare_output(k, e, a, tol, found)
        ndev += d
        nel += n
        applied.append(note)
    return ComparisonResult(tuple(found), outputs=min(len(exp), len(act)), devices=ndev, elements=nel,
                            policies=tuple(tolerances), case=case, applied=tuple(applied))


def element_rule(tol, dtype) -> str:
    """Which element check policy `tol` puts an output of `dtype` to, by the name a reproducer
    writes in its POLICIES: "sum_bound" (`SumBound` and its subclasses, on a floating dtype:
    `elements.sum_ok` with `SumBound.check_arrays`), "ulp" (`Ulp` on a floating dtype:
    `elements.within_ulp`), "exact_unsigned_zero" (``Exact(signed_zero=False)``) or "exact"
    (everything else: `elements.same`, a zero's sign counting)."""
    floating = _is_float(dtype)
    if isinstance(tol, SumBound) and (floating or getattr(tol, "holds_integers", False)):
        return "sum_bound"   # an integer output under the allowed set: its undecided elements are free
    if isinstance(tol, Ulp) and floating:
        return "ulp"
    return "exact_unsigned_zero" if isinstance(tol, Exact) and not tol.signed_zero else "exact"


_BITS_BLOCK = 1 << 22  # bytes per block of bits_equal: a small reused temporary, an early exit


def _bit_view(x: np.ndarray):
    """`x` read as unsigned integers of its itemsize (no copy: a view with the same strides),
    or None for a dtype whose bytes are not its value (long double's padding, structured)."""
    if x.dtype.fields is not None or x.dtype.itemsize not in (1, 2, 4, 8) or x.dtype.kind in "OUSM":
        return None
    if x.dtype.kind == "f" and x.dtype.itemsize > np.dtype(np.float64).itemsize:
        return None
    try:
        return x.view(f"u{x.dtype.itemsize}")
    except (TypeError, ValueError):
        return None


def bits_equal(a, b) -> bool:
    """True when `a` and `b` have the same shape and dtype and every element the same bits
    (NaN payloads and the signs of zeros included); False when they differ anywhere or their
    dtype has no bit view (long double, structured). Equal bits satisfy every element check
    (`same`, `within_ulp`, a bound of at least 0 around the reference), so compare reads both
    sides once this way and runs the element analysis only where they differ. In blocks of
    leading-axis rows: no full-size temporary, and a difference ends the scan."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "c":
        if a.dtype.itemsize > 16:
            return False
        return bits_equal(a.real, b.real) and bits_equal(a.imag, b.imag)
    x, y = _bit_view(a), _bit_view(b)
    if x is None or y is None:
        return False
    if x.ndim == 0 or x.shape[0] < 2 or x.nbytes <= _BITS_BLOCK:
        return bool(np.array_equal(x, y))
    step = max(1, _BITS_BLOCK // max(1, x.nbytes // x.shape[0]))
    return all(np.array_equal(x[i:i + step], y[i:i + step]) for i in range(0, x.shape[0], step))


def _count_true(mask) -> int:
    """The number of True elements of a mask; a broadcast scalar (all strides 0) without a pass."""
    m = np.asarray(mask)
    if m.size and all(st == 0 for st in m.strides):
        return int(m.size) if bool(m.flat[0]) else 0
    return int(m.sum())


def _zero_is_within(bound, exact) -> bool:
    """True when a difference of 0 passes `sum_ok`'s bound test on every element not held
    exactly: every such bound is at least 0 (not NaN). A broadcast scalar bound costs nothing."""
    b = np.asarray(bound)
    if b.size == 0:
        return True
    if all(st == 0 for st in b.strides):
        return bool(b.flat[0] >= 0)
    with np.errstate(invalid="ignore"):
        return bool(np.all((b >= 0) | np.asarray(exact, bool)))


def memory_kind_of(array) -> str:
    """An output's memory kind as its sharding states it (``device`` where it states none)."""
    return getattr(getattr(array, "sharding", None), "memory_kind", None) or "device"


def _compare_memory_kind(k: int, e, a, found: list) -> None:
    ke, ka = memory_kind_of(e), memory_kind_of(a)
    if ke != ka:
        found.append(Mismatch(k, "memory kind", f"memory kind: refsim {ke}, xla {ka}"))


def _compare_output(k: int, e, a, tol, found: list) -> tuple[int, int, str]:
    shape_e, shape_a = tuple(e.shape), tuple(a.shape)
    if shape_e != shape_a:
        found.append(Mismatch(k, "shape", f"global shape: refsim {shape_e}, xla {shape_a}"))
        return 0, 0, tol.describe()
    if np.dtype(e.dtype) != np.dtype(a.dtype):
        found.append(Mismatch(k, "dtype", f"dtype: refsim {np.dtype(e.dtype)}, xla {np.dtype(a.dtype)}"))
        return 0, 0, tol.describe()
    se = {int(s.device_id): s for s in e.shards}
    sa = {int(s.device_id): s for s in a.shards}
    if se.keys() != sa.keys():
        missing, extra = sorted(set(se) - set(sa)), sorted(set(sa) - set(se))
        found.append(Mismatch(k, "devices", f"device ids differ: refsim {sorted(se)}, xla {sorted(sa)} "
                                            f"(missing on xla: {missing}, extra on xla: {extra})"))
    mesh = getattr(getattr(a, "sharding", None), "mesh", None)
    floating = _is_float(e.dtype)
    rule = element_rule(tol, e.dtype)
    # The layout of every device first (index, shard shape and dtype): the common case is that
    # all of them agree, and then the values are checked with the vectorised / bytes fast paths
    # below. Any layout mismatch takes the device-by-device loop, which reports in device order.
    pairs = []
    for dev in sorted(se.keys() & sa.keys()):
        x, y = se[dev], sa[dev]
        dx, dy = x.data, y.data
        if type(dx) is not np.ndarray:
            dx = np.asarray(dx)
        if type(dy) is not np.ndarray:
            dy = np.asarray(dy)
        if not (_same_index(x.index, y.index, shape_e) and dx.shape == dy.shape and dx.dtype == dy.dtype):
            pairs = None
            break
        pairs.append((dev, x.index, dx, dy))
    if pairs is None:
        ndev, nel, n_exact = _compare_by_device(k, se, sa, shape_e, mesh, tol, rule, found)
    else:
        ndev, nel, n_exact = len(pairs), sum(p[2].size for p in pairs), 0
        if rule == "sum_bound":
            n = _check_sum_stacked(tol, pairs)
            if n is None:   # some element outside the bound (or a layout the stack cannot hold)
                for dev, index, dx, dy in pairs:
                    n_exact += _check_sum(k, tol, dev, _Pos(mesh, dev), index, dx, dy, found)
            else:
                n_exact = n
        else:
            for dev, index, dx, dy in pairs:
                if not _same_bits(dx, dy):
                    _check_values(k, tol, rule, dev, _Pos(mesh, dev), index, dx, dy, found)
    if isinstance(tol, SumBound) and floating:
        return ndev, nel, (f"{'mean' if tol.mean else 'sum'} of n={tol.n}: exact in {n_exact} of {nel} element(s) "
                           f"(no order of additions rounds), gamma bound in {nel - n_exact}")
    if not floating and not isinstance(tol, Exact) and rule != "sum_bound":
        return ndev, nel, "exact (not a floating dtype)"
    return ndev, nel, tol.describe()


def _compare_by_device(k, se, sa, shape_e, mesh, tol, rule, found: list) -> tuple[int, int, int]:
    """Device by device, layout and values, for an output whose layout differs somewhere:
    (devices compared, their elements, elements held exactly by a sum policy)."""
    ndev = nel = n_exact = 0
    for dev in sorted(se.keys() & sa.keys()):
        x, y = se[dev], sa[dev]
        pos = _Pos(mesh, dev)
        if not _same_index(x.index, y.index, shape_e):
            found.append(Mismatch(k, "index", f"index: refsim {_fmt_index(x.index)}, xla {_fmt_index(y.index)}",
                                  dev, pos.get()))
            continue
        dx, dy = np.asarray(x.data), np.asarray(y.data)
        if dx.shape != dy.shape:
            found.append(Mismatch(k, "shard shape", f"shard shape: refsim {dx.shape}, xla {dy.shape}", dev,
                                  pos.get(), x.index))
            continue
        if dx.dtype != dy.dtype:
            found.append(Mismatch(k, "shard dtype", f"shard dtype: refsim {dx.dtype}, xla {dy.dtype}", dev,
                                  pos.get(), x.index))
            continue
        ndev += 1
        nel += dx.size
        if rule == "sum_bound":
            n_exact += _check_sum(k, tol, dev, pos, x.index, dx, dy, found)
        elif not _same_bits(dx, dy):    # the same bits everywhere: every element passes its check
            _check_values(k, tol, rule, dev, pos, x.index, dx, dy, found)
    return ndev, nel, n_exact


def _check_values(k, tol, rule, dev, pos, index, dx, dy, found: list) -> None:
    """The element analysis of one device whose bits differ somewhere (`Ulp` or `Exact`)."""
    if rule == "ulp":
        bad = ~within_ulp(dx, dy, tol.ulps)
        if bad.any():
            found.append(_element_mismatch(k, "ulp", dev, pos.get(), index, bad, dx, dy, "xla",
                                           f"values differ by more than {tol.ulps} ulp in {int(bad.sum())} "
                                           f"of {bad.size} elements", policy=tol.why()))
    else:
        bad = ~same(dx, dy, rule == "exact")
        if bad.any():
            why = tol.why() if isinstance(tol, Exact) else "exact: integer and bool results are exact"
            found.append(_element_mismatch(k, "values", dev, pos.get(), index, bad, dx, dy, "xla",
                                           f"values differ in {int(bad.sum())} of {bad.size} elements",
                                           policy=why))


class _Pos:
    """A device's mesh position, looked up only when a mismatch names it (an argwhere per call)."""

    __slots__ = ("mesh", "dev")

    def __init__(self, mesh, dev):
        self.mesh, self.dev = mesh, dev

    def get(self):
        return _position(self.mesh, self.dev)


def _same_index(ie, ia, shape) -> bool:
    """``_norm_index(ie, shape) == _norm_index(ia, shape)``; equal tuples (the common case:
    slices compare by start, stop and step) without normalising."""
    if ie is ia:
        return True
    try:
        if type(ie) is tuple and type(ia) is tuple and bool(ie == ia):
            return True
    except (TypeError, ValueError):
        pass
    return _norm_index(ie, shape) == _norm_index(ia, shape)


_SMALL_BYTES = 1 << 16   # a shard up to this size is compared as one bytes object
_BYTES_ARE_BITS: dict = {}


def _bytes_are_bits(dtype) -> bool:
    """Whether `bits_equal` reads `dtype` bit for bit (not long double, structured, object...)."""
    ok = _BYTES_ARE_BITS.get(dtype)
    if ok is None:
        if dtype.kind == "c":
            ok = dtype.itemsize <= 16
        else:
            ok = _bit_view(np.empty(0, dtype)) is not None
        _BYTES_ARE_BITS[dtype] = ok
    return ok


def _same_bits(dx: np.ndarray, dy: np.ndarray) -> bool:
    """`bits_equal(dx, dy)` for two arrays of the same shape and dtype; a small pair by one
    comparison of their bytes (C order), which costs a fraction of bits_equal's NumPy calls."""
    if dx.nbytes <= _SMALL_BYTES and _bytes_are_bits(dx.dtype):
        return dx.tobytes() == dy.tobytes()
    return bits_equal(dx, dy)


#: SumBound's methods that build the check arrays; a policy that overrides none of them computes
#: every array element by element from its per-device mappings, so one call on the devices'
#: arrays stacked gives each device's arrays as its slice. A subclass that overrides some and
#: still builds every element from the same element of its mappings (and scalars) says so with
#: ``elementwise_arrays = True`` in its own class body (`SumBound.elementwise_arrays`).
_ELEMENTWISE_METHODS = ("check_arrays", "reference_and_bound", "exact_elements", "allowed_nonfinite",
                        "_allowed_nonfinite_part")
_PER_PART_KEYS = ("pinf", "ninf", "nan")   # sum_ok's masks that a complex sum may hold per part


def _check_sum_stacked(tol: SumBound, pairs: list) -> int | None:
    """The sum policy on every device at once (the devices' shards and check arrays stacked):
    the exact-element count when both sides pass everywhere; None when some element fails, or
    the arrays do not stack, and the device-by-device `_check_sum` must judge (and report)
    instead. Equivalent to `_check_sum` on each device, as `sum_ok` is elementwise."""
    dx0 = pairs[0][2]
    dtype, shape = dx0.dtype, dx0.shape
    if len(pairs) * dx0.size > _ROWS_ELEMENTS:
        return None
    for _, _, dx, _ in pairs:
        if dx.dtype != dtype or dx.shape != shape:
            return None
    cls = type(tol)
    if vars(cls).get("elementwise_arrays") is True or \
            all(getattr(cls, m) is getattr(SumBound, m) for m in _ELEMENTWISE_METHODS):
        arrays = _stacked_policy_arrays(tol, pairs)
    else:
        arrays = _stacked_device_arrays(tol, pairs)
    if arrays is None:
        return None
    xs = np.stack([p[2] for p in pairs])
    ys = np.stack([p[3] for p in pairs])
    if not sum_ok(ys, **arrays).all():
        return None
    if not (_bytes_are_bits(dtype) and xs.tobytes() == ys.tobytes()) and not sum_ok(xs, **arrays).all():
        return None
    return _count_true(arrays["exact"])


def _stacked_policy_arrays(tol: SumBound, pairs: list) -> dict | None:
    """`check_arrays` of every device in one call, on a copy of `tol` whose per-device mappings
    hold the devices' arrays stacked under one key (`tol` builds every array element by element
    from them: `_ELEMENTWISE_METHODS`); None where they do not stack as the shards do."""
    dtype, shape = pairs[0][2].dtype, pairs[0][2].shape
    devs = [p[0] for p in pairs]
    try:
        ex = [np.asarray(tol.exact[d]) for d in devs]
    except (KeyError, TypeError):
        return None
    if not _is_float(ex[0].dtype):
        return None
    # SumBound's own reference is the mapping's array itself, which `_check_sum` skips when it is
    # a side's data; an opted-in subclass's reference is a new array (`elementwise_arrays`)
    own_ref = type(tol).reference_and_bound is SumBound.reference_and_bound
    for (_, _, dx, dy), r in zip(pairs, ex):
        if r.shape != shape or r.dtype != ex[0].dtype or own_ref and (dx is r or dy is r):
            return None
    complex_sum = ex[0].dtype.kind == "c"
    part_shape = (2,) + shape if complex_sum else shape
    axis = 1 if complex_sum else 0     # a complex sum's per-part records lead with the part
    stacked = _recorded_stack(tol, devs, axis)

    def stack(name, want_shape, axis=0):
        m = getattr(tol, name)
        if m is None:
            return None
        if stacked is not None:
            return {0: stacked[name]}
        xs = [np.asarray(m[d]) for d in devs]
        if any(x.shape != want_shape or x.dtype != xs[0].dtype for x in xs):
            raise ValueError("not stackable")
        return {0: np.stack(xs, axis=axis)}

    try:
        fields = {"exact": stack("exact", shape), "abs_sum": stack("abs_sum", shape),
                  "exact_mask": stack("exact_mask", shape), "pos_sum": stack("pos_sum", part_shape, axis),
                  "neg_sum": stack("neg_sum", part_shape, axis), "inf_terms": stack("inf_terms", part_shape, axis)}
    except (KeyError, TypeError, ValueError):
        return None
    if any("__slots__" in vars(c) for c in type(tol).__mro__):
        one = dataclasses.replace(tol, **fields)
    else:
        one = object.__new__(type(tol))    # `tol` with the stacked mappings, without __init__'s cost
        one.__dict__.update(tol.__dict__)
        one.__dict__.update(fields)
    return one.check_arrays(0, dtype)


def _recorded_stack(tol: SumBound, devs: list, axis: int) -> dict | None:
    """The stacked arrays `SumBound.from_terms` recorded, in the order of `devs`, while every
    mapping entry is still the view it stored (else None: the mappings are stacked anew)."""
    rec = tol.__dict__.get("_stacked_record")
    if rec is None:
        return None
    rec_devs, arrays, views = rec
    where = {d: i for i, d in enumerate(rec_devs)}
    if len(devs) != len(rec_devs) or any(d not in where for d in devs):
        return None
    for name, vs in views.items():
        m, whole = getattr(tol, name), arrays[name]
        # each entry still the stored view of the stacked array (not replaced, nor a copy's copy)
        if m is None or len(m) != len(vs) or any(m.get(d) is not vs[where[d]] for d in devs) \
                or any(v.base is not whole for v in vs):
            return None
    order = [where[d] for d in devs]
    if order == list(range(len(order))):
        return arrays
    per_part = ("pos_sum", "neg_sum", "inf_terms")
    return {name: np.take(x, order, axis=axis if name in per_part else 0) for name, x in arrays.items()}


def _stacked_device_arrays(tol: SumBound, pairs: list) -> dict | None:
    """Each device's `check_arrays` (a policy that builds its own), stacked as the shards are;
    None where they do not stack (the device-by-device path then judges, raising what it raises)."""
    dtype, shape = pairs[0][2].dtype, pairs[0][2].shape
    per = []
    for dev, _, dx, dy in pairs:
        arrays = tol.check_arrays(dev, dtype)
        ref = arrays.get("ref")
        if not isinstance(ref, np.ndarray) or ref.shape != shape or dx is ref or dy is ref:
            return None
        per.append(arrays)
    keys = per[0].keys()
    if any(p.keys() != keys for p in per) or "nan" not in keys:
        return None
    per_part = dtype.kind == "c" and np.ndim(per[0]["nan"]) == len(shape) + 1
    out = {}
    for key in keys:
        vals = [p[key] for p in per]
        if key == "signed_zero" and vals[0] is None:
            if any(v is not None for v in vals):
                return None
            out[key] = None
            continue
        xs = [np.asarray(v) for v in vals]
        if any(x.dtype != xs[0].dtype for x in xs):
            return None
        if per_part and key in _PER_PART_KEYS:
            if any(x.shape != (2,) + shape for x in xs):
                return None
            out[key] = np.stack(xs, axis=1)
        else:
            if any(x.shape != shape and np.broadcast_shapes(x.shape, shape) != shape for x in xs):
                return None
            out[key] = np.stack([x if x.shape == shape else np.broadcast_to(x, shape) for x in xs])
    if dtype.kind == "c" and any((np.ndim(p["nan"]) == len(shape) + 1) != per_part for p in per):
        return None
    return out


def _check_sum(k, tol: SumBound, dev, pos, index, dx, dy, found: list) -> int:
    """Check both sides of one device against the sum policy; returns the exact-element count.
    `pos` (a `_Pos`) gives the device's mesh position for a mismatch."""
    arrays = tol.check_arrays(dev, dx.dtype)
    ref, exact = arrays["ref"], arrays["exact"]
    if ref.shape != dx.shape:
        # Broadcasting would hide a policy built for another layout (e.g. pmap's shards
        # keep the mapped axis), so refuse it rather than compare the wrong elements.
        raise ValueError(f"tolerances[{k}] gives device {dev} an exact value of shape {ref.shape}, "
                         f"but its shard has shape {dx.shape}; build the SumBound from terms "
                         f"of shape (n, *shard_shape).")
    zero_ok = None
    for side, data in (("xla", dy), ("refsim", dx)):
        if data is ref:  # the reference itself (the oracle's ScaledBound): within any bound
            continue
        if data.dtype == ref.dtype and data.shape == ref.shape:
            # equal bits to the reference pass sum_ok wherever a zero difference is within the bound
            if zero_ok is None:
                zero_ok = _zero_is_within(arrays["bound"], exact)
            if zero_ok and bits_equal(data, ref):
                continue
        bad = ~_sum_ok_by_rows(data, arrays)
        if not bad.any():
            continue
        n_ex = int((bad & exact).sum())
        if n_ex == int(bad.sum()):
            why = tol.why(True)
        elif n_ex == 0:
            why = tol.why(False)
        else:
            why = f"{n_ex} element(s): {tol.why(True)}; the others: {tol.why(False)}"
        found.append(_element_mismatch(k, "bound", dev, pos.get(), index, bad, ref, data, side,
                                       f"{side} result outside {tol.describe()} "
                                       f"in {int(bad.sum())} of {bad.size} elements", arrays["bound"], policy=why))
    return _count_true(exact)


_ROWS_ELEMENTS = 1 << 20  # elements per block of _sum_ok_by_rows


def _sum_ok_by_rows(data: np.ndarray, arrays: dict) -> np.ndarray:
    """`sum_ok` in blocks of leading-axis rows: its float64 temporaries stay a few MiB (reused
    by the allocator) instead of several full-size arrays (a 512 MiB float32 shard made ~10
    fresh GiB-sized ones, most of a large call's comparison time)."""
    if data.ndim == 0 or data.size <= _ROWS_ELEMENTS or data.shape[0] < 2:
        return sum_ok(data, **arrays)
    step = max(1, _ROWS_ELEMENTS // max(1, data.size // data.shape[0]))

    def rows(m, sl):
        m = np.asarray(m)
        if m.ndim == data.ndim + 1:               # a complex sum's per-part mask: (2, *shape)
            return m[:, sl]
        return m[sl] if m.ndim == data.ndim and m.shape[0] == data.shape[0] else m

    ok = np.empty(data.shape, bool)
    for start in range(0, data.shape[0], step):
        sl = slice(start, start + step)
        ok[sl] = sum_ok(data[sl], **{k: rows(v, sl) for k, v in arrays.items()})
    return ok


def _with_negative_zeros(terms: np.ndarray, total: np.ndarray, axis: int = 0) -> np.ndarray:
    """`total` (NumPy's sum of `terms` over `axis`, which starts from +0) with -0 where every
    term is -0, as IEEE 754 addition gives (a complex sum part by part)."""
    if terms.dtype.kind not in "fc" or terms.shape[axis] == 0:
        return total
    if terms.dtype.kind == "c":
        out = np.array(total, copy=True)
        out.real = _with_negative_zeros(terms.real, total.real, axis)
        out.imag = _with_negative_zeros(terms.imag, total.imag, axis)
        return out
    all_negative_zero = ((terms == 0) & np.signbit(terms)).all(axis=axis)
    return np.where(all_negative_zero, -0.0, total).astype(total.dtype)


def _divide_parts(total: np.ndarray, divisor: int) -> np.ndarray:
    """`total / divisor`, a complex total part by part: NumPy divides a complex by a real as a
    complex division, which makes both parts NaN when one is (``(nan-1.5j) / 1`` is nan+nanj),
    while a psum / pmean of complex values adds (and scales) the parts separately."""
    if total.dtype.kind != "c":
        return total / total.dtype.type(divisor)
    out = np.empty_like(total)
    out.real, out.imag = total.real / divisor, total.imag / divisor
    return out


def _element_mismatch(k, kind, dev, pos, index, bad, exp, act, side, msg, bound=None, policy="") -> Mismatch:
    where = np.argwhere(bad)
    elems = []
    for loc in where[:_MAX_ELEMENTS]:
        loc = tuple(int(v) for v in loc)
        tol = None if bound is None else _scalar(np.broadcast_to(bound, bad.shape)[loc])
        elems.append((loc, _global(index, loc), _scalar(exp[loc]), _scalar(act[loc]), tol))
    classes = element_classes(exp, act, bad, act.dtype)
    return Mismatch(k, kind, msg, dev, pos, index, tuple(elems), int(bad.sum()), int(bad.size), side, policy,
                    classes)


# -- small helpers ---------------------------------------------------------------------------
def _position(mesh, dev: int):
    try:
        return mesh.device_position(dev) if mesh is not None else None
    except (ValueError, AttributeError):
        return None


def _norm_index(index, shape) -> tuple:
    """Slices as (start, stop, step) over the global dim, so slice(None) equals slice(0, n)."""
    out, d = [], 0
    for i in tuple(index):
        if isinstance(i, slice):
            out.append(i.indices(shape[d]) if d < len(shape) else (i.start, i.stop, i.step))
        else:
            out.append(int(i))
        d += 1
    return tuple(out)


def _global(index, loc: tuple) -> tuple:
    """The global coordinates of local element `loc` of a shard at `index` (ints: pmap's unstacked dims)."""
    out, j = [], 0
    for i in tuple(index) if index is not None else ():
        if isinstance(i, slice):
            out.append((i.start or 0) + loc[j] if j < len(loc) else None)
            j += 1
        else:
            out.append(int(i))
    out += list(loc[j:])
    return tuple(out)


def _fmt_index(index) -> str:
    parts = []
    for i in tuple(index):
        if isinstance(i, slice):
            parts.append(":" if i.start is None and i.stop is None else f"{i.start or 0}:{i.stop}")
        else:
            parts.append(str(int(i)))
    return "[" + ", ".join(parts) + "]"


def _scalar(v):
    v = np.asarray(v)
    if v.dtype.names:  # a PRNG key (refsim's structured key dtype): its key words
        return tuple(int(w) for name in v.dtype.names for w in np.ravel(v[name]))
    if v.dtype.kind == "c":
        return complex(v)
    if v.dtype.kind in "iu":
        return int(v)
    if v.dtype.kind == "b":
        return bool(v)
    if v.dtype.kind in "TUS":  # a string array's element (NumPy's StringDType, str_, bytes_)
        return v.item()
    return float(v)


def _to_float(v) -> float:
    return abs(v) if isinstance(v, complex) else float(v)
