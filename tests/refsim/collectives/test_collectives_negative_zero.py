"""psum's negative-zero pass reads the operands only where an output is zero."""
import numpy as np
import pytest

import refsim.collectives as C
from refsim import Mesh
from refsim.collectives import reductions
from refsim.collectives.reductions import ordered_reduce

M24 = Mesh((2, 4), ("x", "y"))


@pytest.fixture
def scans(monkeypatch):
    """The operand counts each call of the negative-zero scan looked at."""
    seen = []
    real = reductions._all_negative_zero
    monkeypatch.setattr(reductions, "_all_negative_zero", lambda xs: seen.append(xs.shape) or real(xs))
    return seen


def test_no_zero_output_no_scan(scans):
    x = np.arange(1.0, 1.0 + 2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
    out = C.psum(x, ("x", "y"), mesh=M24)
    assert np.asarray(out).reshape(-1).tolist() == x.sum((0, 1)).tolist()
    C.psum(x.astype(np.complex64) * (1 + 1j), "y", mesh=M24)
    assert scans == [], "the operands were scanned although no output is zero"


def test_an_all_negative_zero_sum_keeps_its_sign(scans):
    x = np.ones((2, 4, 3), np.float32)
    x[:, :, 1] = -0.0           # every operand -0: -0
    x[:, :, 2] = 0.0            # +0 operands: +0
    x[0, 0, 2] = -0.0
    out = np.asarray(C.psum(x, ("x", "y"), mesh=M24)).reshape(3)
    assert out.tolist() == [8.0, 0.0, 0.0]
    assert np.signbit(out).tolist() == [False, True, False]
    assert scans and all(s[-1] == 2 for s in scans), f"scanned more than the zero outputs: {scans}"


def test_a_cancelling_sum_is_positive_zero():
    x = np.array([[1.5, -0.0, 2.0], [-1.5, -0.0, -2.0]], np.float64)  # n = 2 members, 3 elements
    got = ordered_reduce(np.add, x)
    assert got.tolist() == [0.0, 0.0, 0.0] and np.signbit(got).tolist() == [False, True, False]


def test_scalar_and_complex_parts():
    assert np.signbit(ordered_reduce(np.add, np.array([-0.0, -0.0], np.float32)))
    assert not np.signbit(ordered_reduce(np.add, np.array([-0.0, 0.0], np.float32)))
    z = ordered_reduce(np.add, np.array([[complex(1, -0.0)], [complex(2, -0.0)]], np.complex128))
    assert z.real.tolist() == [3.0] and np.signbit(z.imag).tolist() == [True]
