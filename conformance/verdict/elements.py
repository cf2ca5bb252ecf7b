"""The element check of the comparison policy, NumPy only: one shard's elements against a rule.

`conformance.verdict.compare` decides which rule applies to an output (`Exact`, `SumBound`,
`Ulp`) and builds its reference arrays; the functions here hold the elements to it. Both
reproducer templates (`conformance.cases.repro`, `conformance.oracle.reproduce`) paste this module's
source text into the file they write (`conformance.verdict.ELEMENT_CHECK`), so a reproducer
judges every element exactly as `conformance.compare` does while needing only NumPy.

Hence: import nothing but NumPy and the standard library here, no ``from __future__`` (the
text lands in the middle of a file), and define only functions and constants whose names a
reproducer does not use otherwise (it also defines program, inputs, run, check, _mesh, _data).

Every check works part by part on complex values (a psum adds the real and the imaginary
parts separately, so each part has its own reference, NaN and infinities), and in float64
(or the reference's own wider precision), in which every float dtype up to 64 bits is exact.
"""
import numpy as np


def is_float(dtype) -> bool:
    """True for real and complex floating dtypes, including ml_dtypes' bfloat16 and float8 types."""
    dtype = np.dtype(dtype)
    return dtype.kind in "fc" or (dtype.kind == "V" and "float" in dtype.name)


def same(have, want, signed_zero: bool = True) -> np.ndarray:
    """Per element: equal, or NaN on both sides (payloads ignored); a complex number part by part;
    with `signed_zero`, a float zero's sign counts (bfloat16 and float8 included)."""
    have, want = np.asarray(have), np.asarray(want)
    if have.dtype.kind == "c":
        return same(have.real, want.real, signed_zero) & same(have.imag, want.imag, signed_zero)
    if not is_float(have.dtype):
        return np.asarray(have == want)
    with np.errstate(invalid="ignore"):                      # float8 / bfloat16 NaN casts warn
        x, y = have.astype(np.float64), want.astype(np.float64)
    eq = (x == y) | (np.isnan(x) & np.isnan(y))
    if signed_zero:
        eq &= (np.signbit(x) == np.signbit(y)) | np.isnan(x)
    return eq


def sum_ok(have, ref, bound, exact, pinf, ninf, nan, signed_zero=None) -> np.ndarray:
    """Per element of a floating sum (or mean, or any result held to a bound around a reference):
    NaN where `nan` allows it or the reference `ref` is NaN, an infinity where `pinf` / `ninf`
    allows it or `ref` is that infinity, else `ref` exactly where `exact` (either sign of a zero,
    except where the mask `signed_zero` says the zero's sign is defined: then `ref`'s) or within
    `bound` of it.

    For complex `have` the check runs part by part against ``ref.real`` and ``ref.imag``;
    masks with one more leading axis of 2 than `have` hold the real part's, then the imaginary
    part's allowances (`conformance.compare.SumBound.allowed_nonfinite`).
    """
    have, ref = np.asarray(have), np.asarray(ref)
    if have.dtype.kind == "c":
        per_part = np.ndim(nan) == have.ndim + 1
        part = (lambda m, i: np.asarray(m)[i]) if per_part else (lambda m, i: m)  # noqa: E731
        re = sum_ok(have.real, ref.real, bound, exact, part(pinf, 0), part(ninf, 0), part(nan, 0), signed_zero)
        return re & sum_ok(have.imag, ref.imag, bound, exact, part(pinf, 1), part(ninf, 1), part(nan, 1),
                           signed_zero)
    with np.errstate(invalid="ignore", over="ignore"):
        d = have.astype(np.float64) if ref.dtype.itemsize <= 8 else have.astype(ref.dtype)
        dn = np.isnan(d)
        # where the exact reference is itself non-finite (inf/NaN terms), IEEE fixes the result
        ok = np.where(np.isnan(ref), dn, False)
        ok |= dn & nan
        ok |= (d == np.inf) & (pinf | (ref == np.inf)) | (d == -np.inf) & (ninf | (ref == -np.inf))
        fin = np.isfinite(d) & np.isfinite(ref)
        ok |= fin & exact & (d == ref)
        ok |= fin & ~exact & (np.abs(d - ref) <= bound)
        if signed_zero is not None:
            zero = np.asarray(signed_zero, bool) & (d == 0) & (ref == 0)
            ok &= ~zero | (np.signbit(d) == np.signbit(ref))
    return ok


def ulp_distance(a, b) -> np.ndarray:
    """Units in the last place between same-dtype floating `a` and `b`, elementwise (int64):
    the number of representable values between them; +0 and -0 are 0 apart; complex: the
    larger of the parts' distances. NaN and infinities are the caller's to handle (their
    distance is not meaningful)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "c":
        return np.maximum(ulp_distance(a.real, b.real), ulp_distance(a.imag, b.imag))
    return np.abs(_ordered(a) - _ordered(b))


def _ordered(x: np.ndarray) -> np.ndarray:
    """Map floats onto integers monotonically (adjacent floats -> adjacent integers, ±0 -> 0)."""
    bits = x.view(f"u{x.dtype.itemsize}").astype(np.int64)
    sign = np.int64(1) << np.int64(8 * x.dtype.itemsize - 1)
    mag = bits & ~sign                                       # sign - 1 would overflow for 64 bits
    return np.where(bits & sign, -mag, mag)


def within_ulp(have, want, ulps: int) -> np.ndarray:
    """Per element: at most `ulps` units in the last place apart (part by part); NaN only
    matches NaN and an infinity only itself. Integers and bools must be equal."""
    have, want = np.asarray(have), np.asarray(want)
    if have.dtype.kind == "c":
        return within_ulp(have.real, want.real, ulps) & within_ulp(have.imag, want.imag, ulps)
    if not is_float(have.dtype):
        return same(have, want)
    with np.errstate(invalid="ignore"):
        x, y = have.astype(np.float64), want.astype(np.float64)
        both_nan = np.isnan(x) & np.isnan(y)
        inf = np.isinf(x) | np.isinf(y)
        fin = ~np.isnan(x) & ~np.isnan(y) & ~inf
        return both_nan | (inf & (x == y)) | (fin & (ulp_distance(have, want) <= ulps))


def close(a, b, rtol: float, atol: float, equal_nan: bool = True) -> np.ndarray:
    """``np.isclose(a, b, rtol, atol)`` in float64 (``|a - b| <= atol + rtol * |b|``, equal
    infinities close), a complex number part by part."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "c" or b.dtype.kind == "c":
        return (close(np.real(a), np.real(b), rtol, atol, equal_nan)
                & close(np.imag(a), np.imag(b), rtol, atol, equal_nan))
    with np.errstate(invalid="ignore", over="ignore"):
        return np.isclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol, equal_nan=equal_nan)


def abs_diff(a, b) -> np.ndarray:
    """|a - b| per element in float64 (NaN or inf where a side is not finite); for complex
    values the larger of the two parts' differences, as the part-by-part checks measure it."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "c" or b.dtype.kind == "c":
        return np.maximum(abs_diff(np.real(a), np.real(b)), abs_diff(np.imag(a), np.imag(b)))
    with np.errstate(invalid="ignore", over="ignore"):
        return np.abs(a.astype(np.float64) - b.astype(np.float64))


# -- a reference in any precision, written with float64 arrays only ----------------------------------
# compare computes a float64 sum's reference in long double. A reproducer writes a long double
# array as three float64 arrays (the significand's high and low halves and the exponent), so it
# holds the same value bit for bit, also beyond float64's range, in a portable file (.npz or
# source text); a float64 reference is written as itself.
def _precision(dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype.itemsize > 8 and dtype.kind == "f":
        return "longdouble"
    if dtype.itemsize > 16 and dtype.kind == "c":
        return "clongdouble"
    return "complex128" if dtype.kind == "c" else "float64"


def _split(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        m, e = np.frexp(x)                                    # inf / NaN: m is x, e is 0
        hi = m.astype(np.float64)
        lo = np.where(np.isfinite(m), m - hi, 0).astype(np.float64)
    return np.stack([hi, lo, e.astype(np.float64)])


def pack(x) -> tuple:
    """(precision name, float64 array) holding the real or complex float array `x` bit for bit;
    `unpack` rebuilds it. A complex `x` gets a leading axis of 2 (real, imaginary); a long
    double one then an axis of 3 (significand high, significand low, exponent)."""
    x = np.asarray(x)
    name = _precision(x.dtype)
    parts = [x.real, x.imag] if x.dtype.kind == "c" else [x]
    wide = name in ("longdouble", "clongdouble")
    cols = [_split(p) if wide else np.asarray(p, np.float64) for p in parts]
    return name, (np.stack(cols) if len(cols) > 1 else cols[0])


def unpack(precision: str, parts) -> np.ndarray:
    """The array `pack` wrote, in `precision` ("float64", "longdouble", "complex128",
    "clongdouble"; this machine's long double, which is float64 where it has no wider one)."""
    precision, parts = str(precision), np.asarray(parts, np.float64)
    wide = precision in ("longdouble", "clongdouble")

    def join(p):
        if not wide:
            return p
        hi, lo = p[0].astype(np.longdouble), p[1].astype(np.longdouble)
        with np.errstate(invalid="ignore", over="ignore"):
            m = np.where(lo != 0, hi + lo, hi)                # hi alone keeps the sign of a zero
            return np.ldexp(m, p[2].astype(np.intc))

    if precision in ("float64", "longdouble"):
        return join(parts)
    re, im = join(parts[0]), join(parts[1])
    out = np.empty(re.shape, np.dtype(precision))
    out.real, out.imag = re, im
    return out


#: The keys of `pack_sum_check`'s dict (a reproducer's .npz stores each under its own name).
SUM_CHECK_FIELDS = ("ref", "ref_precision", "bound", "bound_precision", "exact", "pinf", "ninf", "nan",
                    "signed_zero")


def pack_sum_check(ref, bound, exact, pinf, ninf, nan, signed_zero=False) -> dict:
    """The arrays of a `sum_ok` check as a dict of plain arrays (float64, bool, str) that a
    reproducer writes out exactly (`conformance.compare.SumBound.check_arrays` gives them)."""
    ref_p, ref_a = pack(ref)
    bound_p, bound_a = pack(bound)
    out = {"ref": ref_a, "ref_precision": np.array(ref_p), "bound": bound_a, "bound_precision": np.array(bound_p)}
    for name, m in (("exact", exact), ("pinf", pinf), ("ninf", ninf), ("nan", nan)):
        out[name] = np.asarray(m, bool)
    out["signed_zero"] = np.broadcast_to(np.asarray(signed_zero, bool), np.shape(out["exact"])).copy()
    return out


def sum_ok_packed(have, packed) -> tuple:
    """(ok per element, reference, bound): `sum_ok` of `have` against the arrays `pack_sum_check` wrote."""
    ref = unpack(str(packed["ref_precision"]), packed["ref"])
    bound = unpack(str(packed["bound_precision"]), packed["bound"])
    ok = sum_ok(have, ref, bound, np.asarray(packed["exact"]), np.asarray(packed["pinf"]),
                np.asarray(packed["ninf"]), np.asarray(packed["nan"]),
                np.asarray(packed["signed_zero"]) if "signed_zero" in packed else None)
    return ok, ref, bound


def shard_failures(k: int, dev: int, shard, want, want_index, shape, policy: str, ulps: int = 0,
                   packed_sum=None, *, exact_word: str = "exact", bound_word: str = "bound",
                   item: bool = False, most: int = 5) -> list:
    """The failures, as text, of one output shard a reproducer reads back (`shard`: JAX's
    ``addressable_shards`` entry) against refsim's block `want` at `want_index` of an output of
    `shape`: a wrong index, dtype or shape, else up to `most` elements outside `policy`
    ("exact", "exact_unsigned_zero", "ulp" within `ulps`, or "sum_bound" / "scaled" against
    `packed_sum`, a `pack_sum_check` record). `exact_word` / `bound_word` name the sum's
    reference and allowance in the text; `item` prints elements as Python scalars."""

    def norm(ix):
        return tuple(i.indices(n)[:2] if isinstance(i, slice) else (i, i + 1) for i, n in zip(ix, shape))

    def show(x):
        return repr(x.item() if item else x)

    have = np.asarray(shard.data)
    where = f"output {k} device {dev}"
    if norm(tuple(shard.index)) != norm(want_index):
        return [f"{where}: index {shard.index}, expected {want_index}"]
    if have.dtype != want.dtype or have.shape != want.shape:
        return [f"{where}: {have.dtype}{list(have.shape)}, expected {want.dtype}{list(want.shape)}"]
    if policy in ("sum_bound", "scaled"):
        ok, ref, bound = sum_ok_packed(have, packed_sum)
        err = abs_diff(have, ref)
        return [f"{where} element {i}: got {show(have[i])}, {exact_word} {show(ref[i])}, |diff| {show(err[i])} > "
                f"{bound_word} {show(bound[i])}" for i in [tuple(int(v) for v in p) for p in np.argwhere(~ok)[:most]]]
    ok = within_ulp(have, want, ulps) if policy == "ulp" else same(have, want, policy == "exact")
    return [f"{where} element {i}: got {show(have[i])}, expected {show(want[i])}"
            for i in [tuple(int(v) for v in p) for p in np.argwhere(~ok)[:most]]]


# -- an unreduced output's value --------------------------------------------------------------------
#: How partial values combine, by JAX's unreduced kind (jax 0.10.2 has only sums).
PARTIAL_OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def combine_partials(parts, kind: str = "sum") -> np.ndarray:
    """The value a list of partial values stands for (the devices along an output's unreduced
    mesh axes, in ascending mesh position): folded strictly left to right by `kind` ("sum",
    "max", "min") in their own dtype, as refsim's all-reduce folds them; a float max / min's
    zero is +0 for max when any part is +0 (-0 for min when any is -0) and a NaN stays NaN
    (IEEE 754-2019's maximum / minimum, whatever the parts' order)."""
    if kind not in PARTIAL_OPS:
        raise ValueError(f"kind={kind!r}: partial values combine by 'sum', 'max' or 'min'")
    parts = [np.asarray(p) for p in parts]
    op, out = PARTIAL_OPS[kind], parts[0].copy()
    with np.errstate(invalid="ignore", over="ignore"):
        for p in parts[1:]:
            out = op(out, p).astype(parts[0].dtype, copy=False)
    if kind != "sum" and is_float(out.dtype) and out.dtype.kind != "c":
        xs = np.stack(parts).astype(np.float64)
        with np.errstate(invalid="ignore"):
            zero = out.astype(np.float64) == 0
            plus = np.logical_or.reduce((xs == 0) & ~np.signbit(xs), axis=0)
            minus = np.logical_or.reduce((xs == 0) & np.signbit(xs), axis=0)
        negative = ~plus if kind == "max" else minus
        out = np.where(zero, np.where(negative, -0.0, 0.0).astype(out.dtype), out).astype(out.dtype)
    return out
