"""Where a conformance run's time goes: seconds per phase, per case and for the whole run.

Phases (`PHASES`): drawing the cases (hypothesis, in the parent process), refsim (its
calls in program cases), XLA compile (every compilation JAX reports, loads from the persistent
cache included) and XLA run (xla_backend's counter of executions), XLA trace + lower (the rest of an XLA call in a program case:
JAX tracing, lowering to StableHLO, transfers), compare, checks (layout / error / MPMD
checks, whose refsim and XLA tracing are not separated; their compile and run are
counted above), and shrink (hypothesis shrinking a failure). Each case's phases are in
`CaseResult.phases`; `totals` adds them up for the summary, and `line` prints the shares.

With worker processes the phases of different cases overlap in time, so their sum can
exceed the wall time; the shares are of that sum (the work done), and the wall time is
printed beside them.
"""
from __future__ import annotations

import contextlib
import time

from xla_backend import cache

PHASES = ("drawing", "refsim", "xla_compile", "xla_run", "xla_trace_lower", "compare", "checks", "shrink")
LABELS = {"drawing": "drawing", "refsim": "refsim", "xla_compile": "XLA compile", "xla_run": "XLA run",
          "xla_trace_lower": "XLA trace+lower", "compare": "compare", "checks": "other checks",
          "shrink": "shrink"}


_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch.BACKEND_COMPILE_EVENT
_compile_seconds = [0.0, False]  # seconds so far, listener registered


def _on_duration(event: str, duration: float, **_kw) -> None:
    if event == _COMPILE_EVENT:
        _compile_seconds[0] += duration


def xla_counters() -> tuple[float, float]:
    """(compile seconds, run seconds) so far in this process.

    Compile: every XLA compilation (or load from the persistent cache) JAX reports through
    `jax.monitoring`, including the ones checks start without xla_backend; run: xla_backend's
    counter of executions.
    """
    if not _compile_seconds[1]:
        import jax  # not at the top: the runner imports this module before it configures the platform

        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _compile_seconds[1] = True
    return _compile_seconds[0], cache.stats()["run_seconds"]


@contextlib.contextmanager
def timed(acc: dict, phase: str):
    """Add the seconds spent in the block to ``acc[phase]``."""
    t = time.perf_counter()
    try:
        yield
    finally:
        acc[phase] = acc.get(phase, 0.0) + time.perf_counter() - t


def totals(results, drawing_seconds: float) -> dict:
    """Seconds per phase over every result (in `PHASES` order), drawing included."""
    out = dict.fromkeys(PHASES, 0.0)
    out["drawing"] = float(drawing_seconds)
    for r in results:
        for k, v in (getattr(r, "phases", None) or {}).items():
            if k in out:
                out[k] += float(v)
    return out


def line(phases: dict, wall_seconds: float) -> str:
    """``time: drawing 12% · refsim 6% · XLA compile 48% · ...`` (share of the summed phases)."""
    total = sum(phases.values())
    if total <= 0:
        return ""
    parts = [f"{LABELS.get(k, k)} {100 * v / total:.0f}%" for k, v in phases.items() if v > 0]
    return (f"time by phase ({total:.1f} s of work in {wall_seconds:.1f} s wall): " + " · ".join(parts))
