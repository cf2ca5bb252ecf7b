"""Provenance recorded in every xla_backend result's ``info``: what ran, where.

A conformance mismatch is only a useful bug report with the JAX/jaxlib versions,
the platform and its version, the device kinds and the process layout, plus the
compiled HLO text when asked for.
"""
from __future__ import annotations

import functools
import platform as _py_platform


@functools.lru_cache(maxsize=None)
def _static_info() -> tuple:
    import jax
    import jaxlib

    devs = jax.devices()
    backend = devs[0].client
    return (
        ("backend", "xla"),
        ("jax_version", jax.__version__),
        ("jaxlib_version", jaxlib.__version__),
        ("platform", devs[0].platform),
        ("platform_version", str(getattr(backend, "platform_version", ""))),
        ("device_kinds", tuple(sorted({d.device_kind for d in devs}))),
        ("device_count", len(devs)),
        ("local_device_count", jax.local_device_count()),
        ("process_count", jax.process_count()),
        ("process_index", jax.process_index()),
        ("python", _py_platform.python_version()),
    )


def info(*, compiled=None, hlo: bool = False, mode: str | None = None, **extra) -> dict:
    """A fresh provenance dict; with ``hlo=True`` and a `jax.stages.Compiled`, its HLO text."""
    out = dict(_static_info())
    if mode is not None:
        out["mode"] = mode
    if hlo:
        if compiled is None:
            raise ValueError(
                f"hlo=True needs a compiled executable, but mode={mode!r} runs without one; "
                "use the jit mode (eager=False) to get the compiled HLO text."
            )
        out["hlo"] = compiled.as_text()
    out.update(extra)
    return out


def hardware() -> dict:
    """What a conformance report records about the machine: platform and its runtime version,
    device kinds, the topology (every device's id, process, and where the platform gives them
    its coordinates and core), the installed platform packages, and JAX's versions."""
    import importlib.metadata

    import jax
    import jaxlib

    devs = jax.devices()
    topo = []
    for d in devs:
        entry = {"id": int(d.id), "process": int(d.process_index), "kind": d.device_kind}
        for attr in ("coords", "core_on_chip", "slice_index"):  # TPU topology, where present
            value = getattr(d, attr, None)
            if value is not None:
                entry[attr] = list(value) if isinstance(value, (tuple, list)) else value
        topo.append(entry)
    packages = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith(("jax-cuda", "jax_cuda", "jax-rocm", "jax_rocm", "libtpu", "nvidia-cuda-runtime",
                            "nvidia-cudnn", "nvidia-nccl")):
            packages[name] = dist.version
    by_process: dict = {}
    for e in topo:
        by_process.setdefault(e["process"], []).append(e["id"])
    return {
        "platform": devs[0].platform,
        "platform_version": str(getattr(devs[0].client, "platform_version", "")),
        "device_kinds": sorted({d.device_kind for d in devs}),
        "device_count": len(devs),
        "process_count": jax.process_count(),
        "local_device_count": jax.local_device_count(),
        "devices": topo,
        "topology": "; ".join(f"process {p}: ids {','.join(map(str, ids))}" for p, ids in sorted(by_process.items())),
        "packages": packages,
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
    }
