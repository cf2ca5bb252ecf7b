"""Tensor contractions for dot_general and convolution: BLAS speed, results independent of the host.

A contraction is laid out as ``lead + batch + (M, K)`` times ``lead + batch + (K, N)`` (lead: the
mesh dims, broadcast like batch dims, so an invariant operand is never copied per device) and
evaluated by the operand type it computes in:

- float32 (and the narrow floats, which compute in float32): the **exact sum of products
  rounded once to float32** (round to nearest even). The operands are widened to float64, where
  every product of two float32 values is exact, and one float64 BLAS product sums them; BLAS may
  add in any order (blocking, SIMD width and thread count vary by host), but every order is
  within ``(K-1) u |a_i| |b_j|`` of the exact sum (u = 2**-53; Cauchy-Schwarz bounds
  sum|a_k b_k|), far below half a float32 ulp. Where that interval holds a float32 rounding
  boundary (about 2 elements in 10**4 of a training step's products at K ~ 1000; exact ties of
  exact-friendly data) the element's products are summed again in a fixed pairwise tree (bound
  ceil(log2 K) u sum|p|), then, for the few still undecided, as a double-double and with
  `math.fsum` (exact): every host gives the same bits. Infinities and NaN follow IEEE: NaN where
  some product is NaN (NaN operand, 0 * inf) or infinities of both signs meet, else the
  infinity. complex64: the real and imaginary parts are each one real sum of 2K products.
- Signed zeros as XLA:CPU gives them: a zero sum of two or more products is +0 (its accumulator
  starts at +0); a single product (K = 1, or no contracting dims) keeps its sign.
- float64 / complex128: products rounded and added in ascending k, one IEEE operation at a time
  (NumPy's elementwise multiply and add, the same bits on every host); BLAS is not used, since
  the order of a float64 sum shows in its last bit. complex128: the real part sums re*re then
  -im*im, the imaginary part re*im then im*re.
- integers and bool: exact modulo 2**bits (wrapping in the result type): float64 BLAS where
  every partial sum is an integer below 2**53 (then any order is exact), else NumPy's integer
  matmul.

What changed against the einsum it replaces: float32 results were float32 sums in einsum's order
(or BLAS's, where einsum handed a product to it); now they are the correctly rounded exact sum,
the value every float32 accumulation order approximates (XLA:CPU's is within its own
(K-1) 2**-24 sum|a b|). Unlike a float32 accumulator, intermediate sums never overflow
(1e30 * 1e30 - 1e30 * 1e30 + 2 is 2, not NaN) nor lose subnormal products. float64 results were
einsum's order; now ascending k.
"""
from __future__ import annotations

import math

import numpy as np

from refsim.blas import matmul as _matmul
from refsim.values import complex_from_parts

_U = 2.0 ** -53          # float64 unit roundoff
_CHUNK = 1 << 22         # elements per temporary block (ordered float64 sums, exact re-sums)


# --- layout ---------------------------------------------------------------------------------

def _squash_broadcast(x: np.ndarray, dims) -> np.ndarray:
    """Size-1 views of the stride-0 (broadcast) dims among `dims`: matmul broadcasts them back."""
    index = [slice(None)] * x.ndim
    squashed = False
    for d in dims:
        if x.strides[d] == 0 and x.shape[d] > 1:
            index[d] = slice(0, 1)
            squashed = True
    return x[tuple(index)] if squashed else x


def contract(x: np.ndarray, y: np.ndarray, *, nlead: int, x_batch, y_batch, x_contract, y_contract,
             dtype) -> np.ndarray:
    """Sum over the paired contracting dims of ``x * y`` computed in `dtype` (both operands have it).

    The first `nlead` dims of both are broadcast against each other (mesh dims), then come the
    paired batch dims; the result is ``lead + batch + x's free dims + y's free dims`` (free dims
    in operand order), as StableHLO dot_general orders them.
    """
    lead = tuple(range(nlead))
    xb, yb = tuple(x_batch), tuple(y_batch)
    xc, yc = tuple(x_contract), tuple(y_contract)
    xf = tuple(d for d in range(nlead, x.ndim) if d not in xb and d not in xc)
    yf = tuple(d for d in range(nlead, y.ndim) if d not in yb and d not in yc)
    batch_shape = tuple(x.shape[d] for d in xb)   # equal in y (dot_general's rule)
    x = _squash_broadcast(x, lead + xb)
    y = _squash_broadcast(y, lead + yb)
    xt = x.transpose(lead + xb + xf + xc)
    yt = y.transpose(lead + yb + yc + yf)
    nb = nlead + len(xb)
    k = math.prod(xt.shape[nb + len(xf):])
    m = math.prod(xt.shape[nb: nb + len(xf)])
    n = math.prod(yt.shape[nb + len(yc):])
    free_shape = xt.shape[nb: nb + len(xf)] + yt.shape[nb + len(yc):]
    # lead (mesh) dims broadcast, and stay size 1 where both operands are invariant
    out_lead = np.broadcast_shapes(xt.shape[:nb], yt.shape[:nb])
    dtype = np.dtype(dtype)
    kind = _kind(dtype)
    work = np.float64 if kind == "f32" else dtype   # float32 values widen exactly
    xm = np.asarray(xt, dtype=work, order="C").reshape(xt.shape[:nb] + (m, k))
    if kind == "f32":  # y stored (N, K): BLAS reads it transposed, and a column is contiguous to re-sum
        yn = y.transpose(lead + yb + yf + yc)
        ym = np.asarray(yn, dtype=work, order="C").reshape(yn.shape[:nb] + (n, k)).swapaxes(-1, -2)
    else:
        ym = np.asarray(yt, dtype=work, order="C").reshape(yt.shape[:nb] + (k, n))
    if kind == "f32":
        res = _exact_real(xm, ym)
    elif kind == "c64":
        res = _exact_complex(xm, ym)
    elif kind == "f64":
        res = _ordered_real(xm, ym)
    elif kind == "c128":
        res = _ordered_complex(xm, ym)
    else:
        res = _integer(xm, ym, dtype)
    res = res.reshape(out_lead + free_shape)
    if out_lead[nlead:] != batch_shape:   # a batch dim broadcast in both operands: a view of it again
        res = np.broadcast_to(res, out_lead[:nlead] + batch_shape + free_shape)
    return res


def _kind(dtype: np.dtype) -> str:
    if dtype == np.float32:
        return "f32"
    if dtype == np.float64:
        return "f64"
    if dtype == np.complex64:
        return "c64"
    if dtype == np.complex128:
        return "c128"
    if dtype.kind in "iub":
        return "int"
    raise TypeError(f"refsim's products compute in float32, float64, complex64, complex128 or an integer "
                    f"type; got {dtype} (narrow floats are widened to float32 by the rule first).")


# --- float32: exact sum, rounded once ---------------------------------------------------------

def _exact_real(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The exact ``a @ b`` (float64 arrays of float32 values) correctly rounded to float32."""
    # float32 values cannot overflow a float64 sum: it is finite exactly when every value is
    finite = bool(np.isfinite(np.sum(a)) and np.isfinite(np.sum(b)))
    a0, b0 = a, b
    if not finite:
        a0, b0 = np.where(np.isfinite(a), a, 0.0), np.where(np.isfinite(b), b, 0.0)
    out = _exact_finite(a0, b0)
    if not finite:
        out = _ieee_specials(a, b, out)
    return out


def _exact_finite(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    k = a.shape[-1]
    if k == 1:  # one product, exact in float64: rounded once, its sign kept (XLA: a multiply)
        return np.multiply(a, b).astype(np.float32)
    s = _matmul(a, b)
    # Any order of the K exact products is within (K-1)u sum|a_k b_k| <= (K-1)u |a| |b| of the exact
    # sum (Cauchy-Schwarz); 4 more u cover the rounding of s -/+ e (|s| <= |a| |b| (1 + Ku)), and the
    # factor the rounding of the norms and of e itself.
    na = np.sqrt(np.einsum("...mk,...mk->...m", a, a))
    nb = np.sqrt(np.einsum("...kn,...kn->...n", b, b))
    e = np.multiply((na * ((k + 3) * _U * (1 + 2.0 ** -16)))[..., :, None], nb[..., None, :])
    lo = np.empty(s.shape, np.float32)
    hi = np.empty(s.shape, np.float32)
    with np.errstate(over="ignore"):  # lo / hi beyond float32's range are inf, which decides
        # computed in float64, rounded to nearest float32 as they are stored (one pass each)
        np.subtract(s, e, out=lo, casting="same_kind")
        np.add(s, e, out=hi, casting="same_kind")
    del e
    undecided = lo != hi
    if undecided.any():
        _resum(a, b, lo, undecided, na, nb)
    lo += np.float32(0.0)  # -0 -> +0: a sum of two or more products is +0 when zero
    return lo


def _resum(a: np.ndarray, b: np.ndarray, out: np.ndarray, undecided: np.ndarray, na: np.ndarray,
           nb: np.ndarray) -> None:
    """out[undecided] = the exact sum of products, correctly rounded to float32 (rare elements).

    The products are summed again in a fixed pairwise tree, whose error bound (depth * u instead
    of K * u) decides all but a few; those take a double-double sum, then `math.fsum`."""
    idx = np.nonzero(undecided)
    nbat = out.ndim - 2
    ia = tuple(i if a.shape[d] > 1 else np.zeros_like(i) for d, i in enumerate(idx[:nbat])) + (idx[nbat],)
    ib = tuple(i if b.shape[d] > 1 else np.zeros_like(i) for d, i in enumerate(idx[:nbat])) + (idx[nbat + 1],)
    bt = np.swapaxes(b, -1, -2)                                             # (..., N, K)
    k = a.shape[-1]
    depth = max(0, (k - 1).bit_length())
    step = max(1, _CHUNK // max(k, 1))
    vals = np.empty(len(idx[0]), np.float32)
    for s in range(0, len(vals), step):
        sl = slice(s, s + step)
        ja, jb = tuple(i[sl] for i in ia), tuple(i[sl] for i in ib)
        prods = a[ja] * bt[jb]                                              # (n, K), exact in float64
        v = _pairwise(prods)
        e = (na[ja] * nb[jb]) * ((depth + 3) * _U * (1 + 2.0 ** -16))
        with np.errstate(over="ignore"):
            r = (v - e).astype(np.float32)
            hard = np.flatnonzero(r != (v + e).astype(np.float32))
        if len(hard):
            r[hard], ok = _round_dd(prods[hard])
            for j in hard[~ok]:
                r[j] = _round_f32(prods[j].tolist())
        vals[sl] = r
    out[idx] = vals


def _pairwise(p: np.ndarray) -> np.ndarray:
    """Each row of `p` summed in a fixed binary tree (pairs of neighbours, level by level): within
    ceil(log2 K) * u * sum|p| of the exact sum."""
    x = p
    while x.shape[1] > 1:
        if x.shape[1] % 2:
            x = np.concatenate([x[:, :-1:2] + x[:, 1::2], x[:, -1:]], axis=1)
        else:
            x = x[:, 0::2] + x[:, 1::2]
    return x[:, 0] if x.shape[1] else np.zeros(len(x))


def _round_dd(p: np.ndarray):
    """(float32 sums of the rows of `p`, whether each is the exact sum correctly rounded).

    A fixed pairwise tree of TwoSums (error-free) carries each row's sum as hi + lo; only the
    adding up of the lo parts rounds (at most depth * u * the errors, depth**2 u**2 sum|p| in all).
    The pair is renormalised (v + w exactly, |w| <= ulp(v) / 2) and rounded: correctly wherever v is
    no float32 midpoint (the error cannot carry it across one) or w decides the tie."""
    n, k = p.shape
    width = 1 << max(0, (k - 1).bit_length())
    x = p
    if width != k:   # zeros up to a power of two: they change no sum
        x = np.zeros((n, width))
        x[:, :k] = p
    lo = None
    depth = 0
    while x.shape[1] > 1:
        x0, x1 = x[:, 0::2], x[:, 1::2]
        hi = x0 + x1
        bv = hi - x0
        err = (x0 - (hi - bv)) + (x1 - bv)
        lo = err if lo is None else lo[:, 0::2] + lo[:, 1::2] + err
        x = hi
        depth += 1
    hi = x[:, 0]
    lo = np.zeros(n) if lo is None else lo[:, 0]
    v = hi + lo
    bv = v - hi
    w = (hi - (v - bv)) + (lo - bv)
    bound = (depth + 1) ** 2 * _U * _U * np.abs(p).sum(axis=1) * 4
    with np.errstate(over="ignore", invalid="ignore"):
        r = v.astype(np.float32)
        rv = r.astype(np.float64)
        other = np.nextafter(r, np.where(v > rv, np.float32(np.inf), np.float32(-np.inf)))
        mid = (rv + other.astype(np.float64)) / 2
        tie = v == mid
        # away from a midpoint the error (|w| + bound) cannot cross it; on one, w's sign decides
        ok = np.isfinite(r) & (np.abs(v) >= 2.0 ** -126) & np.where(tie, np.abs(w) > bound,
                                                                    np.abs(v - mid) > np.abs(w) + bound)
        up = tie & (w > 0)
        down = tie & (w < 0)
    r = np.where(up, np.maximum(r, other), np.where(down, np.minimum(r, other), r))
    return r, ok


def _round_f32(terms: list) -> np.float32:
    """The exact sum of float64 `terms` rounded to nearest-even float32."""
    hi = math.fsum(terms)               # the exact sum rounded to float64
    r = np.float32(hi)
    if not math.isfinite(hi) or float(r) == hi:
        return r                        # hi is a float32: the exact sum (within half a double ulp) rounds to it
    up = hi > float(r)
    other = np.nextafter(r, np.float32(np.inf if up else -np.inf))
    a = float(r) if math.isfinite(r) else math.copysign(2.0 ** 128, hi)  # inf: the next binade's start
    mid = (a + float(other)) / 2
    if hi != mid:
        return r                        # not a tie: the residual cannot move it across one
    lo = math.fsum(terms + [-hi])       # the exact residual's sign decides the tie
    if lo == 0:
        return r
    pick = max(a, float(other)) if lo > 0 else min(a, float(other))
    return np.float32(pick)


def _ieee_specials(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`out` (the sum over the finite products) with IEEE's NaN and infinities where a product
    is not finite: counted with 0/1 matrix products (exact in any order)."""
    def hits(p, q):
        return _matmul(p.astype(np.float64), q.astype(np.float64)) > 0

    with np.errstate(invalid="ignore"):
        pinf_a, ninf_a, pinf_b, ninf_b = a == np.inf, a == -np.inf, b == np.inf, b == -np.inf
        pos_a, neg_a, pos_b, neg_b = a > 0, a < 0, b > 0, b < 0
        inf_a, inf_b = pinf_a | ninf_a, pinf_b | ninf_b
        nan = np.isnan(a).any(-1)[..., :, None] | np.isnan(b).any(-2)[..., None, :]
        nan = nan | hits(inf_a, b == 0) | hits(a == 0, inf_b)
        pinf = hits(pinf_a, pos_b) | hits(ninf_a, neg_b) | hits(pos_a, pinf_b) | hits(neg_a, ninf_b)
        ninf = hits(pinf_a, neg_b) | hits(ninf_a, pos_b) | hits(pos_a, ninf_b) | hits(neg_a, pinf_b)
    out = np.where(pinf, np.float32(np.inf), np.where(ninf, np.float32(-np.inf), out))
    return np.where(nan | (pinf & ninf), np.float32(np.nan), out)


def _complex_halves(x: np.ndarray, y: np.ndarray):
    """(x', y') pairs whose real products give the real and the imaginary part of ``x @ y``:
    re = [xr, -xi] @ [yr; yi], im = [xr, xi] @ [yi; yr] (2K real products each)."""
    xr, xi = x.real.astype(np.float64), x.imag.astype(np.float64)
    yr, yi = y.real.astype(np.float64), y.imag.astype(np.float64)
    re = (np.concatenate([xr, -xi], axis=-1), np.concatenate([yr, yi], axis=-2))
    im = (np.concatenate([xr, xi], axis=-1), np.concatenate([yi, yr], axis=-2))
    return re, im


def _exact_complex(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    (ra, rb), (ia, ib) = _complex_halves(x, y)
    return complex_from_parts(_exact_real(ra, rb), _exact_real(ia, ib), np.complex64)


# --- float64: one IEEE operation at a time, ascending k ---------------------------------------

def _ordered_real(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``((0 + a_0 b_0) + a_1 b_1) + ...`` per element, every operation rounded to float64."""
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    shape = batch + (m, n)
    size = math.prod(shape)
    if k == 0 or size == 0:
        return np.zeros(shape, a.dtype)
    if k == 1:  # one product: its sign kept (XLA: a multiply)
        return np.multiply(a, b)
    at = np.moveaxis(a, -1, 0)[..., :, None]   # (K, ..., M, 1)
    bt = np.moveaxis(b, -2, 0)[..., None, :]   # (K, ..., 1, N)
    step = max(1, _CHUNK // size)
    acc = None
    with np.errstate(all="ignore"):
        for k0 in range(0, k, step):
            k1 = min(k, k0 + step)
            first = acc is None
            buf = np.empty((k1 - k0 + (0 if first else 1),) + shape, a.dtype)
            if not first:
                buf[0] = acc
            np.multiply(at[k0:k1], bt[k0:k1], out=buf[0 if first else 1:])
            flat = buf.reshape(buf.shape[0], -1)
            # NumPy reduces a C-contiguous (n, m >= 2) array along axis 0 row after row; one column
            # it would sum pairwise, so that one is accumulated
            acc = (np.add.reduce(flat, axis=0) if size >= 2 else np.add.accumulate(flat, axis=0)[-1]).reshape(shape)
        acc += 0.0  # -0 -> +0: a sum of two or more products is +0 when zero
    return acc


def _ordered_complex(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    (ra, rb), (ia, ib) = _complex_halves(x, y)
    return complex_from_parts(_ordered_real(ra, rb), _ordered_real(ia, ib), np.complex128)


# --- integers: exact modulo 2**bits --------------------------------------------------------------

def _integer(a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> np.ndarray:
    bound = 0
    if a.size and b.size:
        bound = a.shape[-1] * max(int(a.max()), -int(a.min())) * max(int(b.max()), -int(b.min()))
    if bound < 2 ** 53:  # every partial sum is an integer below 2**53: exact in float64, any order
        return _matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64).astype(dtype)
    return np.matmul(a, b)   # NumPy's integer loop: wraps in `dtype`, exact in any order
