"""Complex constants in StableHLO: the MLIR Python bindings cannot downcast a dense complex attribute,
so refsim.stablehlo reads it from the op's printed form (a complex reduction's zero, a complex scale)."""
import numpy as np
import pytest

from refsim.stablehlo.plan import complex_dense_from_text


@pytest.mark.parametrize("text,want", [
    ('%c = stablehlo.constant dense<(1.000000e+00,2.000000e+00)> : tensor<complex<f32>>', np.complex64(1 + 2j)),
    ('%c = stablehlo.constant dense<(0.000000e+00,-0.000000e+00)> : tensor<2xcomplex<f64>>',
     np.zeros(2, np.complex128)),
    ('%c = stablehlo.constant dense<[(1.5,2.0), (-3.0,4.25)]> : tensor<2xcomplex<f32>>',
     np.array([1.5 + 2j, -3 + 4.25j], np.complex64)),
])
def test_a_dense_complex_literal_is_read_from_the_text(text, want):
    got = complex_dense_from_text(text, "value")
    assert got.dtype == np.asarray(want).dtype and got.shape == np.shape(want)
    np.testing.assert_array_equal(got, want)


def test_hex_form():
    raw = np.array([1 + 2j, 3 - 4j], np.complex64)
    text = f'%c = stablehlo.constant dense<"0x{raw.tobytes().hex().upper()}"> : tensor<2xcomplex<f32>>'
    np.testing.assert_array_equal(complex_dense_from_text(text, "value"), raw)


def test_a_complex_reduction_interprets(monkeypatch):
    import jax
    import jax.numpy as jnp

    from refsim import stablehlo

    a = np.array([1 + 1j, 2 - 1j, 0.5j, -3], np.complex64)
    text = jax.jit(lambda x: jnp.sum(x * (1 + 2j))).lower(a).as_text()
    (got,) = stablehlo.interpret(text, a)
    want = sum(complex(v) * (1 + 2j) for v in a)     # exact in these small values
    assert np.asarray(got).reshape(()) == np.complex64(want)


def test_a_non_complex_attribute_it_cannot_read_is_a_type_error():
    with pytest.raises(TypeError, match="neither readable"):
        complex_dense_from_text("%c = stablehlo.foo {x = #weird<1>}", "x")
