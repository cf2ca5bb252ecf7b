"""Eigenvectors and singular vectors compared up to what the maths leaves free.

`eigh` and `svd` define each vector only up to a sign (a phase for complex values), and the
vectors of a repeated eigenvalue or singular value only up to a rotation of their subspace:
LAPACK on XLA and NumPy on refsim legitimately return different, equally valid, bases. So
when a program returns the vectors of an `eigh` together with its eigenvalues (or of an `svd`
together with its singular values), directly through top-level jits, the oracle

* groups the values (refsim's, per matrix of the batch) into clusters of values closer than
  ``sqrt(ulps * u) * scale`` (u the unit roundoff, scale = max |value| = the matrix 2-norm),
* rotates XLA's vectors of each cluster onto refsim's: ``X_C Q`` with Q the unitary polar
  factor of ``X_C^H R_C`` (orthogonal Procrustes; a sign or a phase for a simple value). The
  left and right singular vectors of a nonzero singular value share one Q, so a sign flipped
  on one side only is still a disagreement; null-space vectors rotate on their own;
* compares the rotated vectors with refsim's element by element within
  ``ulps * u * (1 + scale / gap)``, gap the distance from the cluster to the other values
  (Davis-Kahan / Wedin: a backward error of a few u * scale turns a vector by at most
  error / gap). The values keep the scaled bound (Weyl: they move by at most the error).

The rotation Q is computed from XLA's assembled global value and applied to every device's
own shard, so replicas that disagree stay visible. Outputs that turn with the vectors (the
tangents of a jvp, `align_companions`) are turned by the same rotation; they and other
programs that transform the vectors further get the conditioned bound
(`conformance.oracle.factorizations`).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from conformance.verdict import compare
from conformance.oracle.policy import DEFAULT_ULPS, ScaledBound

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.

#: Containers the search looks through: the output of the container is its body's output.
_CALLS = ("jit", "pjit", "closed_call", "core_call")


@dataclasses.dataclass(frozen=True)
class Group:
    """The outputs of one eigh / svd the program returns: output positions by role."""

    kind: str                 # "eigh" or "svd"
    values: int               # eigenvalues w / singular values s
    vectors: tuple            # ((role, position), ...): role "v" (eigh), "u" or "vh" (svd)


def _producer(jaxpr, var, made: dict):
    """(eqn, output index) of the eigh / svd equation that produces `var`, looking through
    container calls; None when another primitive produces it. `made` caches, per jaxpr, which
    equation produces each variable."""
    key = id(jaxpr)
    if key not in made:
        made[key] = {o: (eqn, i) for eqn in jaxpr.eqns for i, o in enumerate(eqn.outvars)}
    hit = made[key].get(var)
    if hit is None:
        return None
    eqn, i = hit
    name = eqn.primitive.name
    if name in ("eigh", "svd"):
        return eqn, i
    inner = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
    if name in _CALLS and inner is not None:
        j = getattr(inner, "jaxpr", inner)
        out = j.outvars[i]
        return None if _is_literal(out) else _producer(j, out, made)
    return None


def _is_literal(v) -> bool:
    from jax.extend import core as jcore

    return isinstance(v, jcore.Literal)


def groups(closed) -> list[Group]:
    """The eigh / svd equations whose vectors and values are both program outputs."""
    jaxpr = closed.jaxpr
    found: dict = {}
    made: dict = {}
    for pos, var in enumerate(jaxpr.outvars):
        hit = None if _is_literal(var) else _producer(jaxpr, var, made)
        if hit is not None:
            found.setdefault(id(hit[0]), (hit[0], {}))[1].setdefault(hit[1], pos)
    out = []
    for eqn, by_index in found.values():
        p = eqn.params
        if p.get("subset_by_index") is not None:
            continue                               # the values outside the subset are unknown
        if eqn.primitive.name == "eigh" and 1 in by_index and 0 in by_index:
            out.append(Group("eigh", by_index[1], (("v", by_index[0]),)))
        elif eqn.primitive.name == "svd" and p.get("compute_uv", True) and 0 in by_index:
            roles = tuple((r, by_index[i]) for i, r in ((1, "u"), (2, "vh")) if i in by_index)
            if roles:
                out.append(Group("svd", by_index[0], roles))
    return out


# -- clusters and bounds, one matrix at a time ----------------------------------------------------
def _clusters(values: np.ndarray, tau: float) -> list[np.ndarray]:
    """Indices of `values` grouped by single linkage at distance <= tau (sorted within)."""
    order = np.argsort(values, kind="stable")
    out, cur = [], [order[0]] if order.size else []
    for a, b in zip(order[:-1], order[1:]):
        if values[b] - values[a] <= tau:
            cur.append(b)
        else:
            out.append(np.sort(np.array(cur)))
            cur = [b]
    if cur:
        out.append(np.sort(np.array(cur)))
    return out


def _gap(values, members) -> float:
    rest = np.delete(values, members)
    if rest.size == 0:
        return np.inf
    return float(np.min(np.abs(rest[:, None] - values[members][None, :])))


def _polar(m: np.ndarray) -> np.ndarray:
    """The unitary polar factor of a square matrix: the rotation closest to it."""
    w, _, zh = np.linalg.svd(m)
    return w @ zh


@dataclasses.dataclass
class _Plan:
    """Per matrix of the batch: which columns rotate together, with which bound."""

    clusters: list            # [(columns of u or v, columns of vh's rows or None, joint)]
    bound: dict               # role -> per-column bound (1-D)


def _plan(kind: str, values: np.ndarray, shapes: dict, ulps: int, u: float) -> _Plan:
    scale = float(np.max(np.abs(values))) if values.size else 0.0
    tau = np.sqrt(ulps * u) * scale
    if kind == "eigh":
        cl = _clusters(values, tau)
        per = np.empty(values.shape[0])
        for c in cl:
            per[c] = ulps * u * (1 + scale / _gap(values, c))
        return _Plan([(c, None, False) for c in cl], {"v": per})
    # svd: u's columns past k and vh's rows past k belong to singular value 0 (null spaces)
    k = values.shape[0]
    m = shapes["u"][-1] if "u" in shapes else k
    n = shapes["vh"][-2] if "vh" in shapes else k
    ext = np.concatenate([values, np.zeros(max(m, n) - k)])
    cl = _clusters(ext, tau)
    plan, bound = [], {"u": np.empty(m), "vh": np.empty(n)}
    for c in cl:
        b = ulps * u * (1 + scale / _gap(ext, c))
        cu, cv = c[c < m], c[c < n]
        bound["u"][cu], bound["vh"][cv] = b, b
        if ext[c].max() > tau:                          # nonzero singular values: u, v turn together
            plan.append((cu, cv, True))
        else:                                           # null spaces: each side on its own
            plan.append((cu, None, False))
            plan.append((None, cv, False))
    return _Plan(plan, bound)


def _rotations(plan: _Plan, xla: dict, ref: dict) -> list:
    """[(columns of u / v, rows of vh, Q)]: the rotation of each cluster (columns as vectors)."""
    cols = lambda role, a: a if role != "vh" else np.conj(np.swapaxes(a, -1, -2))  # noqa: E731
    first = "v" if "v" in xla else "u"
    out = []
    for cu, cv, joint in plan.clusters:
        m = 0
        if cu is not None and cu.size and first in xla:
            m = m + cols(first, xla[first])[:, cu].conj().T @ cols(first, ref[first])[:, cu]
        if cv is not None and cv.size and "vh" in xla and (joint or cu is None):
            m = m + cols("vh", xla["vh"])[:, cv].conj().T @ cols("vh", ref["vh"])[:, cv]
        if np.ndim(m) == 2:
            out.append((cu, cv if (joint or cu is None) else None, _polar(m)))
    return out


def _rotate(block: np.ndarray, role: str, rots: list) -> np.ndarray:
    """`block` (a matrix of `role`, all its vector columns present) with each cluster turned."""
    out = block.copy()
    for cu, cv, q in rots:
        if role == "vh":
            if cv is not None and cv.size:
                # rows of vh are conj(v)^T: v_C Q as rows is Q^H vh_C
                out[cv, :] = np.conj(q).T @ block[cv, :]
        elif cu is not None and cu.size:
            out[:, cu] = block[:, cu] @ q
    return out


# -- the policy -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class VectorsBound(ScaledBound):
    """Vectors of an eigh / svd: XLA's turned onto refsim's per cluster, then an elementwise
    bound growing with 1 / gap (module docstring). `bounds[d]` holds device d's bound."""

    role: str = "v"
    bounds: dict = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        return (f"vectors up to sign/phase and rotation of repeated values: |diff| <= {self.ulps} ulp "
                "* (1 + max|value| / gap)")

    def why(self, exact: bool = False) -> str:
        return ("eigen/singular vectors: XLA's turned onto refsim's within each cluster of values, then "
                f"|xla - refsim| <= {self.ulps} * u * (1 + scale / gap) per vector (docs/oracle.md)")

    def reference_and_bound(self, device_id: int, out_dtype):
        return np.asarray(self.exact[device_id]), np.asarray(self.bounds[device_id])

    def allowed(self, out_dtype) -> float:
        """The largest bound of any element (the report's 'allowed')."""
        return float(max((np.max(b) for b in self.bounds.values() if np.size(b)), default=0.0))


def policies(group: Group, ref: list, ulps: int = DEFAULT_ULPS) -> dict:
    """{output position: VectorsBound} for the vectors of `group`, from refsim's outputs."""
    values = np.asarray(ref[group.values])
    shapes = {role: tuple(ref[pos].shape) for role, pos in group.vectors}
    batch = values.shape[:-1]
    local = {r: s[len(batch):] for r, s in shapes.items()}
    dtype = ref[group.vectors[0][1]].dtype
    u = compare.unit_roundoff(dtype)
    per_role = {role: np.empty(shapes[role], np.float64) for role, _ in group.vectors}
    for b in np.ndindex(*batch):
        plan = _plan(group.kind, values[b].astype(np.float64), local, ulps, u)
        for role, _ in group.vectors:
            col = plan.bound[role] + float(compare._finfo(dtype).smallest_subnormal)
            per_role[role][b] = col[None, :] if role != "vh" else col[:, None]
    out = {}
    for role, pos in group.vectors:
        arr = ref[pos]
        shards = {int(s.device_id): np.asarray(s.data) for s in arr.shards}
        bounds = {int(s.device_id): per_role[role][tuple(s.index)] for s in arr.shards}
        base = ScaledBound.of(arr, ulps)
        out[pos] = VectorsBound(n=1, exact=shards, abs_sum=base.abs_sum, ulps=int(ulps), role=role, bounds=bounds)
    return out


def rotations(group: Group, ref: list, xla: list, ulps: int = DEFAULT_ULPS) -> dict:
    """{batch index: [(columns of u / v, rows of vh, Q)]}: the rotation turning XLA's vectors of
    each cluster onto refsim's, per matrix of the batch."""
    values = np.asarray(ref[group.values])
    batch = values.shape[:-1]
    roles = dict(group.vectors)
    xg = {r: np.asarray(xla[p]) for r, p in roles.items()}
    rg = {r: np.asarray(ref[p]) for r, p in roles.items()}
    u = compare.unit_roundoff(ref[group.vectors[0][1]].dtype)
    shapes = {r: a.shape[len(batch):] for r, a in rg.items()}
    rots = {}
    for b in np.ndindex(*batch):
        plan = _plan(group.kind, values[b].astype(np.float64), shapes, ulps, u)
        rots[b] = _rotations(plan, {r: _wide(a[b]) for r, a in xg.items()}, {r: _wide(a[b]) for r, a in rg.items()})
    return rots


def _wide(a):
    return a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)


def turn(arr, role: str, rots: dict, nb: int):
    """refsim.Array `arr` (XLA's: vectors of `role`, or a quantity that turns with them, such as
    their tangent) with every matrix of the batch turned by `rots`, shard by shard."""
    from refsim.array import Array, Shard

    batch = tuple(arr.shape[:nb])
    turned = None
    shards = []
    for s in arr.shards:
        idx = tuple(s.index) + (slice(None),) * (arr.ndim - len(tuple(s.index)))
        data = np.asarray(s.data)
        full = all(isinstance(i, slice) and i.indices(n)[:2] == (0, n) and i.indices(n)[2] == 1
                   for i, n in zip(idx[nb:], arr.shape[nb:]))
        if full:
            new = np.empty_like(data)
            starts = [i.indices(n)[0] if isinstance(i, slice) else i for i, n in zip(idx[:nb], arr.shape[:nb])]
            for lb in np.ndindex(*data.shape[:nb]):
                gb = tuple(st + k for st, k in zip(starts, lb))
                new[lb] = _rotate(_wide(data[lb]), role, rots[gb]).astype(data.dtype) if rots[gb] else data[lb]
        else:                                       # vectors split across devices: the global
            if turned is None:
                g = np.asarray(arr)
                turned = np.empty_like(g)
                for b in np.ndindex(*batch):
                    turned[b] = _rotate(_wide(g[b]), role, rots[b]).astype(g.dtype) if rots[b] else g[b]
            new = turned[idx]
        shards.append(Shard(s.device_id, s.index, new, s.replica_id))
    return Array(arr.shape, arr.dtype, arr.sharding, shards)


def align(group: Group, ref: list, xla: list, ulps: int = DEFAULT_ULPS) -> dict:
    """{output position: XLA's vectors turned onto refsim's} for `group` (refsim.Arrays)."""
    rots = rotations(group, ref, xla, ulps)
    nb = np.ndim(ref[group.values]) - 1
    return {pos: turn(xla[pos], role, rots, nb) for role, pos in group.vectors}


def _max_diff(a, b) -> float:
    a, b = _wide(np.asarray(a)), _wide(np.asarray(b))
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b)
    return float(np.nanmax(d)) if d.size else 0.0


def align_companions(group: Group, ref: list, xla: list, pols: list, ulps: int = DEFAULT_ULPS) -> dict:
    """{output position: XLA's output turned like the vectors of `group`} for the other outputs
    that transform with them: a jvp's tangent of the vectors (JAX's eigh / svd jvp rules are
    covariant: vectors V Q give tangents dV Q). A floating output shaped like one of the vector
    outputs, outside its bound as it is, is turned by the vectors' rotation when that brings it
    closer to refsim's (an output that does not transform with the vectors, such as a
    reconstruction, stays as it is)."""
    positions = {p for _, p in group.vectors} | {group.values}
    nb = np.ndim(ref[group.values]) - 1
    shapes = {role: tuple(ref[p].shape) for role, p in group.vectors}
    out, rots = {}, None
    for k, (r, x, p) in enumerate(zip(ref, xla, pols)):
        if k in positions or not isinstance(p, ScaledBound) or type(p) is not ScaledBound:
            continue
        if tuple(x.shape) != tuple(r.shape) or tuple(r.shape) not in shapes.values():
            continue
        base = _max_diff(x, r)
        if base <= p.allowed(r.dtype):
            continue
        if rots is None:
            rots = rotations(group, ref, xla, ulps)
        best = None
        for role, shape in shapes.items():
            if shape != tuple(r.shape):
                continue
            cand = turn(x, role, rots, nb)
            d = _max_diff(cand, r)
            if d < base and (best is None or d < best[0]):
                best = (d, cand)
        if best is not None:
            out[k] = best[1]
    return out


def apply(closed, ref: list, xla: list, pols: list, ulps: int = DEFAULT_ULPS) -> tuple[list, list]:
    """(XLA's outputs with eigen/singular vectors turned onto refsim's, the policies with
    `VectorsBound` for them); unchanged where the program returns no such group, or where a
    policy other than the automatic scaled bound was chosen for the vectors."""
    xla, pols = list(xla), list(pols)
    for g in groups(closed):
        positions = [p for _, p in g.vectors] + [g.values]
        if any(p >= len(ref) or not isinstance(pols[p], ScaledBound) for p in positions):
            continue
        if any(tuple(xla[p].shape) != tuple(ref[p].shape) for p in positions):
            continue                                    # compare reports the shape mismatch
        new_pols = policies(g, ref, ulps)
        new_xla = align(g, ref, xla, ulps)
        new_xla.update(align_companions(g, ref, xla, pols, ulps))    # rotations from XLA's own vectors
        for p in new_xla:
            xla[p] = new_xla[p]
        for p in new_pols:
            pols[p] = new_pols[p]
    return xla, pols
