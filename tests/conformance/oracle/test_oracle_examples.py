"""The worked examples (examples/): each agrees with refsim, each planted fault is caught by
conformance.check, and its reproducer fails under the fault and passes without it."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import conformance
from conformance.faults import numerics as planted
from examples import moe, pipeline, transformer_fsdp, transformer_jit
from conformance import faults

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the repository

# (example module, the fault planted in XLA's side of it)
EXAMPLES = [
    (transformer_jit, planted.DOT_GENERAL_BF16),          # no explicit collective: XLA partitions it
    (transformer_fsdp, "all_gather_reversed_order"),
    (pipeline, "ppermute_pairs_reversed"),
    (moe, "all_to_all_split_concat_swapped"),
]
IDS = [m.__name__.rsplit(".", 1)[1] for m, _ in EXAMPLES]


def _load(path):
    spec = importlib.util.spec_from_file_location("example_repro_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("example,fault", EXAMPLES, ids=IDS)
def test_example_agrees_and_its_planted_fault_is_caught_with_a_reproducer(example, fault, tmp_path):
    args = example.init()
    # (ordered so that each program compiles once with the fault and once without)
    with faults.inject(fault):
        with pytest.raises(conformance.ConformanceError) as info:
            conformance.check(example.train_step, *args, repro_dir=str(tmp_path))
        path = info.value.repro_path
        assert path and os.path.dirname(path) == str(tmp_path), str(info.value)
        repro = _load(path)
        assert repro.check(repro.run()), "the reproducer passes on the broken platform"
    assert repro.PROGRAM_MODULE == example.__name__ and repro.PROGRAM_NAME == "train_step"
    res = conformance.check(example.train_step, *args)
    assert res.ok, res.report()
    assert res.provenance["independent"] and all(o.placement == "program" for o in res.outputs)
    # healthy reordering noise stays far inside the bound
    assert all(o.ulps is not None and o.ulps < 32 for o in res.outputs), res.report()
    assert repro.check(repro.run()) == []


def test_pipeline_reproducer_runs_standalone_and_fails_in_a_process_with_the_fault(tmp_path):
    args = pipeline.init()
    with faults.inject("ppermute_pairs_reversed"), pytest.raises(conformance.ConformanceError) as info:
        conformance.check(pipeline.train_step, *args, repro_dir=str(tmp_path))
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)                     # the reproducer asks for its 8 CPU devices itself
    ok = subprocess.run([sys.executable, info.value.repro_path], env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "OK: every device matches refsim" in ok.stdout, ok.stdout + ok.stderr
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent("""\
        from conformance import faults
        _fault = faults.inject("ppermute_pairs_reversed")   # kept referenced: a collected context exits
        _fault.__enter__()
    """))
    env["PYTHONPATH"] = os.pathsep.join([str(hook), ROOT])
    bad = subprocess.run([sys.executable, info.value.repro_path], env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "MISMATCH on cpu" in bad.stdout, bad.stdout + bad.stderr


def test_moe_ragged_dispatch_on_refsim_equals_the_dropless_dense_dispatch_on_xla():
    # XLA:CPU has no ragged_all_to_all, so refsim runs the ragged layer and XLA the dense one
    # with capacity for every token; both compute the same function.
    import refsim

    params, x, _ = moe.init()
    rmesh = refsim.Mesh.from_jax(moe.mesh)
    ragged = refsim.shard_map(moe.ragged_moe_layer, mesh=rmesh, in_specs=(moe.PARAM_SPECS, refsim.P("expert")),
                              out_specs=refsim.P("expert"), check_vma=False)
    got = np.asarray(ragged({k: np.asarray(v) for k, v in params.items()}, np.asarray(x)))
    want = np.asarray(moe.dropless_forward(params, x))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    if not moe.has_ragged_all_to_all():
        with pytest.raises(Exception, match="ragged"):
            moe.ragged_forward(params, x)
