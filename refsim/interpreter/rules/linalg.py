"""dot_general and conv_general_dilated as one contraction each (`_products`), mesh dims as leading
batch dims; a convolution contracts a strided window view of its padded lhs with the kernel.

Types follow lax: the result has `preferred_element_type` when set, else the operands'
type; integer products accumulate in the result type (wrapping), narrow floats (bf16,
f16) accumulate in float32 and round once at the end, as XLA:CPU does.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from refsim.interpreter.registry import register
from refsim.interpreter.rules import _products as P
from refsim.interpreter.rules import _util as U


def _types(lhs, rhs, preferred_element_type):
    out = np.dtype(preferred_element_type) if preferred_element_type is not None else \
        np.result_type(lhs.dtype, rhs.dtype)
    if out == bool:
        return out, np.dtype(np.int64)
    if U.is_inexact(out):
        return out, U.compute_dtype(out)
    return out, out


def _finish(res, out_dtype):
    if out_dtype == bool:
        return res != 0
    return U.as_dtype(np.asarray(res), out_dtype)


@register("dot_general")
def dot_general_rule(ctx, lhs, rhs, *, dimension_numbers, precision, preferred_element_type,
                     out_sharding=None):
    """StableHLO dot_general: result dims are batch, lhs free, rhs free (in operand order).

    Float results are the exact sum of products rounded once (float32 and narrower) or summed in
    ascending order (float64), the same bits on every host and thread count (`_products`)."""
    (lc, rc), (lb, rb) = dimension_numbers
    nm = ctx.nm
    out_dtype, cd = _types(lhs, rhs, preferred_element_type)
    res = P.contract(U.as_dtype(lhs, cd), U.as_dtype(rhs, cd), nlead=nm, x_batch=U.shift(lb, nm),
                     y_batch=U.shift(rb, nm), x_contract=U.shift(lc, nm), y_contract=U.shift(rc, nm), dtype=cd)
    return _finish(res, out_dtype)


def _dilate_pad(x, lead, pads, dilation):
    """Zero-interior dilation then low/high padding (negative crops) of the trailing dims."""
    full, place, crop = [], [], []
    for n, (lo, hi), d in zip(x.shape[lead:], pads, dilation):
        lo_p, hi_p = max(lo, 0), max(hi, 0)
        core = n + max(n - 1, 0) * (d - 1)
        size = lo_p + core + hi_p
        full.append(size)
        place.append(slice(lo_p, lo_p + core, d))
        crop.append(slice(-lo if lo < 0 else 0, size - (-hi if hi < 0 else 0)))
    out = np.zeros(x.shape[:lead] + tuple(full), dtype=x.dtype)
    out[(slice(None),) * lead + tuple(place)] = x
    return out[(slice(None),) * lead + tuple(crop)]


@register("conv_general_dilated")
def conv_general_dilated_rule(ctx, lhs, rhs, *, window_strides, padding, lhs_dilation,
                              rhs_dilation, dimension_numbers, feature_group_count,
                              batch_group_count, precision, preferred_element_type,
                              out_sharding=None):
    """StableHLO convolution (cross-correlation, no kernel flip) with strides, padding,
    lhs/rhs dilation, feature groups and batch groups, dims placed by dimension_numbers."""
    nm = ctx.nm
    lspec, rspec, ospec = dimension_numbers
    mesh = tuple(range(nm))
    x = np.transpose(lhs, mesh + U.shift(lspec, nm))      # mesh, N, C, spatial...
    w = np.transpose(rhs, mesh + U.shift(rspec, nm))      # mesh, O, I, spatial...
    d = len(lspec) - 2
    out_dtype, cd = _types(lhs, rhs, preferred_element_type)
    x = _dilate_pad(U.as_dtype(x, cd), nm + 2, padding, lhs_dilation)
    w = U.as_dtype(w, cd)
    kshape = w.shape[nm + 2:]
    spans = tuple((k - 1) * r + 1 for k, r in zip(kshape, rhs_dilation))
    n_, c_, o_ = x.shape[nm], x.shape[nm + 1], w.shape[nm]
    g, bg = feature_group_count, batch_group_count
    if any(s > n for s, n in zip(spans, x.shape[nm + 2:])):  # no window fits: empty output
        osp = tuple(0 if s > n else (n - s) // st + 1
                    for n, s, st in zip(x.shape[nm + 2:], spans, window_strides))
        res = np.zeros(U.mesh_shape(nm, x, w) + (n_ // bg, o_) + osp, cd)
    else:
        win = sliding_window_view(x, spans, axis=tuple(range(nm + 2, nm + 2 + d)))
        win = win[(slice(None),) * (nm + 2) + tuple(slice(None, None, s) for s in window_strides)
                  + tuple(slice(None, None, r) for r in rhs_dilation)]
        osp = win.shape[nm + 2: nm + 2 + d]
        # lhs: N -> (bg, N/bg), C -> (g, C/g); rhs: O -> (g*bg, O/(g*bg)). x: mesh, B, N/bg, G, C/g,
        # out spatial, kernel spatial; w: mesh, G*B, O/(g*bg), C/g, kernel spatial
        xw = win.reshape(win.shape[:nm] + (bg, n_ // bg, g, c_ // g) + win.shape[nm + 2:])
        ww = w.reshape(w.shape[:nm] + (g * bg, o_ // (g * bg)) + w.shape[nm + 1:])
        wk = tuple(range(nm + 3, nm + 3 + d))
        if bg > 1:   # lax allows bg > 1 only with g == 1: batch over B, the size-1 G dropped
            xk = tuple(range(nm + 3 + d, nm + 3 + 2 * d))
            res = P.contract(xw[(slice(None),) * (nm + 2) + (0,)], ww, nlead=nm, x_batch=(nm,), y_batch=(nm,),
                             x_contract=(nm + 2,) + xk, y_contract=(nm + 2,) + wk, dtype=cd)
            # mesh, B, N/bg, out spatial, P -> mesh, N/bg, B, P, out spatial
            res = np.swapaxes(np.moveaxis(res, nm + 2 + d, nm + 2), nm, nm + 1)
        else:        # batch over G; B is size 1
            xk = tuple(range(nm + 4 + d, nm + 4 + 2 * d))
            res = P.contract(xw, ww, nlead=nm, x_batch=(nm + 2,), y_batch=(nm,), x_contract=(nm + 3,) + xk,
                             y_contract=(nm + 2,) + wk, dtype=cd)
            # mesh, G, B, N/bg, out spatial, P -> mesh, B, N/bg, G, P, out spatial
            res = np.moveaxis(np.moveaxis(res, nm + 3 + d, nm + 3), nm, nm + 2)
        res = res.reshape(res.shape[:nm] + (n_ // bg, o_) + tuple(osp))
    inv = [0] * (d + 2)
    for logical, pos in enumerate(ospec):
        inv[pos] = logical
    res = np.transpose(res, mesh + U.shift(inv, nm))
    return _finish(res, out_dtype)
