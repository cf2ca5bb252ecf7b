"""Outputs of matrix factorizations compared with bounds that grow with the conditioning refsim
computes, and primal factors checked through their defining invariants.

A factorization's forward error is not a few units of roundoff of its output: a backward-stable
LAPACK routine (potrf, geqrf, getrf, syevd, gesdd, trsm) returns the exact factor of a matrix
within a few u of the input, so its factor moves by up to about kappa * u, kappa the condition
number of the input matrix; a derivative (a `jvp` through `R^-1`, `L^-1` or 1 / gap) moves by up
to about kappa**2 * u. XLA:CPU factorizes float32 in float32 (LAPACK's s/c routines) while NumPy,
and so refsim, works in double: on an ill-conditioned matrix (a float32 Cholesky with kappa ~1e5)
the two legitimately differ by far more than the scaled bound's 256 ulp. Computing refsim's
float32 factorizations in float32 instead would agree with XLA:CPU only because both call the
same LAPACK, and not with cuSOLVER or a TPU's own algorithm; so the bound scales with kappa.

How it works:

* While refsim evaluates the program, a probe (`Conditions`) records the condition number of
  every factorization and triangular solve it runs, from refsim's own values: kappa_2 of the
  matrix factorized (`cholesky`, `qr`, `geqrf`, `lu`) or solved with (`triangular_solve`),
  ``1 + scale / gap`` for `eigh`, `svd` (with ``s_max / s_min`` as well) and `eig`, the gap
  floored at ``sqrt(u) * scale`` (repeated values are the vectors policy's business,
  `conformance.oracle.vectors`). The largest over the evaluation is the program's kappa.
* Each floating output that depends on such an equation gets a `ConditionedBound`: the scaled
  bound times kappa (level 1: the output is a factor itself, reached from the factorization
  through data movement only) or kappa**2 (level 2: anything computed from a factor, e.g. a
  jvp), capped where the bound reaches the output's own scale (an output that ill-conditioned is
  checked for gross errors, NaN and infinities only; the report shows kappa).
* A level-1 factor is also held to its defining invariants, which do not depend on conditioning:
  a Cholesky factor L must rebuild refsim's matrix (``L L^H``) and be lower triangular; a QR pair
  must rebuild ``Q R`` with Q orthonormal (``Q^H Q = I``) and R upper triangular (Q alone: its
  orthonormality; R alone: ``R^H R``). The invariants hold within ``ulps * u * n`` of the
  matrix's scale (backward stability); a matrix of the batch that breaks them is held to the
  plain scaled bound, without kappa, so a wrong factor (a column of Q with a flipped sign, a 1%
  error) disagrees however ill-conditioned the matrix is.

Eigenvectors and singular vectors keep the vectors policy (`vectors.py`); their tangents are
turned by the same rotation there and get the level-2 bound here.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from conformance.verdict import compare
from conformance.oracle.policy import DEFAULT_ULPS, EXACT_PRIMITIVES, ScaledBound

#: Equations whose results are as sensitive as their input matrix is ill-conditioned.
CONDITIONED = frozenset({"cholesky", "qr", "geqrf", "lu", "triangular_solve", "eigh", "svd", "eig"})
#: Containers whose outputs are their body's outputs (the dependency analysis looks through them).
_CALLS = ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "remat2",
          "checkpoint")
#: Exact primitives after which a factor is still the factor (masking, placement): its invariants apply.
_SAME_VALUE = frozenset({"select_n", "copy", "sharding_constraint", "reshard", "device_put", "optimization_barrier",
                         "copy_p"})
#: Matrices past this many elements (in all) get no kappa estimate (an SVD per matrix would cost more
#: than the program): their outputs keep the plain scaled bound.
MAX_ELEMENTS = 1 << 22


# -- condition numbers, from refsim's values ----------------------------------------------------
def _wide(x):
    x = np.asarray(x)
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)


def _svd_kappa(m: np.ndarray) -> float:
    """max over the matrices (last two dims) of s_max / s_min; inf for a singular one, NaNs skipped."""
    m = _wide(m)
    if m.size == 0 or m.size > MAX_ELEMENTS or m.ndim < 2:
        return 1.0
    flat = m.reshape((-1,) + m.shape[-2:])
    ok = np.all(np.isfinite(flat), axis=(-2, -1))
    if not ok.any():
        return 1.0
    s = np.linalg.svd(flat[ok], compute_uv=False)
    with np.errstate(divide="ignore", invalid="ignore"):
        k = s[:, 0] / s[:, -1]
    k = np.where(s[:, 0] == 0, 1.0, k)
    return float(np.max(k))


def _gap_kappa(values: np.ndarray, u: float, extra_zero: bool = False) -> float:
    """max over the batch of 1 + scale / gap (gap between distinct values, floored at sqrt(u) * scale)."""
    v = np.asarray(values)
    if v.size == 0:
        return 1.0
    flat = v.reshape((-1, v.shape[-1]))
    worst = 1.0
    for row in flat:
        row = row[np.isfinite(row)]
        if extra_zero:
            row = np.concatenate([row, [0.0]])
        if row.size < 2:
            continue
        scale = float(np.max(np.abs(row)))
        if scale == 0:
            continue
        d = np.abs(row[:, None] - row[None, :])
        d = d[~np.eye(row.size, dtype=bool)]
        gap = max(float(np.min(d)), np.sqrt(u) * scale)
        worst = max(worst, 1.0 + scale / gap)
    return worst


def kappa_of(name: str, params: dict, invals, outs) -> float:
    """The condition number of one evaluated equation `name` (module docstring); 1 if unknown."""
    u = compare.unit_roundoff(np.asarray(invals[0]).dtype) if invals else 2.0 ** -24
    if name == "cholesky":
        return _svd_kappa(outs[0]) ** 2                     # kappa(A) = kappa(L)**2
    if name in ("qr", "geqrf", "lu"):
        return _svd_kappa(invals[0])
    if name == "triangular_solve":
        a = np.asarray(invals[0])
        return _svd_kappa(np.tril(a) if params.get("lower") else np.triu(a))
    if name == "eigh":
        return _gap_kappa(np.asarray(outs[1]), u)
    if name == "svd":
        s = np.asarray(outs[0])
        shape = np.shape(invals[0])
        square = len(shape) >= 2 and shape[-1] == shape[-2]
        k = _gap_kappa(s, u, extra_zero=not square or params.get("full_matrices", False))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.max(s, axis=-1) / np.min(s, axis=-1) if s.size else np.array(1.0)
        ratio = np.where(np.isfinite(ratio), ratio, 1.0 / np.sqrt(u))
        return max(k, float(np.max(ratio)) if np.size(ratio) else 1.0)
    if name == "eig":
        w = np.asarray(outs[0])
        k = 1.0
        flat = w.reshape((-1, w.shape[-1])) if w.size else w
        for row in flat:
            row = row[np.isfinite(row)]
            if row.size < 2:
                continue
            scale = float(np.max(np.abs(row)))
            d = np.abs(row[:, None] - row[None, :])[~np.eye(row.size, dtype=bool)]
            if scale > 0:
                k = max(k, 1.0 + scale / max(float(np.min(d)), np.sqrt(u) * scale))
        for vec in outs[1:]:
            k *= _svd_kappa(vec)                            # a non-normal matrix: kappa of its eigenvectors
        return k
    return 1.0


class Conditions:
    """refsim's probe (`refsim.evaluate(probe=)`): the largest condition number of the
    factorizations and triangular solves refsim evaluates (`kappa`), and how many it saw."""

    def __init__(self):
        self.kappa = 1.0
        self.seen = 0

    def __call__(self, eqn, invals, outvals) -> None:
        name = eqn.primitive.name
        if name not in CONDITIONED:
            return
        self.seen += 1
        try:
            k = kappa_of(name, eqn.params, invals, outvals)
        except Exception:  # noqa: BLE001 - an estimate that fails leaves the bound unscaled
            return
        if np.isfinite(k):
            self.kappa = max(self.kappa, float(k))
        else:
            self.kappa = float("inf")


# -- which outputs depend on a factorization -----------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Origin:
    """An output that is a factor itself: the equation's primitive, its identity and which of its
    results, reached through masking / placement only."""

    primitive: str
    eqn: int
    index: int


def _sub_jaxprs(eqn):
    for v in eqn.params.values():
        for j in (v if isinstance(v, (tuple, list)) else (v,)):
            inner = getattr(j, "jaxpr", None)
            if inner is not None and hasattr(getattr(inner, "jaxpr", inner), "eqns"):
                yield getattr(inner, "jaxpr", inner)
            elif hasattr(j, "eqns"):
                yield j


def _contains(jaxpr, memo: dict) -> bool:
    key = id(jaxpr)
    if key not in memo:
        memo[key] = any(e.primitive.name in CONDITIONED or any(_contains(s, memo) for s in _sub_jaxprs(e))
                        for e in jaxpr.eqns)
    return memo[key]


def levels(jaxpr, in_levels=None, in_origins=None, memo=None) -> tuple[list, list]:
    """Per output of `jaxpr`: (level, origin). Level 0: no factorization upstream; 1: a factor
    reached through exact primitives only; 2: computed from one. Origin: for a level-1 output
    reached through masking / placement only, the `Origin`; else None."""
    from jax.extend import core as jcore

    memo = {} if memo is None else memo
    lev: dict = {}
    org: dict = {}
    for k, v in enumerate(jaxpr.invars):
        lev[v] = in_levels[k] if in_levels else 0
        org[v] = in_origins[k] if in_origins else None
    get_l = lambda v: 0 if isinstance(v, jcore.Literal) else lev.get(v, 0)  # noqa: E731
    get_o = lambda v: None if isinstance(v, jcore.Literal) else org.get(v)  # noqa: E731
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins = [get_l(v) for v in eqn.invars]
        top = max(ins, default=0)
        subs = list(_sub_jaxprs(eqn))
        if name in CONDITIONED:
            outs = [1 if top == 0 else 2] * len(eqn.outvars)
            origins = [Origin(name, id(eqn), i) if top == 0 else None for i in range(len(eqn.outvars))]
        elif name in _CALLS and len(subs) == 1 and len(subs[0].invars) == len(eqn.invars):
            outs, origins = levels(subs[0], ins, [get_o(v) for v in eqn.invars], memo)
        elif subs and any(_contains(s, memo) for s in subs):
            outs, origins = [2] * len(eqn.outvars), [None] * len(eqn.outvars)
        elif name in EXACT_PRIMITIVES and not subs:
            outs = [top] * len(eqn.outvars)
            carried = {get_o(v) for v in eqn.invars if get_l(v) > 0}
            same = name in _SAME_VALUE and len(carried) == 1 and top == 1
            origins = [next(iter(carried)) if same else None] * len(eqn.outvars)
        else:
            outs = [2 if top else 0] * len(eqn.outvars)
            origins = [None] * len(eqn.outvars)
        for v, lv, o in zip(eqn.outvars, outs, origins):
            lev[v], org[v] = lv, o
    return [get_l(v) for v in jaxpr.outvars], [get_o(v) if get_l(v) == 1 else None for v in jaxpr.outvars]


# -- invariants of a factor ------------------------------------------------------------------------
def _mH(x):
    return np.conj(np.swapaxes(x, -1, -2))


def _batch_max(x: np.ndarray) -> np.ndarray:
    """max |x| over each matrix (last two dims), NaN where the matrix has one."""
    return np.max(np.abs(x), axis=(-2, -1)) if x.size else np.zeros(x.shape[:-2])


def invariants(kind: str, xla: dict, ref: dict, ulps: int, u: float) -> tuple[np.ndarray, str]:
    """(per matrix of the batch: does XLA's factor satisfy the defining invariants within
    ``ulps * u * n`` of the matrix's scale, a one-line account). `xla` / `ref`: role -> global
    value ("l" of a Cholesky; "q" and / or "r" of a QR)."""
    if kind == "cholesky":
        lx, lr = _wide(xla["l"]), _wide(ref["l"])
        n = lx.shape[-1]
        a = lr @ _mH(lr)
        tol = ulps * u * n * _batch_max(a)
        resid = _batch_max(lx @ _mH(lx) - a)
        upper = _batch_max(np.triu(lx, 1))
        ok = (resid <= tol) & (upper <= tol)
        return ok, f"L L^H rebuilds refsim's matrix within {ulps} * u * n of its scale, L lower triangular"
    if kind == "qr":
        ok, what = None, []
        if "q" in xla:
            qx = _wide(xla["q"])
            k = qx.shape[-1]
            gram = _mH(qx) @ qx - np.eye(k)
            ok = _batch_max(gram) <= ulps * u * qx.shape[-2]
            what.append("Q^H Q = I")
        if "r" in xla:
            rx, rr = _wide(xla["r"]), _wide(ref["r"])
            n = rx.shape[-1]
            if "q" in xla:
                a = _wide(ref["q"]) @ rr
                resid = _batch_max(_wide(xla["q"]) @ rx - a)
                what.append("Q R rebuilds refsim's matrix")
            else:
                a = _mH(rr) @ rr
                resid = _batch_max(_mH(rx) @ rx - a)
                what.append("R^H R rebuilds refsim's Gram matrix")
            tol = ulps * u * max(rx.shape[-2], n) * _batch_max(a)
            lower = _batch_max(np.tril(rx, -1))
            r_ok = (resid <= tol) & (lower <= tol)
            ok = r_ok if ok is None else ok & r_ok
            what.append("R upper triangular")
        return ok, ", ".join(what) + f" within {ulps} * u * n of the scale"
    raise ValueError(kind)


# -- the policy ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ConditionedBound(ScaledBound):
    """The scaled bound times kappa**level (module docstring), per matrix of the batch where a
    factor's invariants were checked; `bounds[d]` holds device d's per-element bound."""

    kappa: float = 1.0
    level: int = 1
    invariant: str = ""
    broken: int = 0                                   # matrices of the batch that broke the invariants
    bounds: dict = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        text = (f"conditioned bound: |diff| <= {self.ulps} ulp of max|output| * kappa"
                f"{'**2' if self.level == 2 else ''} (kappa {self.kappa:.3g})")
        if self.invariant:
            text += f"; invariants {'broken in ' + str(self.broken) + ' matrices' if self.broken else 'hold'}"
        return text

    def why(self, exact: bool = False) -> str:
        text = (f"conditioned bound: |xla - refsim| <= {self.ulps} * u * max|refsim output| (max {self.scale:.6g}) "
                f"* kappa{'**2' if self.level == 2 else ''}, kappa = {self.kappa:.3g} the largest condition number "
                "of the program's factorizations (refsim's values), at most the output's scale (docs/oracle.md)")
        if self.invariant:
            text += (f"; invariants ({self.invariant}): "
                     + (f"broken in {self.broken} matrices of the batch, which keep the bound without kappa"
                        if self.broken else "hold"))
        return text

    def reference_and_bound(self, device_id: int, out_dtype):
        ref = np.asarray(self.exact[device_id])
        return ref, np.broadcast_to(np.asarray(self.bounds[device_id], np.float64), ref.shape)

    def allowed(self, out_dtype) -> float:
        return float(max((np.max(b) for b in self.bounds.values() if np.size(b)), default=0.0))


def _factor(kappa: float, level: int, ulps: int, u: float) -> float:
    """kappa**level, capped where ulps * u * factor reaches 1 (the output's own scale)."""
    if not np.isfinite(kappa):
        return 1.0 / (ulps * u) if ulps else 1.0
    f = max(1.0, kappa) ** level
    return min(f, 1.0 / (ulps * u)) if ulps else f


def _bound_for(arr, base: ScaledBound, per_matrix: np.ndarray | None, dtype, **fields) -> ConditionedBound:
    """A ConditionedBound for refsim's `arr` whose per-element bound is base's allowed times
    `per_matrix` (one factor per matrix of the batch: the array's last two dims) or `fields`' factor."""
    plain = base.allowed(dtype)
    cap = max(plain, base.scale)                  # never past the output's own scale
    shards = {int(s.device_id): np.asarray(s.data) for s in arr.shards}
    factor = fields.pop("factor", 1.0)
    if per_matrix is None:
        bounds = {d: np.float64(min(plain * factor, cap)) for d in shards}
    else:
        glob = np.broadcast_to(np.minimum(plain * per_matrix, cap)[..., None, None], arr.shape)
        bounds = {int(s.device_id): glob[tuple(s.index)] for s in arr.shards}
    return ConditionedBound(n=1, exact=shards, abs_sum=base.abs_sum, ulps=base.ulps, narrow_ulps=base.narrow_ulps,
                            bounds=bounds, **fields)


def apply(closed, ref: list, xla: list, pols: list, conditions: Conditions, ulps: int = DEFAULT_ULPS) -> list:
    """The policies with `ConditionedBound` for the floating outputs (still under the automatic
    `ScaledBound`) that depend on a factorization or triangular solve; unchanged otherwise."""
    if conditions is None or not conditions.seen:
        return pols
    jaxpr = closed.jaxpr
    if len(jaxpr.outvars) != len(ref):
        return pols
    lev, org = levels(jaxpr)
    pols = list(pols)
    # factors reached through masking / placement: their invariants, per origin equation
    by_eqn: dict = {}
    for k, o in enumerate(org):
        if o is not None and type(pols[k]) is ScaledBound:
            by_eqn.setdefault(o.eqn, {})[(o.primitive, o.index)] = k
    checked: dict = {}
    for roles in by_eqn.values():
        kind_roles = {}
        for (prim, index), k in roles.items():
            if prim == "cholesky" and index == 0:
                kind_roles.setdefault("cholesky", {})["l"] = k
            elif prim == "qr" and index in (0, 1):
                kind_roles.setdefault("qr", {})["q" if index == 0 else "r"] = k
        for kind, rk in kind_roles.items():
            if any(tuple(xla[k].shape) != tuple(ref[k].shape) or np.ndim(ref[k]) < 2 for k in rk.values()):
                continue
            u = compare.unit_roundoff(ref[next(iter(rk.values()))].dtype)
            try:
                ok, what = invariants(kind, {r: np.asarray(xla[k]) for r, k in rk.items()},
                                      {r: np.asarray(ref[k]) for r, k in rk.items()}, ulps, u)
            except Exception:  # noqa: BLE001 - no invariant: the kappa bound alone
                continue
            for k in rk.values():
                checked[k] = (np.asarray(ok, bool), what)
    for k, (p, level) in enumerate(zip(pols, lev)):
        if level == 0 or type(p) is not ScaledBound:
            continue
        dtype = np.dtype(ref[k].dtype)
        u = compare.unit_roundoff(np.float32 if p.narrow_ulps else dtype)
        factor = _factor(conditions.kappa, level, p.ulps, u)
        if k in checked:
            ok, what = checked[k]
            per = np.where(ok, factor, 1.0)
            pols[k] = _bound_for(ref[k], p, per, dtype, kappa=conditions.kappa, level=level, invariant=what,
                                 broken=int(np.sum(~ok)))
        else:
            pols[k] = _bound_for(ref[k], p, None, dtype, factor=factor, kappa=conditions.kappa, level=level)
    return pols
