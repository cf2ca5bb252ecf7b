"""Sharding ops: with_sharding_constraint (Auto), reshard (Explicit), unreduced values (Explicit,
where the installed JAX has `P(unreduced=...)`) and partial-manual shard_map regions with a
collective inside."""
from __future__ import annotations

import functools

from conformance.strategies._sharded_graph import F32, I32, Builder, model_of, spec_text, sum_result
from conformance.strategies._sharded_ops.common import fits, numeric, result_model
from refsim.layouts.partition_spec import set_text


@functools.lru_cache(maxsize=None)
def has_unreduced() -> bool:
    """Whether the installed JAX has unreduced specs (``P(..., unreduced={...})``)."""
    import jax

    try:
        jax.sharding.PartitionSpec(unreduced={"x"})
    except TypeError:
        return False
    return True


def _wsc(b: Builder) -> bool:
    if b.explicit:
        return False
    a = b.pick(lambda v: not v.manual)
    if a is None:
        return False
    b.constrain(a, b.draw_spec(a.shape, dividing=False, allow_unconstrained=True))
    return True


def _reshard(b: Builder) -> bool:
    if not b.explicit:
        return False
    a = b.pick(lambda v: not v.manual)
    if a is None:
        return False
    b.reshard(a, b.draw_spec(a.shape, dividing=True))
    return True


def _unreduced_sum(b: Builder) -> bool:
    """``reduce_sum`` over sharded dimensions into an unreduced value (each device keeps its
    partial sum: `out_sharding=P(..., unreduced={axes})`), then a reshard that sums the partials
    (JAX's all-reduce). The unreduced value itself stays out of the pool: it is read only by the
    reshard, never by an op or the host (JAX refuses to read one)."""
    if not b.explicit or not has_unreduced():
        return False
    a = b.pick(lambda v: numeric(v) and v.ndim >= 1 and v.spec is not None and any(v.spec))
    if a is None:
        return False
    sharded = [d for d, ax in enumerate(a.spec) if ax]
    summed = sorted(set(b.draw_permutation_of(sharded)[:b.draw_int(1, len(sharded))])
                    | {d for d in range(a.ndim) if not a.spec[d] and b.draw_int(0, 3) == 0})
    axes = sorted({ax for d in summed for ax in a.spec[d]}, key=b.mesh.axis_names.index)
    rest = tuple(ax for d, ax in enumerate(a.spec) if d not in summed)
    shape = tuple(n for d, n in enumerate(a.shape) if d not in summed)
    n = 1
    for d in summed:
        n *= a.shape[d]
    text = spec_text(rest)[:-1]
    text += (", " if text != "P(" else "") + "unreduced={" + ", ".join(map(repr, axes)) + "})"
    u = b.emit("unreduced_sum", f"jax.lax.reduce_sum({a.name}, {tuple(summed)!r}, out_sharding={text})", shape,
               a.dtype, main=a, spec=rest, **sum_result(a, n))
    b.pool.remove(u)
    b.reshard(u, b.draw_spec(shape, dividing=True) if b.boolean() else rest)
    return True


def _shard_map(coll: str):
    def op(b: Builder) -> bool:
        names = list(b.mesh.axis_names)
        axes = tuple(b.draw_permutation_of(names)[: b.draw_int(1, len(names))])
        if coll == "ppermute":
            axes = tuple(sorted(axes, key=names.index))
        n = b.axis_size(axes)
        ok = lambda v: (v.ndim >= 1 and not v.manual and v.dtype in (F32, I32) and v.fine  # noqa: E731
                        and any(s % n == 0 for s in v.shape))
        a = b.pick(ok)
        if a is None:
            return False
        d = b.choice([k for k, s in enumerate(a.shape) if s % n == 0])
        local = list(a.shape)
        local[d] //= n
        in_spec = tuple(axes if k == d else () for k in range(a.ndim))
        ax = axes[0] if len(axes) == 1 else axes
        out_spec = in_spec
        if coll == "psum":
            body, shape, m = f"jax.lax.psum(x, {ax!r})", tuple(local), sum_result(a, n)
            out_spec = ((),) * a.ndim
        elif coll == "pmax":
            body, shape, m = f"jax.lax.pmax(x, {ax!r})", tuple(local), model_of(a)
            out_spec = ((),) * a.ndim
        elif coll == "all_gather":
            # all_gather's result still varies over the axes (vma typing): every device's
            # gathered copy, side by side along dimension d
            shape = a.shape[:d] + (a.shape[d] * n,) + a.shape[d + 1:]
            if not fits(b, shape):
                return False
            body, m = f"jax.lax.all_gather(x, {ax!r}, axis={d}, tiled=True)", model_of(a)
        elif coll == "ppermute":
            shift = b.draw_int(1, max(n - 1, 1))
            perm = [(i, (i + shift) % n) for i in range(n)]
            body, shape, m = f"jax.lax.ppermute(x, {ax!r}, perm={perm!r})", a.shape, model_of(a)
        elif coll == "axis_index":
            body = f"x + jax.lax.axis_index({ax!r}).astype(x.dtype)"
            shape, m = a.shape, result_model(a.dtype, a.lo, a.hi + n - 1, a.frac, a.err)
        elif coll in ("psum_scatter", "all_to_all"):
            d2s = [k for k in range(a.ndim) if local[k] % n == 0]
            if not d2s:
                return False
            d2 = b.choice(d2s)
            out_spec = tuple(axes if k == d2 else () for k in range(a.ndim))
            if coll == "psum_scatter":
                body = f"jax.lax.psum_scatter(x, {ax!r}, scatter_dimension={d2}, tiled=True)"
                shape = list(local)
                shape = tuple(shape)
                m = sum_result(a, n)
            else:
                body = f"jax.lax.all_to_all(x, {ax!r}, {d2}, {d}, tiled=True)"
                shape = list(local)
                shape[d] *= n
                shape[d2] //= n
                shape[d2] *= n
                shape = tuple(shape)
                m = model_of(a)
        else:
            raise AssertionError(coll)
        main = a
        if b.explicit and a.spec != in_spec:
            a = b.reshard(a, in_spec)   # shard_map on Explicit axes takes inputs typed as its in_specs
        manual = set(axes) if b.boolean() or len(axes) < len(names) else None
        # sorted text, not a set's repr: a set of strings prints in PYTHONHASHSEED's order, and the
        # same seed must give the same source in every process (hunt --seed, the example database)
        kw = "" if manual is None else f", axis_names={set_text(manual)}"
        expr = (f"jax.shard_map(lambda x: {body}, in_specs={spec_text(in_spec)}, out_specs={spec_text(out_spec)}"
                f"{kw})({a.name})")
        v = b.emit(f"shard_map_{coll}", expr, shape, a.dtype, main=main, spec=None if b.explicit else (), **m)
        if b.explicit:
            # the result's type over the axes that stay Explicit is JAX's to infer: state one
            v.spec = None
            b.reshard(v, ((),) * len(shape))
            b.pool.remove(v)
        else:
            v.spec = None
        return True
    return op


#: This family's ops, by the name programs and the coverage table use.
OPS = {
    "with_sharding_constraint": _wsc, "reshard": _reshard,
    **{f"shard_map_{c}": _shard_map(c) for c in ("psum", "pmax", "all_gather", "ppermute", "axis_index",
                                                  "psum_scatter", "all_to_all")},
    "unreduced_sum": _unreduced_sum,
}
