"""bisect and explain on every kind of output a real program has: a per-device scalar (a loss), a
0-d output, complex, integer and bool values, and pytrees (dicts, tuples) of outputs.

Each program has one planted fault on XLA's side; the expected equation / op is the one the fault
changes (named by hand below), and the expected values come from NumPy.
"""
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conformance import faults
from conformance.debug import bisect, diff
from conformance.debug.explain import explain
from conformance.faults.jaxpr import reversed_ppermute
from refsim import Mesh, NamedSharding, PartitionSpec as P

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MESH = Mesh((8,), ("i",))
RING = [(i, (i + 1) % 8) for i in range(8)]
CHAIN = [(i, i + 1) for i in range(7)]          # device 0 receives nothing; reversed, device 7 does
X = np.arange(32, dtype=np.float32).reshape(8, 4) % 5
XI = np.arange(32, dtype=np.int32).reshape(8, 4) - 9
XC = (np.arange(32) + 1j * (np.arange(32) % 3)).astype(np.complex64).reshape(8, 4)
SMAP = dict(mesh=MESH, in_specs=P("i"))


def _loss(a):
    loss = jnp.sum(a * a)                                   # a 0-d value on every device
    return jax.lax.ppermute(loss, "i", RING)[None]


def _sums(x):
    return (x * x).sum(axis=1)


# -- the element helpers on 0-d values ------------------------------------------------------------
def test_ulp_error_and_first_differing_keep_a_0d_value_0d():
    assert diff.ulp_error(np.float32(1.0), np.float32(1.0)).shape == ()
    assert diff.ulp_error(np.float32(1.0), np.nextafter(np.float32(1.0), np.float32(2))) == 1
    assert diff.outside(np.float32(3.0), np.float32(4.0)).shape == ()
    assert diff.first_differing(np.array(True)) == [()] and diff.first_differing(np.array(False)) == []
    assert diff.first_differing(np.array([[False, True], [True, True]]), limit=2) == [(0, 1), (1, 0)]


# -- bisect ---------------------------------------------------------------------------------------
def test_bisect_names_the_ppermute_of_a_per_device_scalar_loss():
    res = bisect(_loss, X, out_specs=P("i"), runner=reversed_ppermute(), **SMAP)
    d = res.divergence
    assert d.primitive == "ppermute" and d.affected == list(range(8))
    (out,) = d.outputs
    assert out.aval.startswith("f32[]")
    sums = _sums(X)
    for dev, dd in out.devices.items():                     # a ring reversed: device d gets d + 1's loss
        assert dd.expected.shape == () and dd.expected == sums[(dev - 1) % 8]
        assert dd.actual == sums[(dev + 1) % 8] and dd.ranges() == ["[]"]
    text = res.report()
    assert "primitive: ppermute" in text
    assert f"element []: refsim {float(sums[7])!r}, xla {float(sums[1])!r}" in text     # device 0


def test_bisect_of_a_0d_output_with_check_vma_off():
    res = bisect(lambda a: jax.lax.ppermute(jnp.sum(a), "i", CHAIN), X, out_specs=P(), check_vma=False,
                 runner=reversed_ppermute(), **SMAP)
    assert res.divergence.primitive == "ppermute"
    assert all(r.aval.startswith("f32[]") for r in res.outputs)
    assert "element []" in res.report()


def test_bisect_of_integer_bool_and_complex_values():
    for x, f, dtype in [(XI, lambda a: jax.lax.psum(jax.lax.ppermute(jnp.sum(a), "i", CHAIN), "i"), "i32"),
                        (X, lambda a: jax.lax.ppermute(a > 2, "i", RING), "bool"),
                        (XC, lambda a: jax.lax.ppermute(jnp.sum(a * 2), "i", RING)[None], "c64")]:
        outs = P() if dtype == "i32" else P("i")
        res = bisect(f, x, out_specs=outs, runner=reversed_ppermute(), **SMAP)
        d = res.divergence
        assert d.primitive == "ppermute", res.report()
        assert d.outputs[0].aval.startswith(dtype), d.outputs[0].aval
        assert "element [" in res.report()
    # integers: the psum over the chain misses device 7's sum, reversed device 0's
    totals = XI.sum(axis=1)
    res = bisect(lambda a: jax.lax.psum(jax.lax.ppermute(jnp.sum(a), "i", CHAIN), "i"), XI, out_specs=P(),
                 runner=reversed_ppermute(), **SMAP)
    (out,) = res.outputs
    assert {int(d.expected) for d in out.devices.values()} == {int(totals[:7].sum())}
    assert {int(d.actual) for d in out.devices.values()} == {int(totals[1:].sum())}


def test_bisect_of_pytree_outputs_shard_map_and_jit():
    def step(a):
        loss = jnp.sum(a)
        return {"loss": jax.lax.psum(jax.lax.ppermute(loss, "i", CHAIN), "i"), "y": (a * 2, loss[None])}

    res = bisect(step, X, out_specs={"loss": P(), "y": (P("i"), P("i"))}, runner=reversed_ppermute(), **SMAP)
    assert res.divergence.primitive == "ppermute" and len(res.outputs) == 3
    assert sum(not r.matched for r in res.outputs) == 1             # only the loss depends on the ppermute

    s, r = NamedSharding(MESH, P("i")), NamedSharding(MESH, P())

    def jit_step(x):
        loss = jnp.sum(x * 2)
        return {"loss": loss, "y": x + 1}

    with faults.inject("partitioned_reduction_drops_shard") as planted:
        res = bisect(jit_step, X, mesh=MESH, in_shardings=(s,), out_shardings={"loss": r, "y": s})
    assert planted.fired["partitioned_reduction_drops_shard"] >= 1
    assert res.divergence.primitive == "reduce_sum"
    loss = next(r for r in res.outputs if not r.matched)
    assert {float(d.expected) for d in loss.devices.values()} == {float(X.sum() * 2)}
    assert {float(d.actual) for d in loss.devices.values()} == {float(X[:7].sum() * 2)}   # the last row dropped


# -- explain --------------------------------------------------------------------------------------
def _explained(fn, x, **kw):
    with faults.inject("ppermute_pairs_reversed"):
        e = explain(fn, x, **kw)
    json.dumps(e.to_json())                                            # every value JSON-able
    return e


@pytest.mark.parametrize("kind", ["scalar", "0d", "int", "bool", "complex", "pytree"])
def test_explain_names_the_collective_permute_for_each_output_kind(kind):
    programs = {
        "scalar": (_loss, X, P("i"), True),
        "0d": (lambda a: jax.lax.ppermute(jnp.sum(a), "i", CHAIN), X, P(), False),
        "int": (lambda a: jax.lax.psum(jax.lax.ppermute(jnp.sum(a), "i", CHAIN), "i"), XI, P(), True),
        "bool": (lambda a: jax.lax.ppermute(a > 2, "i", RING), X, P("i"), True),
        "complex": (lambda a: jax.lax.ppermute(a, "i", RING), XC, P("i"), True),
        "pytree": (lambda a: {"l": jax.lax.psum(jax.lax.ppermute(jnp.sum(a), "i", CHAIN), "i"), "y": (a * 2,)},
                   X, {"l": P(), "y": (P("i"),)}, True),
    }
    fn, x, outs, vma = programs[kind]
    e = _explained(fn, x, out_specs=outs, check_vma=vma, **SMAP)
    assert (e.diverged_in, e.op) == ("lowering", "stablehlo.collective_permute"), e.report()
    assert e.elements, e.report()


def test_explain_json_writes_complex_and_integer_elements_as_numbers():
    e = _explained(lambda a: jax.lax.ppermute(a, "i", RING), XC, out_specs=P("i"), **SMAP)
    dev, index, before, after = e.elements[0]
    got = next(el for el in e.to_json()["elements"] if el["device"] == dev)
    assert got["before"] == {"real": before.real, "imag": before.imag} and got["index"] == list(index)
    e = _explained(lambda a: jax.lax.psum(jax.lax.ppermute(jnp.sum(a), "i", CHAIN), "i"), XI, out_specs=P(),
                   **SMAP)
    el = e.to_json()["elements"][0]
    assert isinstance(el["before"], int) and isinstance(el["after"], int) and el["index"] == []


def test_explain_localises_a_complex_sum():
    # refsim.stablehlo reads the reduction's complex zero from the op's text (the MLIR bindings cannot
    # downcast a dense complex attribute), so every stage is evaluated and the planted ppermute is named
    e = _explained(lambda a: jax.lax.ppermute(jnp.sum(a), "i", RING)[None], XC, out_specs=P("i"), **SMAP)
    assert all(v is not None for v in e.agrees.values()), e.report()
    assert (e.diverged_in, e.op) == ("lowering", "stablehlo.collective_permute"), e.report()
    assert e.agrees["lowered"] is False and "first differing output: 0" in e.report()


# -- the must-show: the command line on a scalar-loss reproducer ----------------------------------------
LOSS_REPRO = textwrap.dedent('''\
    # conformance reproducer v1: shard_map/scalar_loss_ppermute/8
    import numpy as np, jax, jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    MESH_SHAPE = (8,)
    AXIS_NAMES = ('i',)
    DEVICE_IDS = [0, 1, 2, 3, 4, 5, 6, 7]
    KIND = "shard_map"
    IN_SPECS = (P('i'),)
    OUT_SPECS = P('i')
    CHECK_VMA = True
    def program(a):
        loss = jnp.sum(a * a)
        return jax.lax.ppermute(loss, 'i', [(i, (i + 1) % 8) for i in range(8)])[None]
    def inputs(): return (np.arange(32, dtype=np.float32).reshape(8, 4) % 5,)
    ''')


def test_bisect_cli_on_a_scalar_loss_reports_the_ppermute_and_exits_1(tmp_path):
    repro = tmp_path / "loss_repro.py"
    repro.write_text(LOSS_REPRO)
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", "conformance", "bisect", str(repro)]
    clean = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert clean.returncode == 0 and "MATCH" in clean.stdout, clean.stdout + clean.stderr
    out = subprocess.run(cmd + ["--plant", "jaxpr:reversed_ppermute"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr             # 1: a divergence (docs/debugging.md)
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].startswith("MISMATCH: first diverging equation is #"), out.stdout
    assert "  primitive: ppermute" in lines and "loss_repro.py:13" in out.stdout
    assert "element []: refsim 26.0, xla 21.0" in out.stdout                 # device 0: the loss of 7 vs of 1
    assert "planted reversed_ppermute: fired" in out.stderr
