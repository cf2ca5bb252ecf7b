"""Platform selection, done once before JAX initialises its backends.

This is the one place that sets ``XLA_FLAGS=--xla_force_host_platform_device_count``
and ``JAX_PLATFORMS``; tests, the CLI and benchmarks all call `configure`.
"""
from __future__ import annotations

import os
import re

from refsim import compat
from xla_backend.limits import MAX_DEVICE_COUNT

DEFAULT_CPU_DEVICES = 8
_FLAG = "--xla_force_host_platform_device_count"


def backends_initialised() -> bool:
    """True once JAX has started its backends in this process (platform and CPU device count fixed)."""
    return compat.backends_initialised()


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
    if devices > MAX_DEVICE_COUNT:  # XLA would answer with the help text of its flags
        raise ValueError(f"devices={devices}: the CPU device count must be <= {MAX_DEVICE_COUNT} (XLA reads "
                         f"{_FLAG} as a 32-bit int).")
    if platform == "cpu":
        if not configure_cpu_devices(devices):
            return
    os.environ["JAX_PLATFORMS"] = platform
    os.environ["XLA_BACKEND_PLATFORM"] = platform


def configure_cpu_devices(devices: int) -> bool:
    """Ask XLA for `devices` virtual CPU devices (the platform is left as it is). Returns False
    when JAX had already started with that many; raises RuntimeError if it started with another
    count, since XLA reads the flag once."""
    if devices < 1:
        raise ValueError(f"devices={devices}: the CPU device count must be >= 1.")
    if devices > MAX_DEVICE_COUNT:
        raise ValueError(f"devices={devices}: the CPU device count must be <= {MAX_DEVICE_COUNT} (XLA reads "
                         f"{_FLAG} as a 32-bit int).")
    if backends_initialised():
        import jax

        have = jax.device_count("cpu")
        if have != devices:
            raise RuntimeError(
                f"JAX is already initialised with {have} CPU devices, but {devices} were "
                f"requested. XLA reads {_FLAG} once per process: call "
                "xla_backend.platform.configure(...) before anything runs JAX, or start a "
                f"new process with XLA_BACKEND_DEVICES={devices}."
            )
        return False
    flags = re.sub(rf"{_FLAG}=\d+", "", os.environ.get("XLA_FLAGS", "")).strip()
    os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={devices}".strip()
    return True


_PREALLOCATION_VARS = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION",
                       "XLA_PYTHON_CLIENT_ALLOCATOR")


def share_accelerator() -> None:
    """Let several processes of this machine share its accelerators: call before JAX starts.

    JAX's GPU client preallocates 75% of each GPU's memory in the first process that starts it,
    so a second conformance worker on the same GPU fails its first allocation. Unless the user
    chose an allocator policy (any of XLA_PYTHON_CLIENT_PREALLOCATE, XLA_[PYTHON_]CLIENT_MEM_FRACTION,
    XLA_PYTHON_CLIENT_ALLOCATOR), each process allocates what it uses. No effect on CPU.
    """
    if current_platform() == "cpu" or any(v in os.environ for v in _PREALLOCATION_VARS):
        return
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"


class PlatformError(RuntimeError):
    """JAX cannot provide the requested platform (not installed, failed to start)."""


def current_platform() -> str:
    """The platform `configure` selected (or ``XLA_BACKEND_PLATFORM``, default "cpu")."""
    return (os.environ.get("XLA_BACKEND_PLATFORM") or os.environ.get("JAX_PLATFORMS") or "cpu").split(",")[0].lower()


def installed_plugins() -> list[str]:
    """Names of the PJRT plugins installed as ``jax_plugins`` entry points or packages."""
    import importlib.metadata
    import pkgutil

    names = {ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")}
    try:
        import jax_plugins  # namespace package used by the CUDA/ROCm plugins

        names |= {m.name for m in pkgutil.iter_modules(jax_plugins.__path__)}
    except ImportError:
        pass
    return sorted(names)


def require(devices: int | None = None):
    """Start JAX on the configured platform and return its devices (all processes).

    Raises PlatformError with JAX's reason when the platform cannot start (JAX itself
    sometimes raises a bare AssertionError there), and ValueError, as `jax.make_mesh`
    does, when fewer than `devices` devices exist.
    """
    platform = current_platform()
    try:
        import jax

        devs = jax.devices()
    except Exception as e:  # JAX raises RuntimeError, or AssertionError for a missing GPU plugin
        reason = f"{type(e).__name__}: {e}" if str(e) else f"{type(e).__name__} (JAX gave no message)"
        raise PlatformError(
            f"JAX could not start platform {platform!r}: {reason}. Installed PJRT plugins: "
            f"{installed_plugins() or 'none'}. Install the platform's plugin (for example "
            "`pip install -U \"jax[cuda12]\"`) or select another one with --platform / "
            "XLA_BACKEND_PLATFORM (cpu always exists)."
        ) from e
    if devices is not None and len(devs) < devices:
        hint = (
            f"on CPU, start a new process with XLA_BACKEND_DEVICES={devices} (or call "
            f"xla_backend.platform.configure(devices={devices}) before JAX starts)"
            if devs[0].platform == "cpu"
            else "use a smaller mesh or a machine with more devices"
        )
        raise ValueError(
            f"{devices} devices are needed but JAX has {len(devs)} {devs[0].platform} devices; {hint}."
        )
    return devs
