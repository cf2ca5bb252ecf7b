"""The oracle names TF32 (XLA:GPU's documented float32 matmul default) as the likely cause of a
disagreement on a GPU, and says nothing elsewhere or when the verdict is AGREE."""
import jax
import jax.numpy as jnp
import numpy as np

from conformance.oracle import platform_notes


def _jaxpr(f, *args):
    return jax.make_jaxpr(f)(*args).jaxpr


A = np.ones((4, 4), np.float32)


def test_counts_default_precision_float32_dots_nested_included():
    def f(a, b):
        x = a @ b                                                  # 1: DEFAULT
        y = jnp.matmul(a, b, precision="highest")                  # not counted
        z = jax.lax.scan(lambda c, _: (c @ b, None), a, None, length=2)[0]   # 2: inside scan
        return x + y + z + (a.astype(jnp.bfloat16) @ b.astype(jnp.bfloat16)).astype(jnp.float32)  # bf16: no
    assert platform_notes.reduced_precision_dots(_jaxpr(f, A, A)) == 2


def test_notes_only_for_a_gpu_disagreement():
    jaxpr = _jaxpr(lambda a, b: a @ b, A, A)
    assert platform_notes.notes("cpu", jaxpr, ok=False) == []
    assert platform_notes.notes("gpu", jaxpr, ok=True) == []
    (note,) = platform_notes.notes("gpu", jaxpr, ok=False)
    assert "1 float32 dot_general" in note and "jax.default_matmul_precision('highest')" in note
    with jax.default_matmul_precision("highest"):
        assert platform_notes.notes("gpu", jaxpr, ok=False) == []
