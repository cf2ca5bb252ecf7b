"""FFT (complex, real, inverse) and convolution with drawn strides, padding and dilations."""
from __future__ import annotations

import math

from conformance.strategies._sharded_graph import F32, Builder, sum_result
from conformance.strategies._sharded_ops.common import fits, floating, numeric, window_out_size


def _fft(b: Builder) -> bool:
    a = b.pick(lambda v: floating(v) and v.ndim >= 1 and v.mag <= 2 ** 12)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    n = a.shape[d]
    main = a
    a = b.replicated(a)
    kind = b.choice(["real", "imag", "roundtrip", "ifft_real"])
    if kind == "roundtrip":
        expr = f"jnp.fft.irfft(jnp.fft.rfft({a.name}, axis={d}), n={n}, axis={d})"
        lo, hi = a.lo, a.hi
    elif kind == "ifft_real":
        expr = f"jnp.real(jnp.fft.ifft({a.name}, axis={d}))"
        lo, hi = -a.mag, a.mag
    else:
        expr = f"jnp.{kind}(jnp.fft.fft({a.name}, axis={d}))"
        lo, hi = -n * a.mag, n * a.mag
    err = n * a.err + 16 * n * max(a.mag, 1.0) * (math.log2(n) + 1) * 2.0 ** -24
    b.emit("fft", expr, a.shape, F32, main=main, lo=lo, hi=hi, frac=None, err=err)
    return True


def _conv(b: Builder) -> bool:
    a = b.pick(lambda v: numeric(v) and v.ndim in (3, 4) and v.dtype == F32)
    if a is None:
        return False
    sp = a.ndim - 2
    nhwc = b.boolean()
    c = a.shape[-1] if nhwc else a.shape[1]
    groups = b.choice([g for g in (1, 2, 3) if c % g == 0])
    o_feat = groups * b.draw_int(1, 2)
    spatial_in = a.shape[1:-1] if nhwc else a.shape[2:]
    ks, strides, pads, ldil, rdil, out_sp = [], [], [], [], [], []
    for n in spatial_in:
        k = b.draw_int(1, min(3, n + 2))
        s = b.draw_int(1, 2)
        lo, hi = b.draw_int(0, 1), b.draw_int(0, 1)
        ld = 1 if b.backward else b.choice([1, 1, 2])
        rd = b.choice([1, 1, 2])
        out = window_out_size(n, k, s, lo, hi, ld, rd)
        if out < 1:
            k, s, lo, hi, ld, rd, out = 1, 1, 0, 0, 1, 1, n
        ks.append(k), strides.append(s), pads.append((lo, hi)), ldil.append(ld), rdil.append(rd), out_sp.append(out)
    shape = (a.shape[0],) + (tuple(out_sp) + (o_feat,) if nhwc else (o_feat,) + tuple(out_sp))
    if not fits(b, shape):
        return False
    rshape = (o_feat, c // groups) + tuple(ks)
    letters = "HW"[:sp] if sp == 2 else "H"
    dn = (f"NC{letters}", f"OI{letters}", f"NC{letters}") if not nhwc else \
        (f"N{letters}C", f"OI{letters}", f"N{letters}C")
    main = a
    a = b.replicated(a)
    kernel = f"(jnp.arange({math.prod(rshape)}, dtype=jnp.float32).reshape({rshape!r}) % 3 - 1)"
    expr = (f"jax.lax.conv_general_dilated({a.name}, {kernel}, {tuple(strides)!r}, {pads!r}, "
            f"lhs_dilation={tuple(ldil)!r}, rhs_dilation={tuple(rdil)!r}, dimension_numbers={dn!r}, "
            f"feature_group_count={groups})")
    terms = (c // groups) * math.prod(ks)
    model = sum_result(a, terms)
    b.emit("conv", expr, shape, F32, main=main, **model)
    return True


#: This family's ops, by the name programs and the coverage table use.
OPS = {"fft": _fft, "conv": _conv}
