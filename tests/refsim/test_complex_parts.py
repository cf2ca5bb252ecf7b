"""A complex value built from parts keeps each part: a non-finite imaginary part must not turn the
real part into NaN (NumPy's ``1j * inf`` is ``nan+infj``)."""
from __future__ import annotations

import jax
import numpy as np

import refsim
from conformance.verdict.platform_models import flush_subnormals
from conformance.suites.base import special_fill
from refsim.values import complex_from_parts

NAN, INF = float("nan"), float("inf")


def test_lax_complex_with_non_finite_imaginary_parts_matches_jax():
    re_ = np.array([1.0, -2.0, 0.5, NAN], np.float32)
    im = np.array([INF, NAN, -INF, 3.0], np.float32)
    got = np.asarray(refsim.jit(jax.lax.complex)(re_, im))
    want = np.asarray(jax.lax.complex(re_, im))
    # by hand: each part as given
    np.testing.assert_array_equal(got.real, re_)
    np.testing.assert_array_equal(got.imag, im)
    np.testing.assert_array_equal(got.real, want.real)
    np.testing.assert_array_equal(got.imag, want.imag)


def test_complex_from_parts_and_flush_keep_parts_apart():
    z = complex_from_parts(np.float32(2.0), np.float32(INF), np.complex64)
    assert z.real == 2.0 and z.imag == INF
    f = flush_subnormals(np.array([complex(INF, NAN), complex(1e-40, INF)], np.complex64))
    assert f[0].real == INF and np.isnan(f[0].imag)
    assert f[1].real == 0.0 and f[1].imag == INF


def test_complex_special_data_has_non_finite_imaginary_parts_with_finite_real_parts():
    rng = np.random.default_rng(0)
    x = special_fill(rng, np.zeros(4000, np.complex64), kinds=("nan", "inf"))
    lone = np.isfinite(x.real) & ~np.isfinite(x.imag)
    assert lone.any(), "no element with a non-finite imaginary part alone"
