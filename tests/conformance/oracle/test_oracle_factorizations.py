"""Factorizations in the oracle (conformance.oracle.factorizations): bounds that grow with the
conditioning refsim computes, and primal factors held to their invariants.

The ill-conditioned cases are XLA:CPU's own results, which equal LAPACK's float32 routines
(checked against SciPy's spotrf / cgeqrf here): they must agree. The wrong factors are XLA's
result with a real error planted (a flipped column of Q, a 1% perturbation), fed to the
oracle's comparison (`check.finish`) as XLA's output: they must disagree, however
ill-conditioned the matrix."""
from __future__ import annotations

import jax
import numpy as np
import pytest
import scipy.linalg.lapack as lapack
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import conformance
from conformance.oracle import check as chk
from conformance.oracle import factorizations


def _sharding():
    mesh = jax.make_mesh((2,), ("i",), axis_types=(AxisType.Auto,))
    return NamedSharding(mesh, P("i"))


def _ill_conditioned(kappa: float, dtype, n: int = 6, batch: int = 2, seed: int = 0) -> np.ndarray:
    """Hermitian positive definite matrices with eigenvalues spread log-evenly over [1/kappa, 1]."""
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(batch):
        z = rng.randn(n, n) + (1j * rng.randn(n, n) if np.dtype(dtype).kind == "c" else 0)
        q, _ = np.linalg.qr(z)
        w = np.logspace(0, -np.log10(kappa), n)
        out.append((q * w) @ q.conj().T)
    a = np.stack(out)
    return ((a + np.conj(np.swapaxes(a, -1, -2))) / 2).astype(dtype)


def _verdict(fn, args, change=None):
    """`check.finish`'s verdict on XLA's result of fn(*args), changed by `change` (a function of
    the list of output values) before the comparison, as a faulty platform would return it."""
    placed = [jax.device_put(a, _sharding()) for a in args]
    traced = chk.prepare(fn, tuple(placed), {})
    out = fn(*placed)
    if change is not None:
        leaves, tree = jax.tree_util.tree_flatten(out)
        values = change([np.array(x) for x in leaves])
        out = jax.tree_util.tree_unflatten(tree, [jax.device_put(v, x.sharding) for v, x in zip(values, leaves)])
    res, _, pols = chk.finish(traced, out, name="f", entry="jit")
    return res, pols


def test_kappa_of_cholesky_and_qr_by_hand():
    # diag(4, 1): L = diag(2, 1), kappa(A) = 4; R of diag(3, 1) has kappa 3
    assert factorizations.kappa_of("cholesky", {}, [np.diag([4.0, 1.0])], [np.diag([2.0, 1.0])]) == pytest.approx(4.0)
    assert factorizations.kappa_of("qr", {}, [np.diag([3.0, 1.0])], []) == pytest.approx(3.0)
    # eigenvalues 1, 2, 4: 1 + 4 / 1
    assert factorizations.kappa_of("eigh", {}, [np.eye(3, dtype=np.float32)],
                                   [None, np.array([1.0, 2.0, 4.0])]) == pytest.approx(5.0)


def test_ill_conditioned_float32_cholesky_equal_to_lapack_agrees():
    a = _ill_conditioned(1e5, np.float32)
    res, pols = _verdict(jax.jit(lax.linalg.cholesky), [a])
    xla = np.asarray(jax.jit(lax.linalg.cholesky)(jax.device_put(a, _sharding())))
    for b in range(a.shape[0]):                 # the premise: XLA:CPU is LAPACK's float32 potrf
        want, info = lapack.spotrf(a[b], lower=True, clean=True)
        assert info == 0 and np.array_equal(xla[b], want)
    assert res.ok, res.report()
    assert isinstance(pols[0], factorizations.ConditionedBound) and pols[0].level == 1
    assert pols[0].kappa > 1e4 and pols[0].broken == 0


def test_ill_conditioned_cholesky_jvp_agrees():
    a = _ill_conditioned(1e5, np.complex64)
    fn = jax.jit(lambda p, tt: jax.jvp(lax.linalg.cholesky, (p,), (tt,)))
    res, pols = _verdict(fn, [a, np.ones_like(a)])
    assert res.ok, res.report()
    assert [p.level for p in pols] == [1, 2] and pols[0].broken == 0


def test_ill_conditioned_complex_qr_jvp_agrees():
    a = _ill_conditioned(4e4, np.complex64)
    t = np.ones_like(a)
    fn = jax.jit(lambda p, tt: jax.jvp(lax.linalg.qr, (p,), (tt,)))
    q = np.asarray(jax.jit(lax.linalg.qr)(a)[0])
    want = lapack.cungqr(*lapack.cgeqrf(a[0])[:2])[0]      # the premise: LAPACK's float32 Q
    assert np.abs(q[0] - want).max() < 1e-5
    res, pols = _verdict(fn, [a, t])
    assert res.ok, res.report()
    assert [p.level for p in pols] == [1, 1, 2, 2]


def test_cholesky_factor_off_by_one_percent_disagrees_even_ill_conditioned():
    a = _ill_conditioned(1e5, np.float32)

    def perturb(vals):
        vals[0][1, 4, 2] *= 1.01
        return vals

    res, pols = _verdict(jax.jit(lax.linalg.cholesky), [a], perturb)
    assert not res.ok
    assert pols[0].broken == 1 and "invariants broken in 1 matrices" in pols[0].describe()


def test_qr_with_a_flipped_column_of_q_disagrees_even_ill_conditioned():
    a = _ill_conditioned(4e4, np.float32)

    def flip(vals):
        vals[0][0, :, 3] *= -1                      # Q R no longer rebuilds the matrix
        return vals

    res, pols = _verdict(jax.jit(lax.linalg.qr), [a], flip)
    assert not res.ok
    assert pols[0].broken == 1 and pols[1].broken == 1
    assert _verdict(jax.jit(lax.linalg.qr), [a])[0].ok


def test_well_conditioned_jvp_off_by_one_percent_disagrees():
    a = _ill_conditioned(4.0, np.float32)
    fn = jax.jit(lambda p, tt: jax.jvp(lax.linalg.cholesky, (p,), (tt,)))

    def perturb(vals):
        vals[1] = vals[1] * np.float32(1.01)
        return vals

    assert _verdict(fn, [a, np.ones_like(a)])[0].ok
    res, pols = _verdict(fn, [a, np.ones_like(a)], perturb)
    assert not res.ok and pols[1].level == 2 and pols[1].kappa < 5


def test_eigh_jvp_tangent_turns_with_its_vectors():
    rng = np.random.RandomState(1)
    x = rng.randn(2, 5, 5).astype(np.float32)
    a = x @ np.swapaxes(x, -1, -2)
    fn = jax.jit(lambda p, tt: jax.jvp(lax.linalg.eigh, (p,), (tt,)))

    def flip(vals):                                 # another valid gauge: vectors and tangents together
        vals[0][:, :, 1] *= -1
        vals[2][:, :, 1] *= -1
        return vals

    assert _verdict(fn, [a, np.ones_like(a)], flip)[0].ok

    def flip_tangent_only(vals):                    # a tangent in the wrong gauge: wrong
        vals[2][:, :, 1] *= -1
        return vals

    assert not _verdict(fn, [a, np.ones_like(a)], flip_tangent_only)[0].ok


def test_conformance_check_reports_the_kappa():
    a = _ill_conditioned(1e5, np.float32)
    res = conformance.check(jax.jit(lax.linalg.cholesky), jax.device_put(a, _sharding()))
    assert "conditioned bound" in res.outputs[0].policy and "invariants hold" in res.outputs[0].policy
