"""All-reduce kernels: psum, pmax, pmin and their invariant / unreduced forms.

Each takes the params JAX binds (`axes`, `axis_index_groups`) and a stacked value
(mesh dims first). Semantics follow StableHLO `all_reduce`: every member of a
replica group receives op(x_0, x_1, ..., x_{n-1}) over the group, accumulated in
ascending group position with every partial result rounded to the input dtype
(so integers wrap around and NaN propagates, as XLA does).
"""
from __future__ import annotations

import operator

import numpy as np

from refsim.collectives.groups import GroupLayout, device_groups
from refsim.values import complex_from_parts, quiet_nan

_OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def ordered_reduce(ufunc, xs: np.ndarray) -> np.ndarray:
    """ufunc-reduce axis 0 strictly left to right: ((x0 op x1) op x2) op ...

    NumPy reduces a C-contiguous (n, m) array along axis 0 row by row when m >= 2, but
    uses pairwise summation along a contiguous axis; a single column is therefore
    accumulated explicitly so the order is the same for every shape.
    """
    out = _ordered_reduce(ufunc, xs)
    if ufunc is np.add and xs.shape[0] and _is_inexact(xs.dtype):
        out = _keep_negative_zero(xs, out)
    elif ufunc in (np.maximum, np.minimum) and xs.shape[0] and _is_inexact(xs.dtype):
        out = ieee_max_min(ufunc, xs, out)
    return out


def ieee_max_min(ufunc, xs: np.ndarray, out: np.ndarray, axis=0) -> np.ndarray:
    """`out`, NumPy's max / min of `xs` over `axis`, as StableHLO's maximum / minimum give it
    (IEEE 754-2019): a zero result is +0 for max when any operand is +0 (-0 for min when any is
    -0), whatever the operands' order (NumPy keeps whichever zero it met first), and a NaN
    result is quiet (NumPy passes a signalling NaN through). Both are order-independent, so
    fixing the result up is the same as folding maximum in any order. Complex values (a
    lexicographic order, which StableHLO and XLA reject for all_reduce) are left as they are."""
    if xs.dtype.kind == "c":
        return out
    out = np.asarray(out, xs.dtype)
    with np.errstate(invalid="ignore"):
        zero = out == 0
        if zero.any():
            if ufunc is np.maximum:   # -0 only when no operand is +0
                negative = ~np.logical_or.reduce((xs == 0) & ~np.signbit(xs), axis=axis)
            else:                     # -0 as soon as one operand is -0
                negative = np.logical_or.reduce((xs == 0) & np.signbit(xs), axis=axis)
            signed = np.where(negative, np.asarray(-0.0, xs.dtype), np.asarray(0.0, xs.dtype))
            out = np.where(zero, signed, out)
    return quiet_nan(np.asarray(out, xs.dtype))


def _is_inexact(dtype: np.dtype) -> bool:
    """float, complex, and ml_dtypes' bfloat16 / float8 / float6 / float4 (NumPy kind 'V')."""
    return dtype.kind in "fc" or (dtype.kind == "V" and dtype.name.startswith(("bfloat", "float")))


def _keep_negative_zero(xs: np.ndarray, out: np.ndarray) -> np.ndarray:
    """A sum whose operands are all -0.0 is -0.0: StableHLO's all_reduce schedule has the operands
    as its only leaves (no +0 identity is added), and IEEE 754 gives -0 + -0 = -0. NumPy's reduce
    starts from its +0 identity, which turns such a sum into +0. Complex values: part by part.

    Only a zero result can need it, so the operands are read only where `out` is zero (usually
    nowhere: then `out` comes back as it is, without a pass over the operands)."""
    if xs.dtype.kind == "c":
        if not ((out.real == 0).any() or (out.imag == 0).any()):
            return out
        return complex_from_parts(_keep_negative_zero(xs.real, out.real), _keep_negative_zero(xs.imag, out.imag),
                                  out.dtype)
    zero = out == 0
    if not zero.any():
        return out
    if out.ndim == 0:
        negative = _all_negative_zero(xs)
        return np.asarray(-0.0, xs.dtype) if negative else out
    where = np.nonzero(zero)
    negative = _all_negative_zero(xs[(slice(None),) + where])   # (n, zeros) -> (zeros,)
    if not negative.any():
        return out
    out = np.array(out, copy=True)
    out[tuple(w[negative] for w in where)] = np.asarray(-0.0, xs.dtype)
    return out


def _all_negative_zero(xs: np.ndarray) -> np.ndarray:
    """Per element of xs[0], whether every operand along axis 0 is -0.0."""
    return np.logical_and.reduce((xs == 0) & np.signbit(xs), axis=0)


def _ordered_reduce(ufunc, xs: np.ndarray) -> np.ndarray:
    n = xs.shape[0]
    rest = xs.shape[1:]
    if n > 1 and _outer_axis_zero(xs):
        # Reduced in place of a strided view: NumPy's iterator keeps an axis whose stride is
        # larger than some other non-trivial axis's outside its inner loop and walks it
        # forward (positive stride), so each output element is still x0 op x1 op ... in
        # order, without first copying a view of the global array into group-major order.
        return ufunc.reduce(xs, axis=0, dtype=xs.dtype)
    flat = np.ascontiguousarray(xs).reshape(n, -1)
    if flat.shape[1] >= 2 or n <= 1:
        out = ufunc.reduce(flat, axis=0, dtype=xs.dtype) if n else None
    else:
        out = ufunc.accumulate(flat, axis=0, dtype=xs.dtype)[-1]
    return out.reshape(rest)


def _outer_axis_zero(xs: np.ndarray) -> bool:
    """Whether axis 0 has a positive stride larger than that of some other axis of size > 1."""
    s0 = xs.strides[0]
    others = [abs(st) for n, st in zip(xs.shape[1:], xs.strides[1:]) if n > 1 and st != 0]
    return s0 > 0 and bool(others) and s0 > min(others)


def _split_axes(axes, local_ndim: int, api: str):
    named, positional = [], []
    for a in axes:
        if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
            if not -local_ndim <= a < local_ndim:
                raise ValueError(
                    f"{api}: positional axis {a} in axes={tuple(axes)!r} is out of bounds for "
                    f"a value of rank {local_ndim}."
                )
            positional.append(operator.index(a) % local_ndim)
        else:
            named.append(a)
    return tuple(named), tuple(positional)


def _reduce_local(x: np.ndarray, pos: tuple, op: str) -> np.ndarray:
    """op-reduce the array dimensions `pos` of `x` (NaN propagates through max / min)."""
    ufunc = _OPS[op]
    red = ufunc.reduce(x, axis=pos, dtype=x.dtype)
    return ieee_max_min(ufunc, x, red, axis=pos) if op != "sum" and _is_inexact(x.dtype) else red


def positional_reduce(x, *, axes, axis_index_groups=None, op: str = "sum", api: str = "psum", nm: int = 0):
    """`psum` / `pmax` / `pmin` whose `axes` are all positional (ints): what `jax.vmap(f,
    axis_name=...)` of a collective leaves in a jaxpr, as JAX's batching rule binds it
    (`_reduction_with_positional_batcher`: the named axis became array dimension k). Each is a
    reduction of those array dimensions of the value (after `nm` leading mesh dimensions), with
    no device communication, so it needs no mesh: refsim evaluates it in global view too.
    ValueError for a named axis (a collective: it needs a manual region) or `axis_index_groups`
    (JAX allows them over named axes only)."""
    axes = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
    x = np.asarray(x)
    named, positional = _split_axes(axes, x.ndim - nm, api)
    if named:
        raise ValueError(f"{api}: axes={axes!r} names mesh axes {named!r}; only positional (int) axes "
                         "reduce without a manual region (shard_map / pmap).")
    if axis_index_groups is not None:
        raise ValueError(f"{api}: axis_index_groups can only be used with reductions over named axes, "
                         f"but got axes={axes!r}.")
    return _reduce_local(x, tuple(nm + a for a in positional), op) if positional else x


def is_positional(axes) -> bool:
    """True when every entry of a reduction's `axes` is positional (an int, not an axis name)."""
    axes = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
    return all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in axes)


def all_reduce(x, *, mesh, axes, axis_index_groups=None, op: str = "sum", api: str = "psum"):
    """op-reduce `x` over the named `axes` (and any positional int axes) within each group.

    Positional (int) axes, which JAX's vmap batching rules bind, reduce the local
    dimensions first (as JAX's lowering does). Without groups the result is the same on
    every member, so its named mesh dims come back with size 1.
    """
    ufunc = _OPS[op]
    axes = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
    x = np.asarray(x)
    nm = mesh.ndim
    named, positional = _split_axes(axes, x.ndim - nm, api)
    if axis_index_groups is not None and positional:
        raise ValueError(
            f"{api}: axis_index_groups can only be used with reductions over named axes, "
            f"but got axes={axes!r}."
        )
    if positional:
        x = _reduce_local(x, tuple(nm + a for a in positional), op)
    if not named:
        return x
    if op != "sum" and x.dtype.kind == "c":
        from refsim import compat

        # XLA: "UNIMPLEMENTED: Unsupported reduction computation" (an all-reduce whose
        # computation compares complex numbers); JAX traces the program and XLA refuses it.
        raise compat.xla_runtime_error(
            f"UNIMPLEMENTED: {api} of {x.dtype} values over {named!r}: XLA has no all-reduce {op}imum of complex "
            f"numbers (Unsupported reduction computation), so JAX's {api} fails on every platform. Reduce a "
            f"real key instead, e.g. jax.lax.{api}(jnp.abs(x), axis) or the real and imaginary parts separately.")
    lay = GroupLayout(mesh, named, api)
    x = lay.check(x, api)
    groups = device_groups(mesh, named, axis_index_groups, api=api)
    xk = lay.to_k(x)
    if isinstance(groups, list):  # unequal groups: reduce each size class at once
        out = np.empty(xk.shape, x.dtype)
        by_size: dict[int, list[np.ndarray]] = {}
        for g in groups:
            by_size.setdefault(len(g), []).append(g)
        for gs in by_size.values():
            idx = np.stack(gs)  # (ng, size)
            red = ordered_reduce(ufunc, xk[idx.T])  # (ng, ...)
            out[idx] = red[:, None]
        return lay.from_k(out)
    ng, gs = groups.shape
    if ng == 1:
        red = ordered_reduce(ufunc, xk[groups[0]] if axis_index_groups is not None else xk)
        return lay.from_k(red[None])
    red = ordered_reduce(ufunc, xk[groups.T])  # (ng, ...)
    out = np.empty(xk.shape, x.dtype)
    out[groups] = red[:, None]
    return lay.from_k(out)


def psum(x, *, mesh, axes, axis_index_groups=None):
    """`psum_p`: all-reduce sum over `axes` within each of `axis_index_groups`."""
    return all_reduce(x, mesh=mesh, axes=axes, axis_index_groups=axis_index_groups, op="sum")


def pmax(x, *, mesh, axes, axis_index_groups=None):
    """`pmax_p`: all-reduce maximum (NaN propagates, as StableHLO `maximum`)."""
    return all_reduce(x, mesh=mesh, axes=axes, axis_index_groups=axis_index_groups, op="max",
                      api="pmax")


def pmin(x, *, mesh, axes, axis_index_groups=None):
    """`pmin_p`: all-reduce minimum (NaN propagates, as StableHLO `minimum`)."""
    return all_reduce(x, mesh=mesh, axes=axes, axis_index_groups=axis_index_groups, op="min",
                      api="pmin")


def psum_invariant(x, *, mesh, axes):
    """`psum_invariant_p` (check_vma=True psum): varying -> invariant sum over `axes`."""
    return all_reduce(x, mesh=mesh, axes=axes, op="sum", api="psum_invariant")


def unreduced_psum(x, *, mesh, axes):
    """`unreduced_psum_p`: sums the per-device partial values of an unreduced value."""
    return all_reduce(x, mesh=mesh, axes=axes, op="sum", api="unreduced_psum")


def unreduced_pmax(x, *, mesh, axes):
    """`unreduced_pmax_p` (JAX >= 0.12): max-combines an unreduced(max) value."""
    return all_reduce(x, mesh=mesh, axes=axes, op="max", api="unreduced_pmax")


def unreduced_pmin(x, *, mesh, axes):
    """`unreduced_pmin_p` (JAX >= 0.12): min-combines an unreduced(min) value."""
    return all_reduce(x, mesh=mesh, axes=axes, op="min", api="unreduced_pmin")
