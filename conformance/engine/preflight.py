"""Platform preflight: bring the requested platform and device count up once, before any case runs.

Without it a missing CUDA plugin or too few devices shows up as dozens of "error" cases; with
it `python -m conformance run` stops with one line naming the platform, what JAX found, and
how to install or select the platform (exit status 2). On success it returns the hardware
record the report keeps (`xla_backend.provenance.hardware`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from xla_backend import platform as xplat
from xla_backend import provenance

__all__ = ["PreflightError", "check", "plan_entries"]

# jax.Device.platform for each name --platform accepts (CUDA and ROCm devices say "gpu").
_DEVICE_PLATFORM = {"cuda": ("gpu", "cuda"), "rocm": ("gpu", "rocm"), "gpu": ("gpu", "cuda", "rocm")}


class PreflightError(ValueError):
    """The platform cannot run the suite here; the message says what was found and the fix."""


def check(platform: str, devices: int | None, *, in_process: bool, timeout_s: float = 300.0) -> dict:
    """Start `platform` with at least `devices` devices (None: any number) and return its hardware record.

    in_process=True starts JAX here (the run's cases will run here too, or JAX is already up);
    False checks in a short-lived child process, so that a parent whose cases run in worker
    processes does not hold the accelerator (a GPU's memory is preallocated by the first
    process that starts it). Raises PreflightError.
    """
    if in_process or _backends_started():
        return _check_here(platform, devices)
    cmd = [sys.executable, "-m", "xla_backend", "info", "--platform", platform, "--hardware"]
    if devices is not None:
        cmd += ["--devices", str(devices)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        raise PreflightError(f"platform {platform!r} did not start within {timeout_s:g} s (`{' '.join(cmd[1:])}` "
                             "hung); check the accelerator's driver with the vendor's tool (nvidia-smi, "
                             "rocm-smi, tpu-info) or select another platform with --platform.") from None
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        reason = lines[-1] if lines else f"exit status {r.returncode}"
        raise PreflightError(reason.removeprefix("xla_backend info: error: "))
    return json.loads(r.stdout)


def _backends_started() -> bool:
    return xplat.backends_initialised()


def _check_here(platform: str, devices: int | None) -> dict:
    try:
        xplat.configure(platform, devices if platform == "cpu" else None)
        devs = xplat.require(devices)
    except (xplat.PlatformError, ValueError, RuntimeError) as e:
        raise PreflightError(str(e)) from None
    have = devs[0].platform
    if have != platform and have not in _DEVICE_PLATFORM.get(platform, ()):
        raise PreflightError(
            f"platform {platform!r} was requested but JAX in this process already runs on {have!r} "
            f"({len(devs)} devices): JAX picks its platform once per process. Start a new process with "
            f"--platform {platform} (or XLA_BACKEND_PLATFORM={platform}) before anything imports JAX.")
    return provenance.hardware()


def plan_entries(record: dict) -> dict:
    """The hardware record as flat plan entries (the HTML page and JUnit properties show scalars)."""
    return {
        "hardware": record,
        "device_kinds": ", ".join(record.get("device_kinds", ())),
        "platform_version": record.get("platform_version", ""),
        "process_count": record.get("process_count", 1),
        "topology": record.get("topology", ""),
    }
