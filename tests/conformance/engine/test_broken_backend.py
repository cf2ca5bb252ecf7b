"""A deliberately broken XLA side is caught, shrunk, and its reproducer fails where XLA is broken.

Two broken backends: `OneDeviceOff`, a test double that adds 1 to the psum result on one
device (device id 5), and `conformance.faults.inject("psum_drop_member")`, a real
miscompile of JAX's psum lowering (the last member of each group is left out of the sum)
that also breaks the standalone reproducer when it is run in a process with the fault
installed (through a sitecustomize module on PYTHONPATH).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import xla_backend
from conformance.engine import runner
from conformance.debug import loader
from conformance.suites import base
from conformance.suites.collectives import strategy
from refsim.array import Array, Shard

BAD_DEVICE = 5
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the repository


class OneDeviceOff:
    """xla_backend, except that a shard_map whose function calls psum returns device 5's shard plus 1."""

    def __getattr__(self, name):
        return getattr(xla_backend, name)

    def shard_map(self, f, **kw):
        run = xla_backend.shard_map(f, **kw)
        if "psum" not in f.__code__.co_names:
            return run

        def call(*args):
            out = run(*args)
            shards = [Shard(s.device_id, s.index, np.asarray(s.data) + np.asarray(1, np.asarray(s.data).dtype))
                      if s.device_id == BAD_DEVICE else s for s in out.shards]
            return Array(out.shape, out.dtype, out.sharding, shards)
        return call


def _psum_tasks(seed=0, count=8):
    calls = base.draw(strategy("psum", "int32", 8), count, seed)
    return base.group_tasks("collectives", calls, seed=seed, shrink_of=lambda c: ("collectives", "psum", c.dtype))


def _failing(double):
    for task in _psum_tasks():
        res = runner.run_task(task, double, shrink_seconds=0)
        if res.status == "fail":
            return task, res
    pytest.fail("the broken backend was not caught by any psum case")


def _env(extra_path=None):
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, ROOT, env.get("PYTHONPATH")) if p)
    return env


def _load(path):
    spec = importlib.util.spec_from_file_location("repro_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_double_is_caught_shrunk_and_its_reproducer_pins_the_bad_device(tmp_path):
    double = OneDeviceOff()
    task, res = _failing(double)
    assert res.details["device_errors"] == {str(BAD_DEVICE): res.details["device_errors"][str(BAD_DEVICE)]}
    failing_case = next(c for c in task.variants if BAD_DEVICE in np.asarray(c.mesh.device_ids))
    small = runner.shrink(task, failing_case, double, devices=8, seconds=90)
    # hypothesis shrank it: a mesh no larger that still holds device 5, one element per device
    assert BAD_DEVICE in np.asarray(small.mesh.device_ids)
    assert small.mesh.size <= failing_case.mesh.size
    print(small.describe())
    assert np.asarray(small.args[0]).size <= np.asarray(failing_case.args[0]).size
    assert np.asarray(small.args[0]).size <= small.mesh.size

    # the reproducer written for a failure embeds refsim's values, which the broken output misses
    path = runner.run_task(task, double, repro_dir=str(tmp_path), shrink_seconds=60).repro_path
    assert path and open(path).readline().startswith("# conformance reproducer v1: psum[")
    mod = _load(path)
    rep = loader.load(path)  # the bisector's reader of the same file
    assert rep.kind == "shard_map" and rep.mesh.device_ids.tolist() == mod.DEVICE_IDS
    broken = double.shard_map(rep.program, mesh=rep.mesh, in_specs=rep.in_specs, out_specs=rep.out_specs)(*rep.inputs)
    bad = {s.device_id: np.asarray(s.data) for s in broken.shards}
    assert not np.array_equal(bad[BAD_DEVICE], mod.EXPECTED[0][BAD_DEVICE])
    for d, want in mod.EXPECTED[0].items():
        if d != BAD_DEVICE:
            np.testing.assert_array_equal(bad[d], want)
    # against correct XLA the reproducer agrees and exits 0
    ok = subprocess.run([sys.executable, path], env=_env(), capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "OK: every device matches refsim" in ok.stdout


def test_miscompiled_psum_is_caught_and_its_reproducer_fails_under_the_fault(tmp_path):
    from conformance import faults

    with faults.inject("psum_drop_member"):
        results = [runner.run_task(t, None, repro_dir=str(tmp_path), shrink_seconds=45) for t in _psum_tasks(seed=1)]
    failed = [r for r in results if r.status == "fail"]
    assert failed, [r.case_id for r in results]
    psum = failed[0]
    assert psum.repro_path and os.path.exists(psum.repro_path)

    # the same file: agrees with correct XLA, fails (exit 1, naming a device) under the fault
    ok = subprocess.run([sys.executable, psum.repro_path], env=_env(), capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent("""\
        from conformance import faults
        _fault = faults.inject("psum_drop_member")
        _fault.__enter__()
    """))
    bad = subprocess.run([sys.executable, psum.repro_path], env=_env(str(hook)), capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "MISMATCH on cpu" in bad.stdout and "device" in bad.stdout
