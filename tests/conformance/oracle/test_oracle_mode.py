"""Oracle mode end to end, in subprocesses: `pytest --conformance-oracle` over a small suite and
`python -m conformance check SCRIPT.py` over an example."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the repository
SUMMARY = re.compile(r"conformance oracle: (\d+) calls checked, (\d+) disagreed, (\d+) not checkable")

SUITE = '''\
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from examples import pipeline
from conformance import faults

mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)


@jax.jit
def single_device(a):
    return jnp.sin(a) * 2


def test_single_device_call_is_skipped():
    assert single_device(np.ones(3, np.float32)).shape == (3,)


def test_pipeline_steps():
    pipeline.main(steps=2)                                   # two checked calls


def test_pmap_ring():
    out = jax.pmap(lambda a: jax.lax.ppermute(a, "i", [(j, (j + 1) % 8) for j in range(8)]), axis_name="i")(
        np.arange(8.0, dtype=np.float32))
    assert np.asarray(out)[1] == 0.0                          # the test sees XLA's value


def test_callback_is_not_checkable():
    def f(a):
        jax.debug.callback(lambda v: None, a)
        return a * 2
    jax.jit(f)(jax.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh, P(("x", "y")))))


def test_miscompiled_pipeline_fails_the_test():
    params, xs, ys = pipeline.init()
    with faults.inject("ppermute_pairs_reversed"):
        _, loss = pipeline.train_step(params, xs, ys)
    assert np.isfinite(float(loss))                           # passes on its own: only the oracle sees it
'''


def _env():
    # TMPDIR: the test's tmp_path (conftest.py), where the runs' default reproducer folders go
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TMPDIR=tempfile.gettempdir())
    env.pop("XLA_FLAGS", None)
    return env


def test_pytest_oracle_mode_counts_checks_and_fails_the_miscompiled_test(tmp_path):
    (tmp_path / "conftest.py").write_text("from xla_backend import platform\nplatform.configure('cpu', 8)\n")
    (tmp_path / "test_suite.py").write_text(SUITE)
    report = tmp_path / "oracle.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path),
         "--rootdir", str(tmp_path), "--conformance-oracle", "--conformance-oracle-report", str(report)],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 4 passed" in out, out
    assert "FAILED test_suite.py::test_miscompiled_pipeline_fails_the_test" in out, out
    assert "DISAGREE: examples.pipeline._step" in out and "reproducer: python" in out, out
    m = SUMMARY.search(out)
    # 2 pipeline steps, pmap, faulted step; callback; and 9 device_puts of the pipeline's and the
    # callback test's inputs (reshards, checked too)
    assert m and m.groups() == ("13", "1", "1"), out
    data = json.loads(report.read_text())
    assert {"checked", "disagreed", "not_checkable", "calls", "skipped", "overhead"} <= set(data)
    assert data["checked"] == 13 and data["disagreed"] == 1 and data["skipped"] == 1
    assert data["not_checkable"] == {"host callback": 1}
    rec = {c["test"].split("::")[1]: c for c in data["calls"] if c["outcome"] != "agree"}
    assert rec["test_miscompiled_pipeline_fails_the_test"]["outcome"] == "disagree"
    assert rec["test_miscompiled_pipeline_fails_the_test"]["repro"].endswith(".py")
    assert rec["test_callback_is_not_checkable"]["reason"] == "host callback"
    for c in data["calls"]:
        assert {"test", "entry", "outcome", "policy", "seconds"} <= set(c) and c["seconds"] >= 0
    assert {c["entry"] for c in data["calls"]} == {"jit", "jit(shard_map)", "pmap", "device_put"}
    # the census: every distributed execution seen, by the path it ran through
    assert data["census"] == {"seen": 14, "by_path": {"jit call": 4, "pmap": 1, "device_put": 9},
                              "not_intercepted": {}}, data
    assert "census: 14 seen (jit call 4, pmap 1, device_put 9), 13 checked (92.9% of distributed executions)" in out, out


def test_cli_check_runs_a_script_in_oracle_mode(tmp_path):
    report = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "conformance", "check", "--report", str(report),
                           os.path.join(ROOT, "examples", "pipeline.py")],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step 2: loss" in proc.stdout                      # the script's own output
    m = SUMMARY.search(proc.stdout)
    assert m and m.groups() == ("7", "0", "0"), proc.stdout          # 3 steps and 4 device_puts
    data = json.loads(report.read_text())
    assert data["checked"] == 7 and all(c["outcome"] == "agree" for c in data["calls"])
    assert data["census"]["by_path"] == {"jit call": 3, "device_put": 4}, data["census"]


def test_cli_check_bad_script_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "conformance", "check", str(tmp_path / "missing.py")],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "does not exist" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_check_without_a_script_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "conformance", "check"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "missing SCRIPT.py" in proc.stderr and "Traceback" not in proc.stderr


DEVICES_SUITE = '''\
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P


def test_devices():
    assert jax.device_count() == 4
    mesh = jax.make_mesh((4,), ("x",))
    jax.jit(lambda a: a * 2)(jax.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh, P("x"))))
'''


def _pytest(tmp_path, *opts):
    (tmp_path / "test_devices.py").write_text(DEVICES_SUITE)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path),
         "--rootdir", str(tmp_path), *opts], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)


def test_conformance_devices_sets_the_cpu_device_count_in_oracle_mode(tmp_path):
    # no conftest sets the device count: --conformance-devices does, before JAX starts
    proc = _pytest(tmp_path, "--conformance-oracle", "--conformance-devices", "4")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "1 passed" in out, out
    m = SUMMARY.search(out)
    assert m and m.groups() == ("2", "0", "0"), out                     # the device_put and the jit
    bad = _pytest(tmp_path, "--conformance-oracle", "--conformance-devices", "0")
    assert bad.returncode == 4 and "--conformance-devices=0" in bad.stderr + bad.stdout, bad.stderr


def test_readme_and_oracle_page_run_as_scripts_without_xla_flags(tmp_path):
    # their blocks set up the 8 devices they need (docs are code: also as a plain script)
    import re

    for page in ("README.md", os.path.join("docs", "oracle.md")):
        with open(os.path.join(ROOT, page)) as fh:
            blocks = re.findall(r"^```python\n(.*?)^```", fh.read(), re.S | re.M)
        script = tmp_path / (os.path.basename(page) + ".py")
        script.write_text("\n".join(blocks))
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, (page, proc.stdout[-2000:], proc.stderr[-3000:])
