"""Matrix factorizations and FFTs: the primitives of `jax.lax.linalg` and `jax.numpy.fft`.

XLA:CPU lowers these to LAPACK (potrf, getrf, trsm, geqrf, orgqr, syevd, gesdd, geev, gees,
gehrd, gtsv) and DUCC FFTs. refsim computes them with NumPy / SciPy (LAPACK too for the
eigen- and singular-value problems) over the stacked array, mesh dims and batch dims as
LAPACK batch dims; LU, triangular solves, Householder products and tridiagonal solves are
written out here (vectorised over every batch) with LAPACK's pivoting and conventions.

Contract (docs/primitives.md): results are within rounding of LAPACK's, not bit-exact;
factors are unique where the maths makes them so (Cholesky, LU with partial pivoting,
QR with LAPACK's sign convention, triangular solves); eigenvectors and singular vectors
are defined up to sign / phase, so compare reconstructions. A failed factorization
(non-positive-definite Cholesky, singular LU) gives NaNs or infs as JAX's CPU lowering
does, never an exception.
"""
from __future__ import annotations

import numpy as np

from refsim.errors import UnsupportedPrimitive
from refsim.interpreter.registry import register
from refsim.interpreter.rules import _util as U


def _compute(x):
    """Narrow floats are factorized in float32 (as XLA:CPU upcasts them); others as they are."""
    return U.as_dtype(np.asarray(x), U.compute_dtype(x.dtype))


def _mT(x):
    return np.swapaxes(x, -1, -2)


def _mH(x):
    return np.conj(_mT(x)) if U.is_complex(x.dtype) else _mT(x)


# --- Cholesky -------------------------------------------------------------------------------

@register("cholesky")
def cholesky_rule(ctx, x, *, symmetrize_input=False):
    """Lower Cholesky factor L (L L^H = x) from x's lower triangle; NaN where x is not positive
    definite (JAX's CPU lowering fills a failed potrf's result with NaN)."""
    a = _compute(x)
    if symmetrize_input:
        a = (a + _mH(a)) / 2
    a = np.tril(a) + _mH(np.tril(a, -1))  # potrf('L') reads the lower triangle only
    with np.errstate(all="ignore"):
        try:
            out = np.linalg.cholesky(a)
        except np.linalg.LinAlgError:
            out = np.empty_like(a)
            flat_in, flat_out = a.reshape((-1,) + a.shape[-2:]), out.reshape((-1,) + a.shape[-2:])
            for i in range(flat_in.shape[0]):  # only on failure: find which matrices failed
                try:
                    flat_out[i] = np.linalg.cholesky(flat_in[i])
                except np.linalg.LinAlgError:
                    flat_out[i] = np.nan
    return U.as_dtype(out, x.dtype)


# --- LU with partial pivoting ----------------------------------------------------------------

def _cabs1(z: np.ndarray) -> np.ndarray:
    """LAPACK's pivot magnitude (izamax/icamax): |Re z| + |Im z|; |z| for real z."""
    return np.abs(z.real) + np.abs(z.imag) if U.is_complex(z.dtype) else np.abs(z)


def lu_factor(a: np.ndarray):
    """getrf: P A = L U with row partial pivoting (the first row of maximal magnitude, as
    LAPACK's i?amax: |Re| + |Im| for complex, cabs1, not |z|), vectorised over all leading dims. Returns (packed LU, pivots int32 0-based, permutation)."""
    a = np.array(a, copy=True)
    m, n = a.shape[-2:]
    k = min(m, n)
    batch = a.shape[:-2]
    piv = np.zeros(batch + (k,), np.int32)
    perm = np.broadcast_to(np.arange(m, dtype=np.int32), batch + (m,)).copy()
    flat = a.reshape((-1, m, n))
    fp, fperm = piv.reshape((-1, k)), perm.reshape((-1, m))
    rows = np.arange(flat.shape[0])
    with np.errstate(all="ignore"):
        for j in range(k):
            p = j + np.argmax(_cabs1(flat[:, j:, j]), axis=1)
            fp[:, j] = p
            # swap rows j and p of the matrix and the permutation
            rj, rp = flat[rows, j].copy(), flat[rows, p].copy()
            flat[rows, j], flat[rows, p] = rp, rj
            qj, qp = fperm[rows, j].copy(), fperm[rows, p].copy()
            fperm[rows, j], fperm[rows, p] = qp, qj
            if j + 1 < m:
                flat[:, j + 1:, j] /= flat[:, j:j + 1, j]
                if j + 1 < n:
                    flat[:, j + 1:, j + 1:] -= flat[:, j + 1:, j:j + 1] * flat[:, j:j + 1, j + 1:]
    return flat.reshape(a.shape), piv, perm


@register("lu")
def lu_rule(ctx, x):
    """`lax.linalg.lu`: (packed L\\U, int32 pivots, int32 permutation) of each matrix."""
    lu, piv, perm = lu_factor(_compute(x))
    return [U.as_dtype(lu, x.dtype), piv, perm]


@register("lu_pivots_to_permutation")
def lu_pivots_to_permutation_rule(ctx, pivots, *, permutation_size):
    """Apply the row swaps i <-> pivots[i] in order to iota(permutation_size)."""
    batch = pivots.shape[:-1]
    perm = np.broadcast_to(np.arange(permutation_size, dtype=np.int32), batch + (permutation_size,)).copy()
    fperm, fpiv = perm.reshape((-1, permutation_size)), pivots.reshape((-1, pivots.shape[-1]))
    rows = np.arange(fperm.shape[0])
    for i in range(fpiv.shape[1]):
        p = fpiv[:, i].astype(np.int64)
        a, b = fperm[rows, i].copy(), fperm[rows, p].copy()
        fperm[rows, i], fperm[rows, p] = b, a
    return perm


# --- triangular solve -------------------------------------------------------------------------

def _substitute(m: np.ndarray, b: np.ndarray, lower: bool, unit: bool) -> np.ndarray:
    """Solve m x = b for triangular m by forward / back substitution over all batch dims."""
    n = m.shape[-1]
    x = np.zeros(np.broadcast_shapes(m.shape[:-2], b.shape[:-2]) + b.shape[-2:], b.dtype)
    order = range(n) if lower else range(n - 1, -1, -1)
    with np.errstate(all="ignore"):
        for i in order:
            done = slice(0, i) if lower else slice(i + 1, n)
            acc = b[..., i, :] - np.einsum("...k,...kj->...j", m[..., i, done], x[..., done, :])
            x[..., i, :] = acc if unit else acc / m[..., i, i][..., None]
    return x


@register("triangular_solve")
def triangular_solve_rule(ctx, a, b, *, left_side, lower, transpose_a, conjugate_a, unit_diagonal):
    """trsm: x with op(a) x = b (left_side) or x op(a) = b, op = transpose / conjugate as asked.
    Only the `lower` (or upper) triangle of a is read; unit_diagonal ignores its diagonal."""
    a, b = U.bcast_mesh(ctx.nm, _compute(a), _compute(b))
    m = np.tril(a) if lower else np.triu(a)
    low = lower
    if conjugate_a and U.is_complex(m.dtype):
        m = np.conj(m)
    if transpose_a:
        m, low = _mT(m), not low
    if left_side:
        x = _substitute(m, b, low, unit_diagonal)
    else:  # x m = b  <=>  m^T x^T = b^T
        x = _mT(_substitute(_mT(m), _mT(b), not low, unit_diagonal))
    return U.as_dtype(x, b.dtype if not U.is_narrow_float(b.dtype) else b.dtype)


# --- QR -----------------------------------------------------------------------------------------

def householder_product(a: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """orgqr / ungqr: the first n columns of H_1 ... H_k, H_i = I - tau_i v_i v_i^H, with v_i
    stored below the diagonal of column i of a (unit leading entry)."""
    m, n = a.shape[-2:]
    k = taus.shape[-1]
    q = np.broadcast_to(np.eye(m, n, dtype=a.dtype), a.shape).copy()
    with np.errstate(all="ignore"):
        for i in range(k - 1, -1, -1):
            v = np.zeros(a.shape[:-1], a.dtype)
            v[..., i] = 1
            v[..., i + 1:] = a[..., i + 1:, i]
            w = np.einsum("...m,...mn->...n", np.conj(v), q)
            q = q - taus[..., i, None, None] * v[..., :, None] * w[..., None, :]
    return q


@register("householder_product")
def householder_product_rule(ctx, a, taus):
    a, taus = U.bcast_mesh(ctx.nm, _compute(a), _compute(taus))
    return U.as_dtype(householder_product(a, taus), a.dtype)


@register("geqrf")
def geqrf_rule(ctx, x):
    """geqrf: R in the upper triangle, Householder vectors below it, and their taus."""
    a = _compute(x)
    h, tau = np.linalg.qr(a, mode="raw")  # LAPACK geqrf; h comes back transposed (Fortran order)
    return [U.as_dtype(_mT(h), x.dtype), U.as_dtype(tau, x.dtype)]


@register("qr")
def qr_rule(ctx, x, *, pivoting=False, full_matrices=True, use_magma=None):
    """`lax.linalg.qr`: q, r (and the column permutation p when pivoting), LAPACK's signs."""
    a = _compute(x)
    if pivoting:
        import scipy.linalg

        m, n = a.shape[-2:]
        flat = a.reshape((-1, m, n))
        mode = "full" if full_matrices else "economic"
        res = [scipy.linalg.qr(mat, mode=mode, pivoting=True) for mat in flat]
        q = np.stack([r[0] for r in res]).reshape(a.shape[:-2] + res[0][0].shape)
        r = np.stack([r[1] for r in res]).reshape(a.shape[:-2] + res[0][1].shape)
        p = np.stack([r[2] for r in res]).astype(np.int32).reshape(a.shape[:-2] + (n,))
        return [U.as_dtype(q, x.dtype), U.as_dtype(r, x.dtype), p]
    q, r = np.linalg.qr(a, mode="complete" if full_matrices else "reduced")
    return [U.as_dtype(q, x.dtype), U.as_dtype(r, x.dtype)]


# --- eigen / singular value problems -------------------------------------------------------------

@register("eigh")
def eigh_rule(ctx, x, *, lower=True, sort_eigenvalues=True, subset_by_index=None, algorithm=None):
    """`lax.linalg.eigh`: (eigenvectors v, ascending real eigenvalues w) from one triangle of x."""
    a = _compute(x)
    w, v = np.linalg.eigh(a, UPLO="L" if lower else "U")
    if subset_by_index is not None:
        lo, hi = subset_by_index
        w, v = w[..., lo:hi], v[..., lo:hi]
    return [U.as_dtype(v, x.dtype), U.as_dtype(w, np.real(np.zeros((), x.dtype)).dtype)]


@register("svd")
def svd_rule(ctx, x, *, full_matrices=True, compute_uv=True, subset_by_index=None, algorithm=None):
    """`lax.linalg.svd`: descending singular values s (and u, vt when compute_uv)."""
    a = _compute(x)
    real = np.real(np.zeros((), x.dtype)).dtype
    if not compute_uv:
        s = np.linalg.svd(a, compute_uv=False)
        if subset_by_index is not None:
            s = s[..., subset_by_index[0]:subset_by_index[1]]
        return [U.as_dtype(s, real)]
    u, s, vt = np.linalg.svd(a, full_matrices=full_matrices)
    if subset_by_index is not None:
        lo, hi = subset_by_index
        u, s, vt = u[..., :, lo:hi], s[..., lo:hi], vt[..., lo:hi, :]
    return [U.as_dtype(s, real), U.as_dtype(u, x.dtype), U.as_dtype(vt, x.dtype)]


def _complex_of(dtype) -> np.dtype:
    return np.dtype(np.complex64) if np.dtype(dtype) in (np.float32, np.complex64) or U.is_narrow_float(dtype) \
        else np.dtype(np.complex128)


@register("eig")
def eig_rule(ctx, x, *, compute_left_eigenvectors=True, compute_right_eigenvectors=True,
             enable_eigvec_derivs=False, implementation=None):
    """`lax.linalg.eig` (geev): complex eigenvalues, then left / right eigenvectors as asked,
    each normalised to unit 2-norm as LAPACK returns them."""
    import scipy.linalg

    a = _compute(x)
    n = a.shape[-1]
    flat = a.reshape((-1, n, n))
    out_dt = _complex_of(x.dtype)
    ws, vls, vrs = [], [], []
    for mat in flat:  # geev has no batched form; one call per matrix
        w, vl, vr = scipy.linalg.eig(mat, left=True, right=True)
        ws.append(w), vls.append(vl), vrs.append(vr)
    shape = a.shape[:-2]
    res = [np.stack(ws).reshape(shape + (n,)).astype(out_dt)]
    if compute_left_eigenvectors:
        res.append(np.stack(vls).reshape(shape + (n, n)).astype(out_dt))
    if compute_right_eigenvectors:
        res.append(np.stack(vrs).reshape(shape + (n, n)).astype(out_dt))
    return res


@register("schur")
def schur_rule(ctx, x, *, compute_schur_vectors=True, sort_eig_vals=False, select_callable=None):
    """`lax.linalg.schur` (gees): the Schur form T (real quasi-triangular for real x) and,
    when asked, the Schur vectors Z with x = Z T Z^H."""
    import scipy.linalg

    if sort_eig_vals or select_callable is not None:
        raise NotImplementedError(  # JAX's CPU lowering raises the same for these options
            "The sort feature of LAPACK's gees routine is not implemented; call "
            "lax.linalg.schur with sort_eig_vals=False and no select_callable.")
    a = _compute(x)
    n = a.shape[-1]
    res = [scipy.linalg.schur(mat, output="complex" if U.is_complex(a.dtype) else "real")
           for mat in a.reshape((-1, n, n))]
    t = np.stack([r[0] for r in res]).reshape(a.shape)
    out = [U.as_dtype(t, x.dtype)]
    if compute_schur_vectors:
        out.append(U.as_dtype(np.stack([r[1] for r in res]).reshape(a.shape), x.dtype))
    return out


@register("hessenberg")
def hessenberg_rule(ctx, x):
    """`lax.linalg.hessenberg` (gehrd): the packed Hessenberg form and Householder taus."""
    import scipy.linalg.lapack as lapack

    a = _compute(x)
    n = a.shape[-1]
    prefix = {np.dtype(np.float32): "s", np.dtype(np.float64): "d",
              np.dtype(np.complex64): "c", np.dtype(np.complex128): "z"}[a.dtype]
    gehrd = getattr(lapack, prefix + "gehrd")
    hs, taus = [], []
    for mat in a.reshape((-1, n, n)):
        h, tau, info = gehrd(mat)
        hs.append(h), taus.append(tau[: max(n - 1, 0)])
    h = np.stack(hs).reshape(a.shape)
    tau = np.stack(taus).reshape(a.shape[:-2] + (max(n - 1, 0),))
    return [U.as_dtype(h, x.dtype), U.as_dtype(tau, x.dtype)]


@register("tridiagonal_solve")
def tridiagonal_solve_rule(ctx, dl, d, du, b, *, perturb_singular=False):
    """gtsv-style solve of a tridiagonal system (dl: sub-, d: main, du: super-diagonal; dl[0]
    and du[-1] unused) by the Thomas algorithm, vectorised over batches and right-hand sides.
    A zero pivot gives inf / NaN, as JAX's own (non-CPU) implementation does."""
    if perturb_singular:
        raise UnsupportedPrimitive(
            "tridiagonal_solve", "With perturb_singular=True it runs jaxlib's perturbed LAPACK kernel, "
            "which refsim does not reproduce; call it with perturb_singular=False.")
    dl, d, du, b = U.bcast_mesh(ctx.nm, *(_compute(v) for v in (dl, d, du, b)))
    n = d.shape[-1]
    c = np.zeros_like(d)
    x = np.zeros(np.broadcast_shapes(d.shape[:-1], b.shape[:-2]) + b.shape[-2:], b.dtype)
    y = np.zeros_like(x)
    with np.errstate(all="ignore"):
        denom = d[..., 0]
        c[..., 0] = du[..., 0] / denom
        y[..., 0, :] = b[..., 0, :] / denom[..., None]
        for i in range(1, n):
            denom = d[..., i] - dl[..., i] * c[..., i - 1]
            if i < n - 1:
                c[..., i] = du[..., i] / denom
            y[..., i, :] = (b[..., i, :] - dl[..., i, None] * y[..., i - 1, :]) / denom[..., None]
        x[..., n - 1, :] = y[..., n - 1, :]
        for i in range(n - 2, -1, -1):
            x[..., i, :] = y[..., i, :] - c[..., i, None] * x[..., i + 1, :]
    return U.as_dtype(x, b.dtype)


# --- FFT ------------------------------------------------------------------------------------------

@register("fft")
def fft_rule(ctx, x, *, fft_type, fft_lengths):
    """`lax.fft` over the trailing len(fft_lengths) dims: FFT, IFFT, RFFT, IRFFT (numpy.fft, whose
    unnormalised forward / 1/n inverse conventions are XLA's)."""
    kind = getattr(fft_type, "name", str(fft_type)).upper().split(".")[-1]
    axes = tuple(range(-len(fft_lengths), 0))
    cplx = _complex_of(x.dtype)
    if kind == "FFT":
        out = np.fft.fftn(x, axes=axes).astype(cplx)
    elif kind == "IFFT":
        out = np.fft.ifftn(x, axes=axes).astype(cplx)
    elif kind == "RFFT":
        out = np.fft.rfftn(x, s=tuple(fft_lengths), axes=axes).astype(cplx)
    elif kind == "IRFFT":
        real = np.dtype(np.float32) if x.dtype == np.complex64 else np.dtype(np.float64)
        out = np.fft.irfftn(x, s=tuple(fft_lengths), axes=axes).astype(real)
    else:
        raise ValueError(f"fft: unknown fft_type {fft_type!r}; expected FFT, IFFT, RFFT or IRFFT.")
    return out


# --- the remaining lax.linalg primitives ------------------------------------------------------------

@register("symmetric_product")
def symmetric_product_rule(ctx, a, c, *, alpha, beta):
    """alpha * a a^T + beta * c, the whole matrix (JAX's CPU lowering computes it with one
    batched matmul; only the lower triangle is promised on every platform)."""
    a, c = U.bcast_mesh(ctx.nm, _compute(a), _compute(c))
    return U.as_dtype(alpha * (a @ _mT(a)) + beta * c, c.dtype)


@register("cholesky_update")
def cholesky_update_rule(ctx, r, w):
    """Rank-one update of an upper Cholesky factor: R' with R'^T R' = R^T R + w w^T."""
    r, w = U.bcast_mesh(ctx.nm, _compute(r), _compute(w))
    gram = _mT(r) @ r + w[..., :, None] * w[..., None, :]
    return U.as_dtype(_mT(np.linalg.cholesky(gram)), r.dtype)


def _lapack(name: str, dtype):
    import scipy.linalg.lapack as lapack

    prefix = {np.dtype(np.float32): "s", np.dtype(np.float64): "d",
              np.dtype(np.complex64): "c", np.dtype(np.complex128): "z"}[np.dtype(dtype)]
    real = {"orgqr": "orgqr", "ormqr": "ormqr", "sytrd": "sytrd"}
    cplx = {"orgqr": "ungqr", "ormqr": "unmqr", "sytrd": "hetrd"}
    table = cplx if prefix in "cz" else real
    return getattr(lapack, prefix + table.get(name, name))


@register("geqp3")
def geqp3_rule(ctx, a, jpvt, *, use_magma=None):
    """geqp3: QR with column pivoting (packed like geqrf), LAPACK 1-based pivots and taus."""
    x = _compute(a)
    m, n = x.shape[-2:]
    f = _lapack("geqp3", x.dtype)
    flat, fj = x.reshape((-1, m, n)), np.broadcast_to(jpvt, x.shape[:-2] + (n,)).reshape((-1, n))
    outs, pivs, taus = [], [], []
    if np.any(fj != 0):
        raise ValueError("geqp3: refsim supports jpvt of zeros (every column free to pivot, what "
                         "lax.linalg.qr(pivoting=True) passes); got fixed columns in jpvt.")
    for mat in flat:
        qr, piv, tau, work, info = f(mat, lwork=max(3 * n + 1, 1) * 4)
        outs.append(qr), pivs.append(piv), taus.append(tau)  # LAPACK 1-based pivots, as JAX returns them
    shape = x.shape[:-2]
    return [U.as_dtype(np.stack(outs).reshape(x.shape), a.dtype),
            np.stack(pivs).astype(np.int32).reshape(shape + (n,)),
            U.as_dtype(np.stack(taus).reshape(shape + (min(m, n),)), a.dtype)]


@register("ormqr")
def ormqr_rule(ctx, a, taus, c, *, left, transpose):
    """ormqr: Q c, Q^H c, c Q or c Q^H with Q the Householder product of (a, taus)."""
    a, taus, c = U.bcast_mesh(ctx.nm, _compute(a), _compute(taus), _compute(c))
    m = a.shape[-2]
    full = np.concatenate([a, np.zeros(a.shape[:-1] + (m - a.shape[-1],), a.dtype)], axis=-1) \
        if a.shape[-1] < m else a[..., :m]
    q = householder_product(full, taus)
    q = _mH(q) if transpose else q
    return U.as_dtype(q @ c if left else c @ q, c.dtype)


@register("tridiagonal")
def tridiagonal_rule(ctx, a, *, lower=True):
    """sytrd / hetrd: packed reduction to tridiagonal form, its diagonal, off-diagonal and taus."""
    x = _compute(a)
    n = x.shape[-1]
    f = _lapack("sytrd", x.dtype)
    res = [f(mat, lower=int(lower)) for mat in x.reshape((-1, n, n))]
    shape = x.shape[:-2]
    real = np.real(np.zeros((), a.dtype)).dtype
    packed = np.stack([r[0] for r in res]).reshape(x.shape)
    d = np.stack([r[1] for r in res]).reshape(shape + (n,))
    e = np.stack([r[2] for r in res]).reshape(shape + (max(n - 1, 0),))
    tau = np.stack([r[3] for r in res]).reshape(shape + (max(n - 1, 0),))
    return [U.as_dtype(packed, a.dtype), U.as_dtype(d, real), U.as_dtype(e, real), U.as_dtype(tau, a.dtype)]
