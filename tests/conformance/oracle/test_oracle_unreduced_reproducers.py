"""Reproducers of calls whose inputs or outputs are unreduced (each device holds a partial value).

An unreduced input is stored as each device's own partial value and rebuilt with
`jax.make_array_from_single_device_arrays` under its unreduced sharding; an unreduced output is
checked by the value its partial values combine to (their sum along the unreduced axes), which
is what a jit-level program states, or device by device where a shard_map's out_specs state each
device's partial value. The real XLA bug these were built for: `broadcast_in_dim` of a value
unreduced over `y` reads back doubled (docs/found-bugs.md)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import conformance
from conformance.oracle import check as chk

MESH = jax.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2, devices=jax.devices()[:4])
SH_U = NamedSharding(MESH, P("x", None, unreduced={"y"}))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# module level, so that a reproducer can import them
broadcast = jax.jit(lambda x: jax.lax.broadcast_in_dim(x, (4, 3), (0, 1), out_sharding=SH_U))
doubled = jax.jit(lambda x: x + x)
matmul_unreduced = jax.jit(lambda a, b: jnp.einsum("ab,bc->ac", a, b,
                                                   out_sharding=NamedSharding(MESH, P(unreduced={"x"}))))
_UK = getattr(jax.sharding, "UnreducedKind", None)           # jax >= 0.12: partial values combined by max / min


def _reduce_unreduced(op, kind):
    return jax.jit(lambda a: op(a, axes=[0], out_sharding=P(unreduced={"x"}, unreduced_kind=getattr(_UK, kind))))


max_unreduced = None if _UK is None else _reduce_unreduced(jax.lax.reduce_max, "max")
min_unreduced = None if _UK is None else _reduce_unreduced(jax.lax.reduce_min, "min")


def _partials(values):
    """A float32 (4, k) array laid out by SH_U whose device at mesh position (i, j) holds
    values[j][2i:2i+2] (its partial value along y); the value it stands for is the sum over j."""
    singles = [jax.device_put(np.asarray(values[j][2 * i:2 * i + 2], np.float32), MESH.devices[i, j])
               for i in range(2) for j in range(2)]
    return jax.make_array_from_single_device_arrays(np.shape(values[0]), SH_U, singles)


def _combined(out) -> np.ndarray:
    """By hand: the global value of an output laid out by SH_U, its partial values summed over y."""
    data = {s.device.id: np.asarray(s.data) for s in out.addressable_shards}
    ids = np.vectorize(lambda d: d.id, otypes=[int])(MESH.devices)
    return np.concatenate([data[ids[i, 0]] + data[ids[i, 1]] for i in range(2)])


def _load(path):
    spec = importlib.util.spec_from_file_location(f"oracle_unreduced_repro_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run_standalone(path):
    """`python repro.py` in a fresh process (8 host devices, the worktree importable for a
    reproducer that imports its program from this test module)."""
    env = dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    return subprocess.run([sys.executable, path], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


P0 = np.arange(8.0, dtype=np.float32).reshape(4, 2)          # partial value at y = 0
P1 = np.full((4, 2), 0.5, np.float32)                        # partial value at y = 1


def _reproducer(fn, name, x, tmp_path):
    """The reproducer of `fn(x)` as conformance.check writes it (the module-level `fn` imported, or
    with fn None the program as jax.export serialized it), and XLA's result."""
    with jax.set_mesh(MESH):
        traced = chk.prepare(fn, (x,), {})
        out = fn(x)
        res, ref, pols = chk.finish(traced, out, name=name, entry="jit")
    assert res.ok, res.report()
    path, note = chk.write_reproducer(fn if name != "local" else None, name, (x,), {}, ref, pols, None,
                                      str(tmp_path), traced=traced, out_shardings=[out.sharding])
    assert note == "" and path, note
    return path, out


@pytest.mark.parametrize("how", ["imported", "exported"])
def test_a_correct_program_with_unreduced_input_and_output_reproduces_as_agreeing(how, tmp_path):
    x = _partials([P0, P1])
    path, out = _reproducer(doubled if how == "imported" else jax.jit(lambda x: x + x),
                            "doubled" if how == "imported" else "local", x, tmp_path)
    mod = _load(path)
    assert mod.PARTIAL_INPUTS == {0: (4, 2)} and mod.PARTIALS == ["combined"]
    assert (mod.EXPORTED is None) == (how == "imported")
    # each device's partial value is stored as it was: device at (1, 1) holds P1[2:4]
    assert mod._data()[f"in0_dev{MESH.devices[1, 1].id}"].tolist() == P1[2:4].tolist()
    # the rebuilt input holds the same partial values, the output is unreduced over y
    (arg,), _ = mod.inputs()
    assert {s.device.id: np.asarray(s.data).tolist() for s in arg.addressable_shards} == \
        {s.device.id: np.asarray(s.data).tolist() for s in x.addressable_shards}
    got = mod.run()
    (o,) = jax.tree_util.tree_leaves(got)                    # an exported program returns a tuple
    assert o.sharding.spec.unreduced == {"y"}
    np.testing.assert_array_equal(_combined(o), 2 * (P0 + P1))   # by hand: (x + x) sums to 2 (P0 + P1)
    assert mod.check(got) == []
    run = _run_standalone(path)
    assert run.returncode == 0 and "OK: every device matches refsim" in run.stdout, run.stdout + run.stderr


def test_a_planted_wrong_expected_value_fails_naming_the_combined_value(tmp_path):
    x = _partials([P0, P1])
    path, _ = _reproducer(doubled, "doubled", x, tmp_path)
    mod = _load(path)
    # x + x rounds: its policy holds XLA's value to a bound around refsim's (the reference in sum0_...)
    assert mod.POLICIES == ["scaled"]
    data = dict(mod._data())
    dev = int(MESH.devices[0, 1].id)
    data[f"sum0_dev{dev}_ref"] = data[f"sum0_dev{dev}_ref"].copy()
    data[f"sum0_dev{dev}_ref"][1, 0] += 1             # refsim's combined value, planted wrong on one device
    mod._data = lambda: data
    bad = mod.check(mod.run())
    want = 2 * (P0 + P1)[1, 0]                        # by hand: 2 * (2 + 0.5) = 5
    assert bad[0].startswith("output 0 is unreduced over ['y']") and "the sum of the partial values" in bad[0], bad
    assert len(bad) == 2 and bad[1].startswith(
        f"output 0 device {dev} element (1, 0): got {float(want)!r}, refsim {float(want + 1)!r}, |diff| 1.0 > "), bad


def test_the_real_broadcast_bug_gets_a_reproducer_that_fails_standalone(tmp_path):
    # the value is ones (4, 1): partial value 1 at y = 0 and 0 at y = 1 (as jax.device_put lays ones
    # out unreduced); broadcast_in_dim to (4, 3) must stand for ones (4, 3)
    x = _partials([np.ones((4, 1), np.float32), np.zeros((4, 1), np.float32)])
    with jax.set_mesh(MESH):
        xla = _combined(broadcast(x))
    if np.array_equal(xla, np.ones((4, 3), np.float32)):     # XLA fixed: the oracle agrees
        with jax.set_mesh(MESH):
            assert conformance.check(broadcast, x, repro_dir=str(tmp_path)).ok
        return
    np.testing.assert_array_equal(xla, np.full((4, 3), 2.0, np.float32))   # the bug: each device holds 1
    for fn in (broadcast, jax.jit(lambda x: jax.lax.broadcast_in_dim(x, (4, 3), (0, 1), out_sharding=SH_U))):
        with jax.set_mesh(MESH), pytest.raises(conformance.ConformanceError) as info:
            conformance.check(fn, x, repro_dir=str(tmp_path))
        path = info.value.repro_path
        assert path and "no reproducer" not in str(info.value), str(info.value)
        assert (_load(path).EXPORTED is None) == (fn is broadcast)
        run = _run_standalone(path)
        assert run.returncode == 1, run.stdout + run.stderr
        assert "output 0 is unreduced over ['y']" in run.stdout
        assert "output 0 device 0 element (0, 0): got 2.0, expected 1.0" in run.stdout, run.stdout


def test_explain_and_bisect_refuse_unreduced_inputs_with_a_reason(tmp_path, capsys):
    from conformance.debug import cli as bisect_cli
    from conformance.debug.explain import cli as explain_cli

    path, _ = _reproducer(doubled, "doubled", _partials([P0, P1]), tmp_path)
    for main in (explain_cli.main, bisect_cli.main):
        assert main([path]) == 2
        err = capsys.readouterr().err
        assert "input(s) [0] are unreduced" in err and f"python {path}" in err, err


@pytest.mark.parametrize("how", ["imported", "exported"])
def test_explain_and_bisect_refuse_unreduced_outputs_with_a_reason(how, tmp_path, capsys):
    from conformance.debug import cli as bisect_cli
    from conformance.debug.explain import cli as explain_cli

    a = jax.device_put(np.arange(8.0, dtype=np.float32).reshape(2, 4), NamedSharding(MESH, P(None, "x")))
    b = jax.device_put(np.ones((4, 2), np.float32), NamedSharding(MESH, P("x", None)))
    traced = chk.prepare(matmul_unreduced, (a, b), {})
    out = matmul_unreduced(a, b)
    res, ref, pols = chk.finish(traced, out, name="matmul_unreduced", entry="jit")
    assert res.ok
    path, _ = chk.write_reproducer(matmul_unreduced if how == "imported" else None, "matmul_unreduced", (a, b), {},
                                   ref, pols, None, str(tmp_path), traced=traced, out_shardings=[out.sharding])
    mod = _load(path)
    assert mod.PARTIAL_INPUTS == {} and mod.check(mod.run()) == []
    for main in (explain_cli.main, bisect_cli.main):
        assert main([path]) == 2
        err = capsys.readouterr().err
        assert "output(s) [0] are unreduced" in err and f"python {path}" in err, err


def test_shard_map_partial_values_are_checked_device_by_device(tmp_path):
    # out_specs state each device's own partial value: refsim's expected output keeps them, and the
    # reproducer compares them device by device (not their sum)
    x = _partials([P0, P1])
    f = jax.jit(jax.shard_map(lambda a: a + a, mesh=MESH, in_specs=P("x", None, unreduced={"y"}),
                              out_specs=P("x", None, unreduced={"y"})))
    with jax.set_mesh(MESH):
        traced = chk.prepare(f, (x,), {})
        out = f(x)
        res, ref, pols = chk.finish(traced, out, name="local", entry="jit")
    assert res.ok, res.report()
    path, _ = chk.write_reproducer(None, "local", (x,), {}, ref, pols, None, str(tmp_path), traced=traced,
                                   out_shardings=[out.sharding])
    mod = _load(path)
    assert mod.PARTIALS == ["per device"] and mod.PARTIAL_INPUTS == {0: (4, 2)}
    got = mod.run()[0]
    ids = np.vectorize(lambda d: d.id, otypes=[int])(MESH.devices)
    for s in got.addressable_shards:             # by hand: the device at (i, j) holds 2 * Pj[2i:2i+2] (a + a)
        i, j = (int(v) for v in np.argwhere(ids == s.device.id)[0])
        assert np.asarray(s.data).tolist() == (2 * [P0, P1][j][2 * i:2 * i + 2]).tolist()
    assert mod.check(got) == []
    # a wrong partial value on device 1 alone: a disagreement there, though a sum could hide it
    dev = int(ids[0, 1])
    data = dict(mod._data())
    key = f"sum0_dev{dev}_ref" if mod.POLICIES[0] in ("scaled", "sum_bound") else f"out0_dev{dev}"
    data[key] = data[key] + 1
    mod._data = lambda: data
    bad = mod.check(got)
    assert bad and all(f.startswith(f"output 0 device {dev} element") for f in bad), bad


def test_device_put_onto_an_unreduced_layout_reproduces(tmp_path):
    # partial values moved onto an unreduced layout keep what each device holds (JAX refuses a
    # device_put off one onto an ordinary layout: that is a reshard). The reproducer rebuilds the
    # input from its partial values, calls jax.device_put, and checks every device's block exactly.
    x = _partials([P0, P1])
    t = SH_U
    hosts = chk.device_put_hosts([x])
    y = jax.device_put(x, t)
    res, ref = chk.finish_device_put(hosts, [t], [y])
    assert res.ok, res.report()
    path, note = chk.write_device_put_reproducer(hosts, [t], ref, str(tmp_path))
    assert note == "" and path, note
    mod = _load(path)
    assert mod.PARTIAL_INPUTS == {0: (4, 2)} and mod.PARTIALS == ["per device"]
    got = mod.run()
    assert mod.check(got) == []
    ids = np.vectorize(lambda d: d.id, otypes=[int])(MESH.devices)
    for s in got[0].addressable_shards:                # by hand: the device at (i, j) keeps Pj[2i:2i+2]
        i, j = (int(v) for v in np.argwhere(ids == s.device.id)[0])
        assert np.asarray(s.data).tolist() == [P0, P1][j][2 * i:2 * i + 2].tolist()
    data = dict(mod._data())
    data["out0_dev0"] = data["out0_dev0"] + 1          # planted: refsim's block on device 0 off by one
    mod._data = lambda: data
    bad = mod.check(got)
    assert bad and all(f.startswith("output 0 device 0 element") for f in bad), bad


@pytest.mark.skipif(_UK is None, reason="unreduced_kind is jax >= 0.12")
@pytest.mark.parametrize("kind", ["max", "min"])
def test_an_unreduced_max_or_min_output_is_checked_by_its_combined_value(kind, tmp_path):
    x = np.array([[3.0, -1.0], [5.0, -4.0], [2.0, 7.0], [0.0, 1.0]], np.float32)
    f = max_unreduced if kind == "max" else min_unreduced
    with jax.set_mesh(MESH):
        xs = jax.device_put(x, P("x", None))
        traced = chk.prepare(f, (xs,), {})
        out = f(xs)
        res, ref, pols = chk.finish(traced, out, name="f", entry="jit")
        assert res.ok, res.report()
        # jax.export keeps the unreduced axes but not their kind: no exported reproducer, and why
        none, why = chk.write_reproducer(None, "f", (xs,), {}, ref, pols, None, str(tmp_path), traced=traced,
                                         out_shardings=[out.sharding])
        assert none is None and f"unreduced_kind={kind}, which jax.export does not keep" in why, why
        # the program imported from this module (written under the call's mesh, as conformance.check
        # writes it): checked by the max / min of its partial values
        path, note = chk.write_reproducer(f, "f", (xs,), {}, ref, pols, None, str(tmp_path), traced=traced,
                                          out_shardings=[out.sharding])
    assert note == "", note
    mod = _load(path)
    assert mod.CONTEXT_MESH == ([[0, 1], [2, 3]], ("x", "y"), ("Explicit", "Explicit"))
    got = mod.run()                     # under the mesh the call ran under: the program's bare P names it
    assert mod.check(got) == []
    run = _run_standalone(path)
    assert run.returncode == 0 and "OK: every device matches refsim" in run.stdout, run.stdout + run.stderr
    want = x.max(axis=0) if kind == "max" else x.min(axis=0)     # by hand: [5, 7] / [0, -4]
    assert np.asarray(mod._data()["out0_dev0"]).tolist() == want.tolist()
    data = dict(mod._data())
    data["out0_dev0"] = data["out0_dev0"] + 1                    # planted: the combined value off by one
    mod._data = lambda: data
    bad = mod.check(got)
    assert bad[0].startswith("output 0 is unreduced over ['x']") and f"the {kind} of the partial values" in bad[0]
    assert bad[1] == f"output 0 device 0 element (0,): got {float(want[0])!r}, expected {float(want[0] + 1)!r}", bad
