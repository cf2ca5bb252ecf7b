"""Reductions and arg-reductions, logsumexp / softmax, cumulative ops and reduce_window."""
from __future__ import annotations

import math

from conformance.strategies._sharded_graph import (
    BOOL, F32, I32, Builder, Val, float_result, int_result, model_of, sum_result, ulp,
)
from conformance.strategies._sharded_ops.common import (
    exact_numeric, fits, floating, numeric, power_fits, window_out_size,
)


def _axes(b: Builder, v: Val, *, single: bool = False):
    if single:
        return (b.draw_int(0, v.ndim - 1),)
    perm = b.draw_permutation(v.ndim)
    return tuple(sorted(perm[: b.draw_int(1, v.ndim)]))


def _reduced_shape(v: Val, axes, keepdims: bool) -> tuple:
    return tuple((1 if keepdims else None) if d in axes else s for d, s in enumerate(v.shape) if keepdims or d not in axes)


def _reduction(name: str):
    def op(b: Builder) -> bool:
        pred = {"sum": numeric, "mean": floating, "prod": numeric, "reduce_max": numeric, "reduce_min": numeric,
                "any_all": lambda v: v.dtype == BOOL and not v.manual}[name]
        a = b.pick(lambda v: pred(v) and v.ndim >= 1)
        if a is None:
            return False
        axes = _axes(b, a)
        keep = b.boolean()
        shape = _reduced_shape(a, axes, keep)
        n = math.prod(a.shape[d] for d in axes)
        ax = axes[0] if len(axes) == 1 else axes
        main = a
        a = b.replicated(a)
        kd = ", keepdims=True" if keep else ""
        if name == "sum":
            expr, m = f"jnp.sum({a.name}, axis={ax!r}{kd})", sum_result(a, n)
        elif name == "mean":
            s = sum_result(a, n)
            exact = s["err"] == 0 and n & (n - 1) == 0
            frac = None if s["frac"] is None or not exact else s["frac"] + int(math.log2(n))
            m = float_result(a.lo, a.hi, frac, s["err"] / n, rounds=not exact)
            expr = f"jnp.mean({a.name}, axis={ax!r}{kd})"
        elif name == "prod":
            if not power_fits(a.mag, n):
                return False
            hi = a.mag ** n
            if a.dtype == I32:
                m = int_result(-hi, hi)
            else:
                frac = None if a.frac is None else a.frac * n
                m = float_result(-hi, hi, frac, n * a.err * a.mag ** (n - 1) + n * ulp(hi) * bool(
                    frac is None or hi * 2.0 ** frac > 2.0 ** 24))
            expr = f"jnp.prod({a.name}, axis={ax!r}{kd})"
        elif name in ("reduce_max", "reduce_min"):
            fn = "jnp.max" if name == "reduce_max" else "jnp.min"
            expr, m = f"{fn}({a.name}, axis={ax!r}{kd})", model_of(a)
        else:
            fn = b.choice(["jnp.any", "jnp.all"])
            expr, m = f"{fn}({a.name}, axis={ax!r}{kd})", dict(lo=0.0, hi=1.0)
        b.emit(name, expr, shape, BOOL if name == "any_all" else a.dtype, main=main, **m)
        return True
    return op


def _argminmax(name: str):
    def op(b: Builder) -> bool:
        a = b.pick(lambda v: exact_numeric(v) and v.ndim >= 1)
        if a is None:
            return False
        d = b.draw_int(0, a.ndim - 1)
        keep = b.boolean()
        main = a
        a = b.replicated(a)
        shape = _reduced_shape(a, (d,), keep)
        kd = ", keepdims=True" if keep else ""
        b.emit(name, f"jnp.{name}({a.name}, axis={d}{kd})", shape, I32, main=main,
               **int_result(0, a.shape[d] - 1))
        return True
    return op


def _logsumexp(b: Builder) -> bool:
    a = b.pick(lambda v: floating(v) and v.ndim >= 1 and v.mag <= 64)
    if a is None:
        return False
    axes = _axes(b, a)
    n = math.prod(a.shape[d] for d in axes)
    main = a
    a = b.replicated(a)
    shape = _reduced_shape(a, axes, False)
    hi = a.hi + math.log(n)
    err = a.err + (n + 8) * ulp(max(abs(a.lo), abs(hi), 1.0)) * 4
    ax = axes[0] if len(axes) == 1 else axes
    b.emit("logsumexp", f"jax.nn.logsumexp({a.name}, axis={ax!r})", shape, F32, main=main,
           lo=a.lo, hi=hi, frac=None, err=err)
    return True


def _softmax(b: Builder) -> bool:
    a = b.pick(lambda v: floating(v) and v.ndim >= 1 and v.mag <= 64)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    main = a
    a = b.replicated(a)
    n = a.shape[d]
    b.emit("softmax", f"jax.nn.softmax({a.name}, axis={d})", a.shape, F32, main=main,
           lo=0.0, hi=1.0, frac=None, err=2 * a.err + (n + 8) * 4 * ulp(1.0))
    return True


# -- cumulative and windowed ------------------------------------------------------------------------
def _cumulative(name: str):
    def op(b: Builder) -> bool:
        pred = floating if name == "cumlogsumexp" else numeric
        a = b.pick(lambda v: pred(v) and v.ndim >= 1 and (name != "cumlogsumexp" or v.mag <= 64))
        if a is None:
            return False
        d = b.draw_int(0, a.ndim - 1)
        n = a.shape[d]
        main = a
        a = b.replicated(a)
        rev = b.boolean()
        if name == "cumsum":
            m = sum_result(a, n)
        elif name == "cumprod":
            if not power_fits(a.mag, n):
                return False
            hi = max(a.mag ** n, a.mag)
            frac = None if a.frac is None else a.frac * n
            m = (int_result(-hi, hi) if a.dtype == I32 else
                 float_result(-hi, hi, frac, n * a.err * max(a.mag, 1.0) ** (n - 1)
                              + n * ulp(hi) * bool(frac is None or hi * 2.0 ** frac > 2.0 ** 24)))
        elif name == "cumlogsumexp":
            hi = a.hi + math.log(n)
            m = dict(lo=a.lo, hi=hi, frac=None, err=a.err + (n + 8) * 4 * ulp(max(abs(a.lo), abs(hi), 1.0)))
        else:
            m = model_of(a)
        if b.boolean() or name == "cumlogsumexp":
            expr = f"jax.lax.{name}({a.name}, axis={d}, reverse={rev})"
        else:
            expr = f"jnp.{name}({a.name}, axis={d})" if name in ("cumsum", "cumprod") else \
                f"jax.lax.{name}({a.name}, axis={d}, reverse={rev})"
        b.emit(name, expr, a.shape, a.dtype, main=main, spec=None, **m)
        return True
    return op



def _reduce_window(b: Builder) -> bool:
    a = b.pick(lambda v: numeric(v) and v.ndim >= 1)
    if a is None:
        return False
    # init is always the monoid's identity: XLA may assume it is (JAX documents the same for
    # lax.reduce), so another init (StableHLO would put it in the holes of a base-dilated window)
    # draws undefined behaviour, and JAX has no reverse-mode rule for it
    kind = b.choice(["add", "max", "min"])
    dims, strides, pads, bdil, wdil, shape = [], [], [], [], [], []
    for n in a.shape:
        w = b.draw_int(1, min(3, n + 1))
        s = b.draw_int(1, 2)
        lo, hi = b.draw_int(0, 1), b.draw_int(0, 1)
        bd = 1 if b.backward else b.choice([1, 1, 2])
        # JAX's max / min pooling VJP (select_and_gather) takes no window dilation
        wd = 1 if b.backward and kind in ("max", "min") else b.choice([1, 1, 2])
        out = window_out_size(n, w, s, lo, hi, bd, wd)
        if out < 1:
            w, s, lo, hi, bd, wd, out = 1, 1, 0, 0, 1, 1, n
        dims.append(w)
        strides.append(s)
        pads.append((lo, hi))
        bdil.append(bd)
        wdil.append(wd)
        shape.append(out)
    if not fits(b, tuple(shape)):
        return False
    main = a
    a = b.replicated(a)
    k = math.prod(dims)
    # init as a Python scalar: JAX recognises the monoid (reduce_window_sum / _max / _min, which
    # have derivatives) only for a concrete identity
    flt = a.dtype == F32
    if kind == "add":
        init = "0.0" if flt else "0"
        m = sum_result(a, k)
        fn = "jax.lax.add"
    else:
        init = ("-np.inf" if kind == "max" else "np.inf") if flt else \
            ("-2147483648" if kind == "max" else "2147483647")
        m = model_of(a)
        if any(lo or hi for lo, hi in pads) or any(d > 1 for d in bdil):
            # windows may hold only padding: the init value (±inf, or int32's extremes)
            m = dict(lo=-math.inf, hi=math.inf, frac=a.frac, err=a.err) if flt else int_result(-2.0 ** 31, 2.0 ** 31)
        fn = f"jax.lax.{kind}"
    expr = (f"jax.lax.reduce_window({a.name}, {init}, {fn}, {tuple(dims)!r}, "
            f"{tuple(strides)!r}, {tuple(pads)!r}, base_dilation={tuple(bdil)!r}, window_dilation={tuple(wdil)!r})")
    b.emit("reduce_window", expr, tuple(shape), a.dtype, main=main, **m)
    return True


#: This family's ops, by the name programs and the coverage table use.
OPS = {
    "sum": _reduction("sum"), "mean": _reduction("mean"), "prod": _reduction("prod"),
    "reduce_max": _reduction("reduce_max"), "reduce_min": _reduction("reduce_min"), "any_all": _reduction("any_all"),
    "argmax": _argminmax("argmax"), "argmin": _argminmax("argmin"), "logsumexp": _logsumexp, "softmax": _softmax,
    # cumulative and windowed
    "cumsum": _cumulative("cumsum"), "cumprod": _cumulative("cumprod"), "cummax": _cumulative("cummax"),
    "cummin": _cumulative("cummin"), "cumlogsumexp": _cumulative("cumlogsumexp"), "reduce_window": _reduce_window,
}
