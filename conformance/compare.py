"""The comparison policy of DESIGN.md: refsim's result against XLA's, output by output, device by device.

* Layout: both sides hold the same device ids, and each device the same index, shape and dtype.
* `Exact` (data movement, integers, bool, min/max): bit-exact, except that NaN equals NaN
  (payloads are ignored) and, with ``signed_zero=False`` (min/max, where IEEE 754 leaves
  the sign of a zero result open), +0 equals -0.
* `SumBound` (floating psum / pmean / psum_scatter): the result must lie within the rigorous
  recursive-summation bound ``|y - S| <= gamma(n-1) * sum|x_i|`` around the exact sum S,
  ``gamma(k) = k*u / (1 - k*u)`` with u the unit roundoff of the dtype (Higham, "Accuracy
  and Stability of Numerical Algorithms", Thm 4.3; it holds for any order and tree shape).
  S is computed in higher precision and that reference's own error is added to the bound.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

__all__ = ["EXACT", "ComparisonResult", "Exact", "Mismatch", "SumBound", "as_outputs", "compare",
           "gamma", "unit_roundoff"]

_MAX_ELEMENTS = 5  # differing elements listed per mismatch


# -- policies -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Exact:
    """Bit-exact equality; NaN equals NaN; ±0 must match unless `signed_zero` is False."""

    signed_zero: bool = True

    def describe(self) -> str:
        return "exact" if self.signed_zero else "exact (+0 == -0)"


EXACT = Exact()


def _is_float(dtype) -> bool:
    """True for real and complex floating dtypes, including ml_dtypes' bfloat16 and friends."""
    dtype = np.dtype(dtype)
    return dtype.kind in "fc" or (dtype.kind == "V" and "float" in dtype.name)


def _finfo(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        dtype = np.dtype(f"f{dtype.itemsize // 2}")
    if dtype.kind == "f":
        return np.finfo(dtype)
    import ml_dtypes

    return ml_dtypes.finfo(dtype)


def unit_roundoff(dtype) -> float:
    """u = 2**-p for a floating dtype with p significand bits (float32: 2**-24; bfloat16: 2**-8)."""
    return float(_finfo(dtype).eps) / 2


def gamma(k: int, u: float) -> float:
    """Higham's gamma(k) = k*u / (1 - k*u); requires k*u < 1."""
    if k * u >= 1:
        raise ValueError(f"gamma(k={k}, u={u}) is undefined: k*u must be < 1 (too many summands for this dtype).")
    return k * u / (1 - k * u)


def _reference_dtype(dtype) -> np.dtype:
    """The precision the exact sum is computed in: float64, or longdouble for 64-bit floats."""
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return np.dtype(np.clongdouble if dtype.itemsize >= 16 else np.complex128)
    return np.dtype(np.longdouble if dtype.itemsize >= 8 and dtype.kind == "f" else np.float64)


@dataclasses.dataclass(frozen=True)
class SumBound:
    """The rigorous bound for a floating sum, or (``mean=True``) a mean ``fl(sum / divisor)``, of n terms.

    `exact[d]` is device d's exact sum of its n terms (higher precision), `abs_sum[d]` the sum
    of their magnitudes; `integer_terms` marks sums of integers (exact; only pmean's final
    division rounds). Build it from the terms with `SumBound.from_terms`.
    """

    n: int
    exact: Mapping[int, np.ndarray]
    abs_sum: Mapping[int, np.ndarray]
    divisor: int = 1
    integer_terms: bool = False
    reference_u: float = 2.0 ** -53
    mean: bool = False

    def describe(self) -> str:
        what = "mean" if self.mean else "sum"
        return f"{what} of n={self.n} within gamma(n-1)*sum|x|"

    @classmethod
    def from_terms(cls, terms: Mapping[int, np.ndarray], *, mean: bool = False) -> "SumBound":
        """`terms[d]` has shape (n, *shard_shape): the n values device d's output sums (or
        averages, with `mean`), per element."""
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
        exact = {d: t.astype(ref).sum(axis=0) / ref.type(divisor) for d, t in terms.items()}
        abs_sum = {d: np.abs(t.astype(ref)).sum(axis=0) for d, t in terms.items()}
        u_ref = unit_roundoff(ref)
        return cls(n=ns.pop(), exact=exact, abs_sum=abs_sum, divisor=int(divisor),
                   integer_terms=integer, reference_u=u_ref, mean=mean)

    def reference_and_bound(self, device_id: int, out_dtype) -> tuple[np.ndarray, np.ndarray]:
        """(exact value, allowed |result - exact|) for one device's output of dtype `out_dtype`."""
        out_dtype = np.dtype(out_dtype)
        u = unit_roundoff(out_dtype)
        ur = self.reference_u
        k = max(self.n - 1, 0)
        ex = np.asarray(self.exact[device_id])
        a = np.asarray(self.abs_sum[device_id])
        g = 0.0 if self.integer_terms else gamma(k, u)
        gr = 0.0 if self.integer_terms else gamma(k, ur)
        # Each of the n-1 additions may also underflow by half the smallest subnormal.
        tiny = float(_finfo(out_dtype).smallest_subnormal) * self.n
        err_sum = (g + gr) * a + tiny
        if not self.mean:
            bound = err_sum
        else:
            # fl(s/n) = (s/n)(1+d), |d| <= u: the sum's error shrinks by n, the division (or, for
            # integer inputs, the conversion to float, even when n == 1) adds u*|s|/n.
            bound = (err_sum * (1 + u) + (u + ur) * (np.abs(ex) * self.divisor + err_sum)) / self.divisor
        return ex, np.asarray(bound * (1 + 2.0 ** -40))  # margin for rounding in the bound itself


# -- results --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One disagreement: which output, device and check, and the first differing elements.

    kind is one of "outputs", "shape", "dtype", "devices", "index", "shard shape",
    "shard dtype", "values", "bound". `elements` lists (local index, global index,
    refsim value, `side`'s value, None) or, for "bound", (..., exact value, `side`'s value,
    allowed error); `count` of `size` elements differ.
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

    def render(self) -> str:
        where = f"output {self.output}"
        if self.device_id is not None:
            where += f", device {self.device_id}"
            if self.position is not None:
                where += f" (mesh position {self.position})"
        if self.index is not None:
            where += f", index {_fmt_index(self.index)}"
        lines = [f"{where}: {self.message}"]
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

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def __bool__(self) -> bool:
        return self.ok

    def report(self, max_mismatches: int = 8) -> str:
        """A readable block: the case (program, mesh, device order, specs, dtype), then each mismatch."""
        head = "MATCH" if self.ok else f"MISMATCH ({len(self.mismatches)} found)"
        cid = getattr(self.case, "case_id", None)
        lines = [f"{head}: {cid}" if cid else head]
        if self.case is not None and hasattr(self.case, "describe"):
            lines += ["  " + ln for ln in self.case.describe().splitlines()]
        pol = ", ".join(p.describe() for p in self.policies)
        lines.append(f"  checked {self.outputs} output(s), {self.devices} device shard(s), "
                     f"{self.elements} element(s); policy: {pol or 'exact'}")
        for m in self.mismatches[:max_mismatches]:
            lines += ["  " + ln for ln in m.render().splitlines()]
        if len(self.mismatches) > max_mismatches:
            lines.append(f"  ... {len(self.mismatches) - max_mismatches} more mismatches")
        return "\n".join(lines)

    __str__ = report

    def raise_if_mismatch(self) -> None:
        if not self.ok:
            raise AssertionError(self.report())


# -- the comparator --------------------------------------------------------------------------
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


def compare(expected, actual, *, tolerances=None, case=None) -> ComparisonResult:
    """Compare refsim's result (`expected`) with XLA's (`actual`) by the policy of DESIGN.md.

    tolerances: one policy (`Exact`/`SumBound`) for every output, or one per output; by
    default ``case.tolerances()`` when a case is given, else `EXACT`.
    """
    exp, act = as_outputs(expected), as_outputs(actual)
    if tolerances is None:
        tolerances = case.tolerances() if case is not None else [EXACT] * len(exp)
    elif isinstance(tolerances, (Exact, SumBound)):
        tolerances = [tolerances] * len(exp)
    tolerances = list(tolerances)
    if len(tolerances) != len(exp):
        raise ValueError(f"got {len(tolerances)} tolerances for {len(exp)} outputs; give one per output.")
    found: list[Mismatch] = []
    ndev = nel = 0
    if len(exp) != len(act):
        found.append(Mismatch(-1, "outputs", f"refsim returned {len(exp)} outputs, xla {len(act)}"))
    for k, (e, a, tol) in enumerate(zip(exp, act, tolerances)):
        d, n = _compare_output(k, e, a, tol, found)
        ndev += d
        nel += n
    return ComparisonResult(tuple(found), outputs=min(len(exp), len(act)), devices=ndev, elements=nel,
                            policies=tuple(tolerances), case=case)


def _compare_output(k: int, e, a, tol, found: list) -> tuple[int, int]:
    shape_e, shape_a = tuple(e.shape), tuple(a.shape)
    if shape_e != shape_a:
        found.append(Mismatch(k, "shape", f"global shape: refsim {shape_e}, xla {shape_a}"))
        return 0, 0
    if np.dtype(e.dtype) != np.dtype(a.dtype):
        found.append(Mismatch(k, "dtype", f"dtype: refsim {np.dtype(e.dtype)}, xla {np.dtype(a.dtype)}"))
        return 0, 0
    se = {int(s.device_id): s for s in e.shards}
    sa = {int(s.device_id): s for s in a.shards}
    if set(se) != set(sa):
        missing, extra = sorted(set(se) - set(sa)), sorted(set(sa) - set(se))
        found.append(Mismatch(k, "devices", f"device ids differ: refsim {sorted(se)}, xla {sorted(sa)} "
                                            f"(missing on xla: {missing}, extra on xla: {extra})"))
    mesh = getattr(getattr(a, "sharding", None), "mesh", None)
    ndev = nel = 0
    for dev in sorted(set(se) & set(sa)):
        x, y = se[dev], sa[dev]
        pos = _position(mesh, dev)
        ie, ia = _norm_index(x.index, shape_e), _norm_index(y.index, shape_e)
        if ie != ia:
            found.append(Mismatch(k, "index", f"index: refsim {_fmt_index(x.index)}, xla {_fmt_index(y.index)}",
                                  dev, pos))
            continue
        dx, dy = np.asarray(x.data), np.asarray(y.data)
        if dx.shape != dy.shape:
            found.append(Mismatch(k, "shard shape", f"shard shape: refsim {dx.shape}, xla {dy.shape}", dev, pos, x.index))
            continue
        if dx.dtype != dy.dtype:
            found.append(Mismatch(k, "shard dtype", f"shard dtype: refsim {dx.dtype}, xla {dy.dtype}", dev, pos, x.index))
            continue
        ndev += 1
        nel += dx.size
        if isinstance(tol, SumBound) and _is_float(dx.dtype):
            ref, bound = tol.reference_and_bound(dev, dx.dtype)
            if ref.shape != dx.shape:
                # Broadcasting would hide a policy built for another layout (e.g. pmap's shards
                # keep the mapped axis), so refuse it rather than compare the wrong elements.
                raise ValueError(f"tolerances[{k}] gives device {dev} an exact value of shape {ref.shape}, "
                                 f"but its shard has shape {dx.shape}; build the SumBound from terms "
                                 f"of shape (n, *shard_shape).")
            for side, data in (("xla", dy), ("refsim", dx)):
                bad = ~_within(data, ref, bound)
                if bad.any():
                    found.append(_element_mismatch(k, "bound", dev, pos, x.index, bad, ref, data, side,
                                                   f"{side} result outside {tol.describe()} "
                                                   f"in {int(bad.sum())} of {bad.size} elements", bound))
        else:
            signed = tol.signed_zero if isinstance(tol, Exact) else True
            bad = ~_bit_equal(dx, dy, signed)
            if bad.any():
                found.append(_element_mismatch(k, "values", dev, pos, x.index, bad, dx, dy, "xla",
                                               f"values differ in {int(bad.sum())} of {bad.size} elements"))
    return ndev, nel


def _bit_equal(x: np.ndarray, y: np.ndarray, signed_zero: bool) -> np.ndarray:
    """Elementwise equality with NaN == NaN and, if `signed_zero`, +0 != -0."""
    if x.dtype.kind == "c":
        return _bit_equal(x.real, y.real, signed_zero) & _bit_equal(x.imag, y.imag, signed_zero)
    if not _is_float(x.dtype):
        return np.asarray(x == y)
    xf, yf = x.astype(np.float64), y.astype(np.float64)
    same = (xf == yf) | (np.isnan(xf) & np.isnan(yf))
    if signed_zero:
        same &= (np.signbit(xf) == np.signbit(yf)) | np.isnan(xf)
    return same


def _within(data: np.ndarray, ref: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """|data - ref| <= bound, with NaN matching only NaN and infinities only themselves."""
    if data.dtype.kind == "c":
        return _within(data.real, ref.real, bound) & _within(data.imag, ref.imag, bound)
    d = data.astype(ref.dtype if ref.dtype.kind == "f" else np.float64)
    r = np.asarray(ref)
    nan_ok = np.isnan(d) & np.isnan(r)
    inf_ok = np.isinf(d) & np.isinf(r) & (d == r)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.abs(d - r) <= bound
    return nan_ok | inf_ok | (close & np.isfinite(d) & np.isfinite(r))


def _element_mismatch(k, kind, dev, pos, index, bad, exp, act, side, msg, bound=None) -> Mismatch:
    where = np.argwhere(bad)
    elems = []
    for loc in where[:_MAX_ELEMENTS]:
        loc = tuple(int(v) for v in loc)
        tol = None if bound is None else _scalar(np.broadcast_to(bound, bad.shape)[loc])
        elems.append((loc, _global(index, loc), _scalar(exp[loc]), _scalar(act[loc]), tol))
    return Mismatch(k, kind, msg, dev, pos, index, tuple(elems), int(bad.sum()), int(bad.size), side)


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
    if v.dtype.kind == "c":
        return complex(v)
    if v.dtype.kind in "iu":
        return int(v)
    if v.dtype.kind == "b":
        return bool(v)
    return float(v)


def _to_float(v) -> float:
    return abs(v) if isinstance(v, complex) else float(v)
