"""Test configuration: 8 virtual CPU devices (set before JAX is imported) and hypothesis profiles."""
import os

from xla_backend import platform

platform.configure(os.environ.get("XLA_BACKEND_PLATFORM", "cpu"), int(os.environ.get("XLA_BACKEND_DEVICES", "8")))
# CLI runs inside tests neither write ~/.cache nor turn on JAX's persistent cache for the test process.
os.environ.setdefault("CONFORMANCE_COMPILE_CACHE", "off")

from hypothesis import HealthCheck, settings  # noqa: E402

# CI is derandomized: a landing is judged on the same draws every time, so a red run is a
# change's doing and never a lucky draw; `nightly` (random, 500 examples) explores further.
settings.register_profile(
    "ci", max_examples=30, deadline=None, print_blob=True, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev", max_examples=15, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "nightly", max_examples=500, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
