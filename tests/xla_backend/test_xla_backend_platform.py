"""Platform selection errors: reported with the reason, never as a pass."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import xla_backend
from xla_backend import platform


def _run(*args, **env):
    e = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "xla_backend", *args], env=e,
                          capture_output=True, text=True, timeout=120)


def test_import_does_not_start_jax():
    code = ("import sys, xla_backend; assert 'jax' not in sys.modules, 'jax imported'; "
            "xla_backend.configure('cpu', 3); import jax; assert jax.device_count() == 3; "
            "m = xla_backend.mesh((3,), 'x'); print(m.device_ids.tolist())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[0, 1, 2]"


def test_unknown_platform_is_an_error_with_reason():
    r = _run("info", "--platform", "nosuchplatform")
    assert r.returncode == 1
    assert "could not start platform 'nosuchplatform'" in r.stderr
    assert "not in the list of known backends" in r.stderr  # JAX's own reason is kept


@pytest.mark.skipif("cuda" in " ".join(platform.installed_plugins()), reason="a CUDA plugin is installed")
def test_missing_gpu_plugin_is_an_error_with_reason():
    # JAX raises a bare AssertionError here; the report still says what happened and the fix.
    r = _run("info", "--platform", "cuda")
    assert r.returncode == 1
    assert "could not start platform 'cuda'" in r.stderr and "pip install" in r.stderr


def test_info_reports_requested_cpu_devices():
    r = _run("info", "--devices", "5")
    assert r.returncode == 0, r.stderr
    assert '"device_count": 5' in r.stdout and '"platform": "cpu"' in r.stdout


def test_device_count_jax_cannot_provide():
    jax.devices()
    with pytest.raises(RuntimeError, match="already initialised with 8 CPU devices, but 4 were requested"):
        platform.configure("cpu", 4)
    with pytest.raises(ValueError, match="12 devices are needed but JAX has 8 cpu devices"):
        platform.require(12)
    with pytest.raises(ValueError, match="12 devices are needed"):
        xla_backend.mesh((12,), ("x",))
    with pytest.raises(ValueError, match="12"):  # JAX's own error for a pmap over 12 of 8 devices
        xla_backend.pmap(lambda v: v, axis_name="i")(np.zeros(12, np.float32))
    with pytest.raises(ValueError, match="devices=0: the CPU device count must be >= 1"):
        platform.configure("cpu", 0)


def test_share_accelerator_turns_preallocation_off_on_accelerators_only(monkeypatch):
    from xla_backend import platform as xplat

    for var in xplat._PREALLOCATION_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XLA_BACKEND_PLATFORM", "cpu")
    xplat.share_accelerator()
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in __import__("os").environ
    monkeypatch.setenv("XLA_BACKEND_PLATFORM", "cuda")
    xplat.share_accelerator()
    assert __import__("os").environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


def test_share_accelerator_keeps_the_users_allocator_choice(monkeypatch):
    from xla_backend import platform as xplat

    for var in xplat._PREALLOCATION_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XLA_BACKEND_PLATFORM", "cuda")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".3")
    xplat.share_accelerator()
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in __import__("os").environ
