"""Platform selection, done once before JAX initialises its backends.

This is the one place that sets ``XLA_FLAGS=--xla_force_host_platform_device_count``
and ``JAX_PLATFORMS``; tests, the CLI and benchmarks all call `configure`.
"""
from __future__ import annotations

import os
import re
import sys

DEFAULT_CPU_DEVICES = 8
_FLAG = "--xla_force_host_platform_device_count"


def _backends_initialised() -> bool:
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge

        return bool(getattr(xla_bridge, "_backends", None))
    except Exception:  # pragma: no cover - very old/new JAX layouts
        return False


def configure(platform: str | None = None, devices: int | None = None) -> None:
    """Select the JAX platform and, on CPU, the number of virtual host devices.

    platform: "cpu", "cuda", "rocm", "tpu" or a PJRT plugin name; default from
    ``XLA_BACKEND_PLATFORM`` or "cpu". devices: virtual CPU device count
    (default ``XLA_BACKEND_DEVICES`` or 8). Raises RuntimeError if JAX already
    started with a different CPU device count, since XLA reads the flag once.
    """
    platform = (platform or os.environ.get("XLA_BACKEND_PLATFORM") or "cpu").lower()
    if devices is None:
        devices = int(os.environ.get("XLA_BACKEND_DEVICES", DEFAULT_CPU_DEVICES))
    if devices < 1:
        raise ValueError(f"devices={devices}: the CPU device count must be >= 1.")
    if platform == "cpu":
        if _backends_initialised():
            import jax

            have = jax.device_count("cpu")
            if have != devices:
                raise RuntimeError(
                    f"JAX is already initialised with {have} CPU devices, but {devices} were "
                    f"requested. XLA reads {_FLAG} once per process: call "
                    "xla_backend.platform.configure(...) before anything runs JAX, or start a "
                    f"new process with XLA_BACKEND_DEVICES={devices}."
                )
            return
        flags = re.sub(rf"{_FLAG}=\d+", "", os.environ.get("XLA_FLAGS", "")).strip()
        os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={devices}".strip()
    os.environ["JAX_PLATFORMS"] = platform
    os.environ["XLA_BACKEND_PLATFORM"] = platform
