"""Structural ops: pad (negative and interior), concatenate, reshape across sharded dimensions,
transpose, broadcast, squeeze / expand_dims, rev, iota, roll, tile / repeat, tril / triu."""
from __future__ import annotations

from conformance.strategies._sharded_graph import BOOL, Builder, model_of
from conformance.strategies._sharded_ops.common import (
    MAX_RANK, draw_out_sharding, fits, jnp_dtype, keep_spec, literal, numeric, result_model,
)


def _pad(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    cfg, shape = [], []
    for n in a.shape:
        interior = b.choice([0, 0, 1, 2])
        full = n + max(n - 1, 0) * interior
        lo = b.draw_int(-min(full - 1, 3), 3)
        hi = b.draw_int(-min(full - 1 + min(lo, 0), 3), 3)
        out = lo + hi + full
        if out < 1:
            lo, hi, out = 0, 0, full
        cfg.append((lo, hi, interior))
        shape.append(out)
    if not fits(b, tuple(shape)):
        return False
    c = b.choice([0, -3, 1])
    main = a
    a = b.replicated(a)
    model = model_of(a)
    model = dict(model, lo=min(model["lo"], c), hi=max(model["hi"], c))
    if a.dtype == BOOL:
        model = dict(lo=0.0, hi=1.0)
    # Named apart: a negative low edge with interior padding on a split dimension aborts the SPMD
    # partitioner (docs/found-bugs.md 23), so an xfails entry can list just these pads.
    op = "pad_neg_interior" if any(lo < 0 and interior > 0 for lo, _, interior in cfg) else "pad"
    b.emit(op, f"jax.lax.pad({a.name}, jnp.array({literal(c, a.dtype)}, {jnp_dtype(a.dtype)}), {cfg!r})", tuple(shape),
           a.dtype, main=main, **model)
    return True


def _jnp_pad(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    mode = b.choice(["constant", "edge", "reflect", "symmetric", "wrap"])
    widths, shape = [], []
    for n in a.shape:
        top = 2 if mode in ("constant", "edge", "wrap") else min(2, n - 1)
        lo, hi = b.draw_int(0, max(top, 0)), b.draw_int(0, max(top, 0))
        widths.append((lo, hi))
        shape.append(n + lo + hi)
    if not fits(b, tuple(shape)):
        return False
    main = a
    a = b.replicated(a)
    b.emit("jnp_pad", f"jnp.pad({a.name}, {widths!r}, mode={mode!r})", tuple(shape), a.dtype, main=main,
           **(dict(model_of(a), lo=min(a.lo, 0.0), hi=max(a.hi, 0.0)) if mode == "constant" else model_of(a)))
    return True


def _concatenate(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    same = lambda v: (v.dtype == a.dtype and v.ndim == a.ndim and not v.manual  # noqa: E731
                      and all(x == y for k, (x, y) in enumerate(zip(v.shape, a.shape)) if k != d))
    parts = [a]
    for _ in range(b.draw_int(1, 2)):
        parts.append(b.pick(same) or a)
    shape = a.shape[:d] + (sum(p.shape[d] for p in parts),) + a.shape[d + 1:]
    if not fits(b, shape):
        return False
    main = a
    parts = [b.replicated(p) for p in parts]
    model = dict(lo=min(p.lo for p in parts), hi=max(p.hi for p in parts),
                 frac=None if any(p.frac is None for p in parts) else max(p.frac for p in parts),
                 err=max(p.err for p in parts))
    if a.dtype == BOOL:
        model = dict(lo=0.0, hi=1.0)
    b.emit("concatenate", f"jnp.concatenate([{', '.join(p.name for p in parts)}], axis={d})", shape, a.dtype,
           main=main, **model)
    return True


def _divisors(n: int) -> list:
    return [k for k in range(2, n) if n % k == 0]


def _reshape(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual and v.size >= 1)
    if a is None:
        return False
    kinds = ["flatten"]
    if any(_divisors(n) for n in a.shape) and a.ndim < MAX_RANK:
        kinds.append("split")
    if a.ndim >= 2:
        kinds.append("merge")
    kind = b.choice(kinds)
    if kind == "split":
        d = b.choice([k for k, n in enumerate(a.shape) if _divisors(n)])
        f = b.choice(_divisors(a.shape[d]))
        shape = a.shape[:d] + (f, a.shape[d] // f) + a.shape[d + 1:]
    elif kind == "merge":
        d = b.draw_int(0, a.ndim - 2)
        shape = a.shape[:d] + (a.shape[d] * a.shape[d + 1],) + a.shape[d + 2:]
    else:
        shape = (a.size,)
    main = a
    a = b.replicated(a)
    out_kw, spec = draw_out_sharding(b, shape)
    if b.boolean() or out_kw:
        expr = f"jnp.reshape({a.name}, {shape!r}{out_kw})"
    else:
        expr = f"{a.name}.reshape({shape!r})"
    b.emit("reshape", expr, shape, a.dtype, main=main, spec=spec, **model_of(a))
    return True


def _transpose(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 2 and not v.manual)
    if a is None:
        return False
    perm = tuple(b.draw_permutation(a.ndim))
    spec = None if a.spec is None else tuple(a.spec[p] for p in perm)
    b.emit("transpose", f"jnp.transpose({a.name}, {perm!r})", tuple(a.shape[p] for p in perm), a.dtype, main=a,
           spec=spec, **model_of(a))
    return True


def _broadcast(b: Builder) -> bool:
    a = b.pick(lambda v: not v.manual and v.ndim < MAX_RANK)
    if a is None:
        return False
    main = a
    a = b.replicated(a)
    if b.boolean() or a.ndim == 0:
        k = b.draw_int(1, 3)
        shape = (k,) + a.shape
        expr = f"jnp.broadcast_to({a.name}, {shape!r})"
    else:
        # broadcast_in_dim: keep the operand's dims in order, insert one, grow size-1 dims
        pos = b.draw_int(0, a.ndim)
        k = b.draw_int(1, 3)
        out = list(a.shape)
        out.insert(pos, k)
        dims = tuple(i if i < pos else i + 1 for i in range(a.ndim))
        for i, n in enumerate(a.shape):
            if n == 1 and b.boolean():
                out[dims[i]] = b.draw_int(2, 3)
        shape = tuple(out)
        expr = f"jax.lax.broadcast_in_dim({a.name}, {shape!r}, {dims!r})"
    if not fits(b, shape):
        return False
    b.emit("broadcast", expr, shape, a.dtype, main=main, **model_of(a))
    return True


def _squeeze(b: Builder) -> bool:
    a = b.pick(lambda v: not v.manual and 1 in v.shape)
    if a is None:
        return False
    d = b.choice([k for k, n in enumerate(a.shape) if n == 1])
    main = a
    a = b.replicated(a)
    b.emit("squeeze", f"jnp.squeeze({a.name}, axis={d})", a.shape[:d] + a.shape[d + 1:], a.dtype, main=main,
           **model_of(a))
    return True


def _expand_dims(b: Builder) -> bool:
    a = b.pick(lambda v: not v.manual and v.ndim < MAX_RANK)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim)
    main = a
    a = b.replicated(a)
    b.emit("expand_dims", f"jnp.expand_dims({a.name}, {d})", a.shape[:d] + (1,) + a.shape[d:], a.dtype, main=main,
           **model_of(a))
    return True


def _rev(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    dims = tuple(sorted(set(b.draw_int(0, a.ndim - 1) for _ in range(b.draw_int(1, a.ndim)))))
    main = a
    a = b.replicated(a)
    expr = f"jax.lax.rev({a.name}, {dims!r})" if b.boolean() else f"jnp.flip({a.name}, {dims!r})"
    b.emit("rev", expr, a.shape, a.dtype, main=main, **model_of(a))
    return True


def _iota(b: Builder) -> bool:
    a = b.pick(lambda v: numeric(v) and v.ndim >= 1)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    n = a.shape[d]
    iota = f"jax.lax.broadcasted_iota({jnp_dtype(a.dtype)}, {a.shape!r}, {d})"
    lo, hi = a.lo, a.hi + n - 1
    b.emit("iota", f"{a.name} + {iota}", a.shape, a.dtype, main=a, spec=keep_spec(b, a),
           **result_model(a.dtype, lo, hi, a.frac, a.err))
    return True


def _roll(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    shift = b.draw_int(-a.shape[d] - 1, a.shape[d] + 1)
    main = a
    a = b.replicated(a)
    b.emit("roll", f"jnp.roll({a.name}, {shift}, axis={d})", a.shape, a.dtype, main=main, **model_of(a))
    return True


def _tile_repeat(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    r = b.draw_int(2, 3)
    shape = a.shape[:d] + (a.shape[d] * r,) + a.shape[d + 1:]
    if not fits(b, shape):
        return False
    main = a
    a = b.replicated(a)
    if b.boolean():
        reps = tuple(r if k == d else 1 for k in range(a.ndim))
        expr, op = f"jnp.tile({a.name}, {reps!r})", "tile"
    else:
        expr, op = f"jnp.repeat({a.name}, {r}, axis={d})", "repeat"
    b.emit(op, expr, shape, a.dtype, main=main, **model_of(a))
    return True


def _triangle(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 2 and numeric(v))
    if a is None:
        return False
    fn = b.choice(["tril", "triu"])
    k = b.draw_int(-1, 1)
    main = a
    a = b.replicated(a)
    b.emit("tril_triu", f"jnp.{fn}({a.name}, {k})", a.shape, a.dtype, main=main,
           **dict(model_of(a), lo=min(a.lo, 0.0), hi=max(a.hi, 0.0)))
    return True


#: This family's ops, by the name programs and the coverage table use.
OPS = {
    "pad": _pad, "jnp_pad": _jnp_pad, "concatenate": _concatenate, "reshape": _reshape, "transpose": _transpose,
    "broadcast": _broadcast, "squeeze": _squeeze, "expand_dims": _expand_dims, "rev": _rev, "iota": _iota,
    "roll": _roll, "tile_repeat": _tile_repeat, "tril_triu": _triangle,
}
