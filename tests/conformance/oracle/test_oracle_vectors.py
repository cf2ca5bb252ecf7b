"""Eigen/singular vectors in the oracle (conformance.oracle.vectors): compared up to sign,
phase and rotation within repeated values, and still caught when wrong.

Hand-built factorizations give refsim's side and the "XLA" side (valid or broken variants);
the end-to-end cases run XLA:CPU's LAPACK against refsim's NumPy."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import conformance
import refsim
from conformance.verdict import compare
from conformance.oracle import policy, vectors

S2 = np.sqrt(0.5)
# an orthogonal matrix by hand: columns e0+e1, e0-e1 (normalised), e2
Q = np.array([[S2, S2, 0.0], [S2, -S2, 0.0], [0.0, 0.0, 1.0]])


def _placed(batch):
    sh = refsim.NamedSharding(refsim.Mesh((2,), ("i",)), refsim.P("i"))
    return refsim.device_put(np.asarray(batch), sh)


def _verdict(fn, a, ref_outs, xla_outs):
    closed = jax.make_jaxpr(jax.jit(fn))(a)
    ref = [_placed(o) for o in ref_outs]
    xla = [_placed(o) for o in xla_outs]
    pols = policy.choose(ref, {"eigh", "svd"})
    xla, pols = vectors.apply(closed, ref, xla, pols)
    return compare.compare(ref, xla, tolerances=pols), pols


def _eigh_case(lams):
    a = np.stack([Q @ np.diag(lams) @ Q.T] * 2).astype(np.float32)
    v = np.stack([Q, Q]).astype(np.float32)
    w = np.stack([lams, lams]).astype(np.float32)
    return a, v, w


def test_eigh_vectors_with_other_signs_agree_and_swapped_ones_do_not():
    a, v, w = _eigh_case([1.0, 2.0, 4.0])
    res, pols = _verdict(lax.linalg.eigh, a, [v, w], [v * np.float32([-1, 1, -1]), w])
    assert res.ok and isinstance(pols[0], vectors.VectorsBound) and not isinstance(pols[1], vectors.VectorsBound)
    # bound by hand for column 0: 256 * 2**-24 * (1 + 4 / gap 1), plus float32's smallest subnormal
    assert pols[0].bounds[0][0, 0, 0] == pytest.approx(256 * 2.0 ** -24 * 5, rel=1e-6)
    swapped = v[..., [1, 0, 2]]
    assert not _verdict(lax.linalg.eigh, a, [v, w], [swapped, w])[0].ok
    assert not _verdict(lax.linalg.eigh, a, [v, w], [v, w + np.float32([0, 0, 0.5])])[0].ok


def test_eigh_repeated_eigenvalue_admits_any_basis_of_its_space_only():
    a, v, w = _eigh_case([1.0, 1.0, 4.0])
    c, s = np.cos(0.5), np.sin(0.5)
    turned = v.copy()
    turned[..., :2] = v[..., :2] @ np.float32([[c, -s], [s, c]])
    assert _verdict(lax.linalg.eigh, a, [v, w], [turned, w])[0].ok
    wrong = v.copy()
    wrong[..., 1] = v[..., 2]                      # a vector of the other eigenspace
    wrong[..., 2] = v[..., 1]
    assert not _verdict(lax.linalg.eigh, a, [v, w], [wrong, w])[0].ok


def test_complex_eigenvectors_agree_up_to_a_phase():
    a, v, w = _eigh_case([1.0, 2.0, 4.0])
    ac, vc = a.astype(np.complex64), v.astype(np.complex64)
    phases = np.exp(1j * np.array([0.3, -2.0, 1.0])).astype(np.complex64)
    assert _verdict(lax.linalg.eigh, ac, [vc, w], [vc * phases, w])[0].ok
    assert not _verdict(lax.linalg.eigh, ac, [vc, w], [vc * np.complex64([1, 1, 1j]) * 1.01, w])[0].ok


def test_svd_left_and_right_vectors_turn_together():
    perm = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])   # V
    s = np.array([4.0, 2.0, 1.0])
    a = np.stack([Q @ np.diag(s) @ perm.T] * 2).astype(np.float32)
    u, vh = np.stack([Q] * 2).astype(np.float32), np.stack([perm.T] * 2).astype(np.float32)
    ss = np.stack([s, s]).astype(np.float32)
    flip = np.float32([-1, 1, 1])
    both = [u * flip, ss, vh * flip[:, None]]                # u_0 and v_0 negated together: valid
    assert _verdict(lax.linalg.svd, a, [u, ss, vh], both)[0].ok
    one_side = [u * flip, ss, vh]                            # U S V^T no longer gives a
    assert not _verdict(lax.linalg.svd, a, [u, ss, vh], one_side)[0].ok


def test_svd_null_space_columns_rotate_freely():
    # a 4x2 matrix: u's last two columns span the null space of a^T, any basis of it is valid
    u4 = np.eye(4)
    a = np.stack([u4[:, :2] @ np.diag([3.0, 1.0])] * 2).astype(np.float32)
    u, ss, vh = np.stack([u4] * 2).astype(np.float32), np.float32([[3, 1], [3, 1]]), np.stack([np.eye(2)] * 2)
    vh = vh.astype(np.float32)
    c, s = np.cos(1.0), np.sin(1.0)
    turned = u.copy()
    turned[..., 2:] = u[..., 2:] @ np.float32([[c, -s], [s, c]])
    assert _verdict(lax.linalg.svd, a, [u, ss, vh], [turned, ss, vh])[0].ok


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
@pytest.mark.parametrize("name", ["eigh", "svd", "svd_thin", "jnp_eigh", "jnp_svd"])
def test_xla_lapack_factorizations_agree_with_refsim(name, dtype):
    fn = {"eigh": lax.linalg.eigh, "svd": lax.linalg.svd,
          "svd_thin": lambda x: lax.linalg.svd(x, full_matrices=False),
          "jnp_eigh": jax.numpy.linalg.eigh, "jnp_svd": jax.numpy.linalg.svd}[name]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 6, 6)) + (1j * rng.standard_normal((4, 6, 6)) if dtype == np.complex64 else 0)
    if "eigh" in name:
        x = x @ np.conj(np.swapaxes(x, -1, -2))
    mesh = jax.make_mesh((2,), ("i",), axis_types=(AxisType.Auto,), devices=jax.devices()[:2])
    arg = jax.device_put(x.astype(dtype), NamedSharding(mesh, P("i")))
    res = conformance.check(jax.jit(fn), arg)
    assert any(p.startswith("vectors up to sign") for p in res.policies), res.policies
