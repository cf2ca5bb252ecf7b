"""refsim's transcendentals give the same bits whatever SIMD kernels NumPy dispatches to.

NumPy picks its transcendental kernels at run time from the host's CPU features (AVX2,
AVX-512 with SVML, NEON, ...); `NPY_DISABLE_CPU_FEATURES` makes it pick older ones. Each
variant below evaluates one fixed batch -- every op of the accuracy contract, in float32,
float64 and bfloat16, over its domain plus hard inputs (signed zeros, infinities, NaN,
subnormals, domain edges, overflow thresholds, huge trigonometric arguments, values next to
1) -- through `refsim.jit` in a fresh process, and the results must be byte-identical.
Run as a script (`python tests/refsim/libm/test_accuracy_host_independence.py OUT.npz`) it writes the
batch's results: the child side of the test.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
DTYPES = ("float32", "float64", "bfloat16")


def _cpu_dispatch():
    """NumPy's dispatch targets that this host has, lowest first (NumPy >= 2: numpy._core)."""
    try:
        from numpy._core import _multiarray_umath as mu
    except ImportError:  # NumPy 1.26
        from numpy.core import _multiarray_umath as mu
    return [f for f in mu.__cpu_dispatch__ if mu.__cpu_features__.get(f)]


def variants() -> list[str | None]:
    """None (NumPy's own choice), then NPY_DISABLE_CPU_FEATURES values that turn off the best
    targets first: the best one, the best two, all ("AVX512_ICL", "X86_V4 AVX512_ICL",
    "X86_V3 X86_V4 AVX512_ICL" here). Only features the host has: naming one it lacks is an
    error in some NumPy versions."""
    found = _cpu_dispatch()
    counts = sorted({n for n in (1, 2, len(found)) if 0 < n <= len(found)})
    return [None] + [" ".join(found[len(found) - n:]) for n in counts]


def _hard_inputs(name: str, dtype) -> list[np.ndarray]:
    """Per operand: values where a kernel's branches and reductions are most fragile."""
    f = np.finfo(np.float32 if dtype != np.float64 else np.float64)
    common = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, 10.0, -10.0,
              float(f.tiny), -float(f.tiny), float(f.smallest_subnormal), float(f.max), -float(f.max),
              1e-8, -1e-8, 1e-30, 0.1, 88.72, -87.3, -103.9, 709.78, -708.4, -745.1, 1e22, -1e22,
              2.0 ** 1023 * 1.9, 6381956970095103 * 2.0 ** 797, 1e6, 12345.678]
    near_one = [1 + k * float(f.eps) for k in range(-4, 5)] + [-(1 + k * float(f.eps)) for k in range(-4, 5)]
    near_pio2 = [k * np.pi / 2 for k in (1, 2, 3, 4, 7, 100, 1000, 1 << 20, 1 << 30)]
    near_pio2 += [-v for v in near_pio2]
    specials = {"lgamma": [-0.5, -1.5, -2.5, -1e-3, 1.4616321449683622, 1e3, 171.6, 2.5e305],
                "digamma": [-0.5, -1.5, -2.5, -1e-3, 1.4616321449683622, 1e3, 1e15],
                "erf_inv": [0.999, -0.999, 0.9999999, 1 - float(f.eps), -1 + float(f.eps)],
                "cbrt": [8.0, -27.0, 64.0, 1e-300, 2.0 ** -1074],
                "pow": [-8.0, -2.0, 0.0, 1e-3, 4.0]}
    x = np.array(common + near_one + near_pio2 + specials.get(name, []), dtype=np.float64)
    if name not in ("atan2", "pow"):
        return [x]
    y = np.array([0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -3.0, 1.5, np.inf, -np.inf, np.nan, 1e3, -1e3,
                  1e300, 1e-300, 2.0 ** 53 + 2, 0.3333333333333333])
    xx, yy = np.meshgrid(x, y)
    return [xx.ravel(), yy.ravel()]


def _draw(lo: float, hi: float, n: int, rng) -> np.ndarray:
    """n values in [lo, hi], log-uniform magnitudes on each side of 0, made with exact
    operations only (np.exp would make the inputs themselves depend on the host)."""
    parts = []
    for sign, a, b in ((1.0, max(lo, 0.0), hi), (-1.0, max(-hi, 0.0), -lo)):
        if b <= 0 or b <= a:
            continue
        a = max(a, 1e-30)
        e = rng.integers(int(np.floor(np.log2(a))), int(np.ceil(np.log2(b))) + 1, n)
        parts.append(sign * np.clip(np.ldexp(rng.uniform(1.0, 2.0, n), e), a, b))
    return np.concatenate(parts)


def fingerprint_batch(samples: int = 1000) -> dict[str, np.ndarray]:
    """Inputs and refsim results of every contract op in each dtype (keys op/dtype/{in0,in1,out})."""
    import jax
    import ml_dtypes

    jax.config.update("jax_enable_x64", True)
    import refsim
    from refsim.interpreter.accuracy import ACCURACY, lax_function

    out = {}
    for name, spec in ACCURACY.items():
        for dname in DTYPES:
            dtype = ml_dtypes.bfloat16 if dname == "bfloat16" else np.dtype(dname)
            rng = np.random.default_rng(0)
            drawn = [_draw(lo, hi, samples, rng) for lo, hi in spec.domains]
            n = min(len(d) for d in drawn)
            hard = _hard_inputs(name, dtype)
            with np.errstate(all="ignore"):
                args = [np.concatenate([h, d[:n]]).astype(dtype) for h, d in zip(hard, drawn)]
                res = np.asarray(refsim.jit(lax_function(name))(*args))
            for i, a in enumerate(args):
                out[f"{name}/{dname}/in{i}"] = a.view(np.uint8)
            out[f"{name}/{dname}/out"] = res.view(np.uint8)
    return out


def _run_variant(disable: str | None, path: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NPY_DISABLE_CPU_FEATURES"}
    if disable:
        env["NPY_DISABLE_CPU_FEATURES"] = disable
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run([sys.executable, __file__, str(path)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, (
        f"the batch failed with NPY_DISABLE_CPU_FEATURES={disable!r}:\n{proc.stderr[-3000:]}")


def _first_difference(key: str, a: np.ndarray, b: np.ndarray, inputs) -> str:
    dname = key.split("/")[1]
    itemsize = {"float32": 4, "float64": 8, "bfloat16": 2}[dname]
    ra, rb = a.reshape(-1, itemsize), b.reshape(-1, itemsize)
    i = int(np.flatnonzero((ra != rb).any(axis=1))[0])
    ins = [bytes(x.reshape(-1, itemsize)[i]).hex() for x in inputs]
    return f"{key}: element {i}, input bytes {ins}: {bytes(ra[i]).hex()} vs {bytes(rb[i]).hex()}"


@pytest.mark.slow
def test_results_do_not_depend_on_numpy_cpu_dispatch(tmp_path):
    cases = variants()
    if len(cases) == 1:
        pytest.skip("NumPy has no dispatch target on this host beyond its baseline: one variant only")
    runs = {}
    for disable in cases:
        path = tmp_path / f"{len(runs)}.npz"
        _run_variant(disable, path)
        runs[disable] = dict(np.load(path))
    base = runs[None]
    from refsim.interpreter.accuracy import ACCURACY

    assert {k.split("/")[0] for k in base} == set(ACCURACY)
    for disable, got in runs.items():
        diffs = []
        for key in sorted(k for k in base if k.endswith("/out")):
            stem = key[: -len("out")]
            assert np.array_equal(base[stem + "in0"], got[stem + "in0"]), "the batch's inputs differ"
            if not np.array_equal(base[key], got[key]):
                diffs.append(_first_difference(key, base[key], got[key],
                                               [got[k] for k in sorted(got) if k.startswith(stem + "in")]))
        assert not diffs, (f"refsim's results change with NPY_DISABLE_CPU_FEATURES={disable!r} "
                           f"(NumPy's SIMD dispatch):\n" + "\n".join(diffs))


def test_variants_name_only_features_the_host_has():
    found = set(_cpu_dispatch())
    for v in variants()[1:]:
        assert set(v.split()) <= found


if __name__ == "__main__":
    np.savez(sys.argv[1], **fingerprint_batch())
