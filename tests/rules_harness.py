"""Test helpers for the NumPy primitive rules: trace with JAX, evaluate with refsim, compare.

`refsim_eval(fn, *args, nm=0)` traces `fn` with jax.make_jaxpr on the (local) args and
evaluates the jaxpr with refsim's interpreter. `stacked_matches_loop` checks the
mesh-dims convention: evaluating once on stacked per-device values equals evaluating
each device's values separately (nm=0).
"""
from __future__ import annotations

import itertools

import jax
import ml_dtypes
import numpy as np

import refsim.interpreter.rules  # noqa: F401  (registers the rules)
from refsim.compat import prng_impl_of
from refsim.interpreter.core import eval_closed_jaxpr
from refsim.interpreter.registry import Context
from refsim.interpreter.rules.random import keys_from_jax, keys_to_jax


def _to_refsim(a):
    if hasattr(a, "dtype") and prng_impl_of(a.dtype) is not None:
        return keys_from_jax(a)
    return np.asarray(a)


def _from_refsim(a):
    if a.dtype.names:
        return np.asarray(jax.random.key_data(keys_to_jax(a)))
    return a


def trace(fn, *args):
    """The jaxpr of `fn` with jnp's inner jit calls inlined (these tests cover primitive
    rules only; the jit/pjit rule is tested with control flow)."""
    with jax.disable_jit():
        return jax.make_jaxpr(fn)(*args)


def refsim_eval(fn, *args, nm: int = 0, stacked=None):
    """Outputs of `fn` (a list) from refsim; `stacked` overrides the stacked input values."""
    closed = trace(fn, *args)
    if stacked is None:
        stacked = [_to_refsim(a).reshape((1,) * nm + np.shape(a)) for a in args]
    outs = eval_closed_jaxpr(closed, *stacked, ctx=Context(nm=nm))
    return [_from_refsim(np.asarray(o)) for o in outs]


def jax_eval(fn, *args):
    """Outputs of `fn` (a list) from jax.jit on CPU, as NumPy arrays."""
    out = jax.jit(fn)(*args)
    outs = out if isinstance(out, (tuple, list)) else [out]
    res = []
    for o in outs:
        if prng_impl_of(o.dtype) is not None:
            o = jax.random.key_data(o)
        res.append(np.asarray(o))
    return res


def _fmt(call, i, exp, got):
    return f"{call}: output {i}: expected {exp!r} ({exp.dtype}), got {got!r} ({got.dtype})"


def assert_exact(expected, got, call=""):
    """Same dtype, shape and values (NaN equals NaN); floats compared bit-exact except NaN payloads."""
    assert len(expected) == len(got), f"{call}: {len(expected)} outputs expected, got {len(got)}"
    for i, (e, g) in enumerate(zip(expected, got)):
        e, g = np.asarray(e), np.asarray(g)
        assert e.dtype == g.dtype and e.shape == g.shape, _fmt(call, i, e, g)
        if np.issubdtype(e.dtype, np.inexact) or e.dtype in (np.dtype(ml_dtypes.bfloat16),):
            ef, gf = e.astype(np.complex128 if np.iscomplexobj(e) else np.float64), \
                g.astype(np.complex128 if np.iscomplexobj(g) else np.float64)
            same = (ef == gf) | (np.isnan(ef) & np.isnan(gf))
            same &= (np.signbit(ef.real) == np.signbit(gf.real)) | np.isnan(ef.real)
            assert same.all(), _fmt(call, i, e, g)
        else:
            np.testing.assert_array_equal(g, e, err_msg=_fmt(call, i, e, g))


def assert_close(expected, got, ulps=4, call=""):
    """Same dtype and shape; values within `ulps` units of the dtype's epsilon (relative),
    with the same tolerance as an absolute floor near zero; NaN where NaN; infs equal."""
    for i, (e, g) in enumerate(zip(expected, got)):
        e, g = np.asarray(e), np.asarray(g)
        assert e.dtype == g.dtype and e.shape == g.shape, _fmt(call, i, e, g)
        if not (np.issubdtype(e.dtype, np.inexact) or e.dtype == np.dtype(ml_dtypes.bfloat16)):
            np.testing.assert_array_equal(g, e, err_msg=_fmt(call, i, e, g))
            continue
        eps = float(ml_dtypes.finfo(e.dtype).eps) if e.dtype.itemsize <= 2 and not np.iscomplexobj(e) \
            else float(np.finfo(e.dtype).eps)
        ct = np.complex128 if np.iscomplexobj(e) else np.float64
        ef, gf = e.astype(ct), g.astype(ct)
        both_nan = np.isnan(ef) & np.isnan(gf)
        inf_eq = np.isinf(ef) & (ef == gf)
        tol = ulps * eps * np.maximum(np.abs(ef), 1.0)
        ok = both_nan | inf_eq | (np.abs(ef - gf) <= tol)
        assert ok.all(), _fmt(call, i, e[~ok], g[~ok])


def mesh_variants(m, n_args, rng):
    """Per-arg mesh-dim patterns: each dim the mesh size or 1, at least one arg varying."""
    choices = []
    for _ in range(n_args):
        choices.append(tuple(n if rng.random() < 0.6 else 1 for n in m))
    if all(c == (1,) * len(m) for c in choices):
        choices[0] = tuple(m)
    return choices


def stacked_matches_loop(fn, per_device_args, m, call="", exact=True):
    """Evaluate once on stacked values (nm = len(m)) and per device (nm = 0); compare.

    `per_device_args[i]` is a function (device index tuple -> the arg's local value);
    invariant args (mesh dims of size 1) are given as plain arrays."""
    nm = len(m)
    rng = np.random.default_rng(0)
    patterns = mesh_variants(m, len(per_device_args), rng)
    stacked, proto = [], []
    for a, pat in zip(per_device_args, patterns):
        if callable(a):
            vals = np.empty(pat, dtype=object)
            for pos in itertools.product(*(range(n) for n in pat)):
                vals[pos] = np.asarray(a(pos))
            arr = np.stack([v for v in vals.reshape(-1)]).reshape(pat + vals.reshape(-1)[0].shape)
            stacked.append(arr)
            proto.append(vals.reshape(-1)[0])
        else:
            arr = np.asarray(a)
            stacked.append(arr.reshape((1,) * nm + arr.shape))
            proto.append(arr)
    closed = trace(fn, *(keys_to_jax(p) if p.dtype.names else p for p in proto))
    outs = eval_closed_jaxpr(closed, *stacked, ctx=Context(nm=nm))
    for pos in itertools.product(*(range(n) for n in m)):
        local = [s[tuple(p if s.shape[k] > 1 else 0 for k, p in enumerate(pos))] for s in stacked]
        want = eval_closed_jaxpr(closed, *local, ctx=Context(nm=0))
        got = [o[tuple(p if o.shape[k] > 1 else 0 for k, p in enumerate(pos))] for o in outs]
        for o in outs:
            assert o.ndim >= nm
        (assert_exact if exact else assert_close)(want, got, call=f"{call} device {pos}")
    return outs
