"""Measure refsim's transcendental accuracy: `python -m bench.accuracy [--samples N] [--json FILE]`.

For every float primitive in `refsim.interpreter.accuracy.OPS` and each of float32 /
float64, draws N inputs over the op's domain (log-uniform magnitudes, both signs where
the domain allows, plus the domain's edges) and reports the largest distance in ulps of

- refsim's rule from the correctly rounded result (float32: NumPy's long double result, or
  its float64 one where long double is no wider or the op has no long double loop, rounded
  once; whole ulps; float64: from NumPy's long double result, in fractions of an ulp (a
  correctly rounded result is within 0.5), where `np.longdouble` has a 64-bit significand
  (x86-64 Linux) and the op has a long double loop (not SciPy's functions); else not measured),
- XLA:CPU (`jax.jit` of the primitive) from the same references,
- refsim from XLA:CPU.

A second table measures refsim float64 alone against long double on more samples
(`--f64-samples`, 2M by default). The figures in `refsim/interpreter/accuracy.py` and
docs/primitives.md come from this script (seed 0, 200000 samples, jax 0.10.2 and 0.12.0 on
x86-64). It prints one table
and one JSON line per (op, dtype). refsim's results do not depend on the host (refsim.libm);
the XLA:CPU and NumPy reference figures may (NumPy dispatches to SIMD kernels per CPU).
"""
from __future__ import annotations

import argparse
import json
import sys
import types

import numpy as np


def _ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in units in the last place of a's dtype (order-preserving integer map; NaN=NaN -> 0)."""
    bits = {np.dtype(np.float32): (np.int32, 32), np.dtype(np.float64): (np.int64, 64)}[a.dtype]
    it, nbits = bits
    ia, ib = a.view(it).astype(np.int64), b.view(it).astype(np.int64)
    if nbits == 64:
        ia, ib = a.view(np.int64).astype(object), b.view(np.int64).astype(object)
    lo = -(1 << (nbits - 1))
    ma = np.where(ia < 0, lo - ia, ia)
    mb = np.where(ib < 0, lo - ib, ib)
    d = np.abs(np.asarray(ma - mb, dtype=object if nbits == 64 else np.int64))
    both_nan = np.isnan(a) & np.isnan(b)
    one_nan = np.isnan(a) ^ np.isnan(b)
    d = np.where(both_nan, 0, d)
    return np.where(one_nan, np.iinfo(np.int64).max, d).astype(np.float64)


def _samples(lo: float, hi: float, n: int, dtype, rng) -> np.ndarray:
    """n values in [lo, hi]: log-uniform magnitudes on each side of 0, plus the interval edges."""
    parts = []
    for sign, a, b in ((1, max(lo, 0.0), hi), (-1, max(-hi, 0.0), -lo)):
        if b <= 0 or b <= a:
            continue
        a = max(a, 1e-30 if dtype == np.float32 else 1e-300)
        mags = np.exp(rng.uniform(np.log(a), np.log(b), n // 2))
        parts.append(sign * mags)
    edge = [v for v in (lo, hi, 0.0, 1.0, -1.0, 0.5) if lo <= v <= hi]
    x = np.concatenate(parts + [np.array(edge)]).astype(dtype)
    return x[np.isfinite(x)]


def _mixed(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / (eps * max(1, |b|)): ulps relative to the result, or to 1 near a zero of the
    function (where any absolute error is many ulps of the tiny result)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ok = np.isfinite(a64) & np.isfinite(b64)
    if not ok.any():
        return 0.0
    err = np.abs(a64[ok] - b64[ok]) / (np.finfo(a.dtype).eps * np.maximum(1.0, np.abs(b64[ok])))
    return float(err.max())


def _reference(name: str, args: list[np.ndarray]) -> np.ndarray:
    """The correctly rounded float32 result: the op in long double (where it is wider than
    float64 and the op has a long double loop: not CPU-dispatched, the same on every x86-64
    host) or else in float64, rounded once."""
    from refsim.interpreter.accuracy import REFERENCE_F64

    wide = reference_f64(name, args)
    if wide is not None:
        return wide.astype(np.float32)
    with np.errstate(all="ignore"):
        return np.asarray(REFERENCE_F64[name](*[a.astype(np.float64) for a in args])).astype(np.float32)


def long_double_is_wide() -> bool:
    """Whether np.longdouble carries at least 64 significand bits (x86-64 Linux: the x87
    80-bit format; aarch64 Linux: IEEE quad), enough to round a float64 reference from it."""
    return np.finfo(np.longdouble).nmant >= 63


def reference_f64(name: str, args: list[np.ndarray]) -> np.ndarray | None:
    """The op in np.longdouble (not rounded: float64 results are measured against it in
    fractions of an ulp); None where long double is no wider than float64 or the op has no
    long double loop (SciPy's special functions)."""
    from refsim.interpreter.accuracy import REFERENCE_F64

    if not long_double_is_wide():
        return None
    wide = [a.astype(np.longdouble) for a in args]
    with np.errstate(all="ignore"):
        try:
            out = np.asarray(REFERENCE_F64[name](*wide))
        except TypeError:
            return None
    return out if out.dtype == np.longdouble else None


def ulp_error(a: np.ndarray, ref: np.ndarray) -> float:
    """max |a - ref| in ulps of ref's float64 neighbourhood (fractional: a correctly rounded
    result is within 0.5), ref a wider (long double) array; finite normal results only."""
    ref64 = ref.astype(np.float64)
    ok = np.isfinite(ref64) & np.isfinite(a) & (np.abs(ref64) >= np.finfo(np.float64).tiny)
    if not ok.any():
        return 0.0
    ulp = np.spacing(np.abs(ref64[ok])).astype(np.longdouble)
    return float(np.max(np.abs(a[ok].astype(np.longdouble) - ref[ok]) / ulp))


def _refsim(name: str, args: list[np.ndarray]) -> np.ndarray:
    import refsim
    from refsim.interpreter.accuracy import lax_function

    with np.errstate(all="ignore"):
        return np.asarray(refsim.jit(lax_function(name))(*args))


def _xla(name: str, args: list[np.ndarray]) -> np.ndarray:
    import jax

    from refsim.interpreter.accuracy import lax_function

    return np.asarray(jax.jit(lax_function(name))(*args))


def measure(samples: int = 200_000, seed: int = 0, dtypes=(np.float32, np.float64), ops=None) -> list[dict]:
    """One row per (op, dtype). float64 turns on jax_enable_x64 for the rest of the process."""
    import jax

    from refsim.interpreter.accuracy import OPS

    if np.float64 in dtypes:
        jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(seed)
    rows = []
    for name, spec in OPS.items():
        if ops is not None and name not in ops:
            continue
        for dtype in dtypes:
            args = [_samples(lo, hi, samples, dtype, rng) for lo, hi in spec.domains]
            n = min(len(a) for a in args)
            args = [a[:n] for a in args]
            ours, theirs = _refsim(name, args), _xla(name, args)
            tiny = np.finfo(dtype).tiny
            # Results below the smallest normal: XLA:CPU flushes them to zero (FTZ), refsim
            # (NumPy) keeps the subnormal; counted apart, not in the ulp figures.
            sub = (np.abs(ours) < tiny) | (np.abs(theirs) < tiny)
            row = {"bench": "accuracy", "op": name, "dtype": np.dtype(dtype).name, "samples": n,
                   "refsim_vs_xla_ulp": float(_ulp_distance(ours[~sub], theirs[~sub]).max()),
                   "refsim_vs_xla_mixed": _mixed(ours[~sub], theirs[~sub]),
                   "subnormal_disagreements": int(np.sum(sub & (ours != theirs)))}
            if dtype == np.float32:
                ref = _reference(name, args)
                fin = np.isfinite(ref) & ~sub & (np.abs(ref) >= tiny)
                row["refsim_vs_correct_ulp"] = float(_ulp_distance(ours[fin], ref[fin]).max())
                row["xla_vs_correct_ulp"] = float(_ulp_distance(theirs[fin], ref[fin]).max())
                row["xla_vs_correct_mixed"] = _mixed(theirs[fin], ref[fin])
            else:
                ref = reference_f64(name, args)
                if ref is not None:
                    row["refsim_vs_correct_ulp"] = ulp_error(ours[~sub], ref[~sub])
                    row["xla_vs_correct_ulp"] = ulp_error(theirs[~sub], ref[~sub])
            rows.append(row)
    return rows


def refsim_rule(name: str, args: list[np.ndarray]) -> np.ndarray:
    """refsim's rule for primitive `name` applied to plain arrays (no JAX tracing, so float64
    operands stay float64 without jax_enable_x64)."""
    from refsim.interpreter.registry import RULES, load_rules

    load_rules()
    with np.errstate(all="ignore"):
        return np.asarray(RULES[name](types.SimpleNamespace(nm=0), *args))


def measure_f64_exact(samples: int = 2_000_000, seed: int = 0, ops=None) -> list[dict]:
    """refsim float64 against the long double result, on more samples than `measure` (no XLA
    involved): one row per op that has a long double reference; [] where long double is no
    wider than float64."""
    from refsim.interpreter.accuracy import OPS

    rng = np.random.default_rng(seed)
    rows = []
    for name, spec in OPS.items():
        if ops is not None and name not in ops:
            continue
        args = [_samples(lo, hi, samples, np.float64, rng) for lo, hi in spec.domains]
        n = min(len(a) for a in args)
        args = [a[:n] for a in args]
        ref = reference_f64(name, args)
        if ref is not None:
            rows.append({"bench": "accuracy_f64", "op": name, "dtype": "float64", "samples": n,
                         "refsim_vs_correct_ulp": ulp_error(refsim_rule(name, args), ref)})
    return rows


def main(argv=None) -> int:
    from conformance import validation

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=validation.option("--samples", integer=True, low=1), default=200_000)
    p.add_argument("--f64-samples", type=validation.option("--f64-samples", integer=True, low=1), default=2_000_000,
                   help="samples for refsim float64 against long double alone (no XLA)")
    p.add_argument("--json", default=None, help="append the JSON lines to this file")
    a = p.parse_args(argv)
    rows = measure(a.samples)
    exact = measure_f64_exact(a.f64_samples)
    print(f"{'op':<12}{'dtype':<9}{'refsim~correct':>15}{'xla~correct':>12}{'(mixed)':>9}"
          f"{'refsim~xla':>11}{'(mixed)':>9}{'ftz':>6}")
    for r in rows:
        prec = ".0f" if r["dtype"] == "float32" else ".2f"  # float64: fractional, against long double
        print(f"{r['op']:<12}{r['dtype']:<9}{r.get('refsim_vs_correct_ulp', float('nan')):>15{prec}}"
              f"{r.get('xla_vs_correct_ulp', float('nan')):>12{prec}}{r.get('xla_vs_correct_mixed', float('nan')):>9.1f}"
              f"{r['refsim_vs_xla_ulp']:>11.0f}{r['refsim_vs_xla_mixed']:>9.1f}{r['subnormal_disagreements']:>6}")
    for r in exact:
        print(f"{r['op']:<12}float64 refsim~exact {r['refsim_vs_correct_ulp']:.2f} ulp ({r['samples']} samples)")
    sink = open(a.json, "a") if a.json else None
    for r in rows + exact:
        line = json.dumps(r)
        print(line)
        if sink:
            sink.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
