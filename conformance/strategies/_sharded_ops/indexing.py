"""Gathers and scatters (numpy-style indexing, ``.at[...]`` in every out-of-bounds mode),
dynamic_slice / dynamic_update_slice and strided slices."""
from __future__ import annotations

import math

from conformance.strategies._sharded_graph import BOOL, F32, I32, Builder, Val, int_result, model_of, sum_result
from conformance.strategies._sharded_ops.common import (
    const_model, draw_out_sharding, fits, jnp_dtype, literal, max_frac, numeric, power_fits, result_model,
)


def _indices(b: Builder, n: int, count: int, *, oob: bool) -> list:
    lo, hi = (-n - 2, n + 1) if oob else (-n, n - 1)
    return [b.draw_int(lo, hi) for _ in range(count)]


def _norm(i: int, n: int) -> int:
    return i + n if i < 0 else i


def _idx_text(idx) -> str:
    return f"jnp.array({list(idx)!r}, dtype=jnp.int32)"


def _gather(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    kind = b.choice(["take0", "take_axis", "index2d", "pairs", "mixed_slice"])
    main = a
    a = b.replicated(a)
    n0 = a.shape[0]
    m = b.draw_int(1, 4)
    if kind == "take0":
        expr, shape = f"{a.name}[{_idx_text(_indices(b, n0, m, oob=False))}]", (m,) + a.shape[1:]
    elif kind == "take_axis" and a.ndim >= 2:
        d = b.draw_int(1, a.ndim - 1)
        idx = _idx_text(_indices(b, a.shape[d], m, oob=False))
        expr = f"{a.name}[{', '.join([':'] * d + [idx])}]"
        shape = a.shape[:d] + (m,) + a.shape[d + 1:]
    elif kind == "index2d":
        m2 = b.draw_int(1, 3)
        vals = _indices(b, n0, m * m2, oob=False)
        expr = f"{a.name}[{_idx_text(vals)}.reshape({m}, {m2})]"
        shape = (m, m2) + a.shape[1:]
    elif kind == "pairs" and a.ndim >= 2:
        i0, i1 = _indices(b, n0, m, oob=False), _indices(b, a.shape[1], m, oob=False)
        expr, shape = f"{a.name}[{_idx_text(i0)}, {_idx_text(i1)}]", (m,) + a.shape[2:]
    elif kind == "mixed_slice" and a.ndim >= 2:
        n1 = a.shape[1]
        st_, sp = b.draw_int(0, n1 - 1), b.draw_int(1, 2)
        expr = f"{a.name}[{_idx_text(_indices(b, n0, m, oob=False))}, {st_}::{sp}]"
        shape = (m, len(range(st_, n1, sp))) + a.shape[2:]
    else:
        expr, shape = f"{a.name}[{_idx_text(_indices(b, n0, m, oob=False))}]", (m,) + a.shape[1:]
    if not fits(b, shape):
        return False
    b.emit("gather", expr, shape, a.dtype, main=main, **model_of(a))
    return True


def _at_get(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    mode = b.choice(["fill", "clip", "promise_in_bounds"])
    d = b.draw_int(0, a.ndim - 1)
    m = b.draw_int(1, 4)
    idx = _indices(b, a.shape[d], m, oob=mode != "promise_in_bounds")
    main = a
    a = b.replicated(a)
    where = ", ".join([":"] * d + [_idx_text(idx)])
    extra = ""
    model = model_of(a)
    if mode == "fill":
        fill = b.choice([None, -1, 7])
        oob_any = any(not (-a.shape[d] <= i < a.shape[d]) for i in idx)
        if fill is not None:
            extra = f", fill_value={literal(fill, a.dtype)}"
            if oob_any:
                model = dict(model, lo=min(model["lo"], fill), hi=max(model["hi"], fill))
        elif oob_any:
            # the default fill: NaN for floats, the dtype's extreme for ints, True for bools
            model = dict(model, lo=-math.inf, hi=math.inf) if a.dtype == F32 else (
                int_result(-2.0 ** 31, 2.0 ** 31) if a.dtype == I32 else model)
            if a.dtype == F32:
                model = dict(lo=-math.inf, hi=math.inf, frac=a.frac, err=a.err)
    shape = a.shape[:d] + (m,) + a.shape[d + 1:]
    out_kw, spec = draw_out_sharding(b, shape)
    b.emit("at_get", f"{a.name}.at[{where}].get(mode={mode!r}{extra}{out_kw})", shape, a.dtype, main=main,
           spec=spec, **model)
    return True


def _take_along_axis(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    m = b.draw_int(1, 4)
    shape = a.shape[:d] + (m,) + a.shape[d + 1:]
    if not fits(b, shape):
        return False
    vals = _indices(b, a.shape[d], math.prod(shape), oob=False)
    main = a
    a = b.replicated(a)
    b.emit("take_along_axis", f"jnp.take_along_axis({a.name}, {_idx_text(vals)}.reshape({shape!r}), axis={d})",
           shape, a.dtype, main=main, **model_of(a))
    return True


def _scatter(kind: str):
    def op(b: Builder) -> bool:
        pred = (lambda v: v.ndim >= 1 and not v.manual and v.dtype in (F32, I32)) if kind != "set" else \
            (lambda v: v.ndim >= 1 and not v.manual)
        if kind in ("add", "mul"):
            pred = (lambda v: v.ndim >= 1 and numeric(v))
        a = b.pick(pred)
        if a is None:
            return False
        d = b.draw_int(0, a.ndim - 1) if b.boolean() else 0
        n = a.shape[d]
        mode = b.choice(["drop", "clip", "promise_in_bounds"])
        m = b.draw_int(1, 4)
        idx = _indices(b, n, m, oob=mode != "promise_in_bounds")
        targets = [min(max(_norm(i, n), 0), n - 1) if mode == "clip" else _norm(i, n) for i in idx]
        live = [t for t in targets if 0 <= t < n]
        if kind == "set" and len(set(live)) != len(live):
            # duplicate targets leave which update wins unspecified: draw distinct ones
            idx = sorted(set(idx), key=idx.index)
            seen, kept = set(), []
            for i in idx:
                t = min(max(_norm(i, n), 0), n - 1) if mode == "clip" else _norm(i, n)
                if 0 <= t < n and t in seen:
                    continue
                seen.add(t)
                kept.append(i)
            idx, m = kept, len(kept)
            targets = [min(max(_norm(i, n), 0), n - 1) if mode == "clip" else _norm(i, n) for i in idx]
            live = [t for t in targets if 0 <= t < n]
        unique = bool(live) and len(set(targets)) == len(targets) and all(0 <= t < n for t in targets)
        if kind == "mul" and b.backward and not unique:
            return False   # JAX differentiates scatter_mul only with unique_indices=True
        ushape = a.shape[:d] + (m,) + a.shape[d + 1:]
        upd = b.pick(lambda v: v.shape == ushape and v.dtype == a.dtype and not v.manual and v.fine)
        if upd is None:
            upd = b.pick(lambda v: v.shape == () and v.dtype == a.dtype and not v.manual and v.fine)
        c = b.choice([2, -1, 3])
        u = const_model(literal(c, a.dtype), a.dtype) if upd is None else upd
        utext = literal(c, a.dtype) if upd is None else upd.name
        main = a
        a = b.replicated(a)
        if upd is not None:
            upd = b.replicated(upd)
            utext = upd.name
        flags = ""
        if unique and (b.boolean() or (kind == "mul" and b.backward)):
            flags += ", unique_indices=True"
        if idx == sorted(idx) and all(i >= 0 for i in idx) and b.boolean():
            flags += ", indices_are_sorted=True"
        where = ", ".join([":"] * d + [_idx_text(idx)])
        dup = max([live.count(t) for t in live] or [1])
        lo, hi = min(a.lo, u.lo), max(a.hi, u.hi)
        if kind == "set":
            model = dict(lo=lo, hi=hi, frac=max_frac(a, u), err=max(a.err, u.err))
        elif kind == "add":
            s = sum_result(Val("s", (), a.dtype, lo, hi, max_frac(a, u), max(a.err, u.err)), dup + 1)
            model = s
        elif kind == "mul":
            if not power_fits(max(u.mag, 1.0), dup) or not power_fits(max(a.mag, 1.0) * max(u.mag, 1.0) ** dup, 1):
                return False
            hi_m = max(a.mag, 1.0) * max(u.mag, 1.0) ** dup
            frac = None if a.frac is None or u.frac is None else a.frac + dup * u.frac
            model = result_model(a.dtype, -hi_m, hi_m, frac, (dup + 1) * (a.err + u.err) * hi_m, rounds=frac is None)
        else:
            model = dict(lo=lo, hi=hi, frac=max_frac(a, u), err=max(a.err, u.err))
        if a.dtype == BOOL:
            model = dict(lo=0.0, hi=1.0)
        b.emit(f"scatter_{kind}", f"{a.name}.at[{where}].{kind}({utext}, mode={mode!r}{flags})", a.shape, a.dtype,
               main=main, **model)
        return True
    return op


def _start(b: Builder, n: int, size: int) -> str:
    """A start index: a literal (out of range ones are clamped), or one computed from data."""
    ints = [v for v in b.pool if v.dtype == I32 and v.exact and not v.manual and v.size >= 1 and v.mag < 2 ** 30]
    if ints and b.draw_int(0, 3) == 0:
        v = b.replicated(b.choice(ints))
        return f"jnp.clip({v.name}.ravel()[0], -2, {n + 1})"
    return str(b.draw_int(-2, n - size + 2))


def _dynamic_slice(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    sizes = tuple(b.draw_int(1, n) for n in a.shape)
    starts = [_start(b, n, s) for n, s in zip(a.shape, sizes)]
    main = a
    a = b.replicated(a)
    b.emit("dynamic_slice", f"jax.lax.dynamic_slice({a.name}, ({', '.join(starts)},), {sizes!r})", sizes, a.dtype,
           main=main, **model_of(a))
    return True


def _dynamic_update_slice(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    u = b.pick(lambda v: v is not a and v.dtype == a.dtype and v.ndim == a.ndim and not v.manual
               and all(x <= y for x, y in zip(v.shape, a.shape)))
    main = a
    if u is None:
        sizes = tuple(b.draw_int(1, n) for n in a.shape)
        c = b.choice([5, -2])
        u_text = f"jnp.full({sizes!r}, {literal(c, a.dtype)}, {jnp_dtype(a.dtype)})"
        u_model = const_model(literal(c, a.dtype), a.dtype)
    else:
        sizes = u.shape
        u = b.replicated(u)
        u_text, u_model = u.name, u
    a = b.replicated(a)
    starts = [_start(b, n, s) for n, s in zip(a.shape, sizes)]
    model = dict(lo=min(a.lo, u_model.lo), hi=max(a.hi, u_model.hi), frac=max_frac(a, u_model),
                 err=max(a.err, u_model.err))
    if a.dtype == BOOL:
        model = dict(lo=0.0, hi=1.0)
    b.emit("dynamic_update_slice", f"jax.lax.dynamic_update_slice({a.name}, {u_text}, ({', '.join(starts)},))",
           a.shape, a.dtype, main=main, **model)
    return True


def _slice(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    parts, shape = [], []
    for n in a.shape:
        step = b.choice([1, 1, 2, 3, -1, -2])
        start = b.draw_int(-n, n - 1) if b.boolean() else None
        stop = b.draw_int(-n, n) if b.boolean() else None
        k = len(range(*slice(start, stop, step).indices(n)))
        if k < 1:
            start, stop, k = None, None, len(range(*slice(None, None, step).indices(n)))
        parts.append(f"{'' if start is None else start}:{'' if stop is None else stop}:{step}")
        shape.append(k)
    main = a
    a = b.replicated(a)
    if b.boolean() and all(p.split(":")[2] in ("1", "2", "3") for p in parts):
        # lax.slice: non-negative starts and limits with strides
        lims = []
        for p, n in zip(parts, a.shape):
            s0, s1, st_ = p.split(":")
            st_ = int(st_)
            lo, hi, _ = slice(int(s0) if s0 else None, int(s1) if s1 else None, st_).indices(n)
            lims.append((lo, max(hi, lo + 1), st_))
        shape = [len(range(lo, hi, st_)) for lo, hi, st_ in lims]
        expr = (f"jax.lax.slice({a.name}, {tuple(x[0] for x in lims)!r}, {tuple(x[1] for x in lims)!r}, "
                f"{tuple(x[2] for x in lims)!r})")
    else:
        expr = f"{a.name}[{', '.join(parts)}]"
    b.emit("slice", expr, tuple(shape), a.dtype, main=main, **model_of(a))
    return True


#: This family's ops, by the name programs and the coverage table use.
OPS = {
    "gather": _gather, "at_get": _at_get, "take_along_axis": _take_along_axis,
    "scatter_set": _scatter("set"), "scatter_add": _scatter("add"), "scatter_mul": _scatter("mul"),
    "scatter_min": _scatter("min"), "scatter_max": _scatter("max"),
    "dynamic_slice": _dynamic_slice, "dynamic_update_slice": _dynamic_update_slice, "slice": _slice,
}
