"""Which exported programs the installed JAX promises to run: the compatibility window.

jax.export documents its guarantees in terms of two versions that an artifact carries
(https://docs.jax.dev/en/latest/export/export.html#compatibility-guarantees):

* the **calling convention version** of the `Exported` (``Exported.calling_convention_version``):
  a JAX deserializes and calls only versions in
  ``[jax.export.minimum_supported_calling_convention_version,
  jax.export.maximum_supported_calling_convention_version]``;
* the **StableHLO portable-artifact version** of its module: StableHLO's compatibility promise
  (openxla/stablehlo docs/compatibility.md: 6 months backward, 1 month forward) is that a
  consumer reads artifacts whose version lies in its ``[get_minimum_version(),
  get_current_version()]``; the exporter writes the version 4 weeks back from its own
  (``StablehloCompatibilityRequirement.WEEK_4``), so a consumer more than about a month older
  than the exporter is outside the window.

A JAX that refuses an artifact as older than its backward-compatibility window (jax >= 0.11.1
raises ValueError saying so) is outside the window as well (`refused_as_expired`). A program
outside the window is reported as such, with what happened when it ran anyway; only a program
inside it can be a finding.
"""
from __future__ import annotations

import re

__all__ = ["installed", "outside", "refused_as_expired", "stablehlo_version"]

_PRODUCER = re.compile(rb"StableHLO_v(\d+\.\d+\.\d+)")
_EXPIRED = re.compile(r"backward-compatibility window|beyond the .* compat(ibility)? window|cannot be deserialized "
                      r"anymore", re.IGNORECASE)


def _version(text: str) -> tuple:
    return tuple(int(p) for p in str(text).split("."))


def stablehlo_version(module_bytes: bytes) -> str | None:
    """The StableHLO version a portable artifact (``Exported.mlir_module_serialized``) was written
    at, read from its producer string (``StableHLO_v1.15.0``); None when it names none."""
    m = _PRODUCER.search(bytes(module_bytes))
    return m.group(1).decode("ascii") if m else None


def installed() -> dict:
    """The installed JAX's side of the window: its versions, the calling convention versions it
    calls, the one it exports with, and the StableHLO versions it reads."""
    # JAX loads here, when a command runs, after the platform is configured
    import jax
    import jaxlib
    from jax import export
    from jaxlib.mlir.dialects import stablehlo

    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "calling_convention": [int(export.minimum_supported_calling_convention_version),
                                   int(export.maximum_supported_calling_convention_version)],
            "calling_convention_exported": int(jax.config.jax_export_calling_convention_version),
            "stablehlo": {"minimum": str(stablehlo.get_minimum_version()),
                          "current": str(stablehlo.get_current_version())}}


def outside(program: dict, runner: dict) -> list[str]:
    """Why a bundle program (its manifest entry) is outside `runner`'s window (`installed()`); [] inside."""
    why = []
    ccv = program.get("calling_convention_version")
    lo, hi = runner["calling_convention"]
    if not isinstance(ccv, int) or not lo <= ccv <= hi:
        why.append(f"calling convention version {ccv} is outside this JAX's supported [{lo}, {hi}]")
    shlo = program.get("stablehlo_version")
    smin, scur = runner["stablehlo"]["minimum"], runner["stablehlo"]["current"]
    if not isinstance(shlo, str) or not re.fullmatch(r"\d+\.\d+\.\d+", shlo):
        why.append(f"the artifact names no StableHLO version ({shlo!r})")
    elif _version(shlo) > _version(scur):
        why.append(f"StableHLO artifact v{shlo} is newer than this JAX's StableHLO v{scur} (forward "
                   "compatibility covers about 1 month)")
    elif _version(shlo) < _version(smin):
        why.append(f"StableHLO artifact v{shlo} is older than this JAX's minimum v{smin} (backward "
                   "compatibility covers 6 months)")
    return why


def refused_as_expired(exc: BaseException) -> bool:
    """Whether JAX refused to deserialize an artifact as outside its backward-compatibility window."""
    return isinstance(exc, ValueError) and bool(_EXPIRED.search(str(exc)))
