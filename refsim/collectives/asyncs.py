"""Asynchronous collectives: `*_start` returns a Future, `*_done` resolves it.

refsim has no overlap to simulate: a start computes its synchronous collective at
once and wraps the result; the matching done returns it, so every async pair equals
its synchronous op (as JAX lowers each pair to StableHLO async_start/async_done
around the same collective).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Future:
    """An in-flight collective result (JAX's `core.Future` / `AbstractFuture`)."""

    value: Any
    primitive: str


def start(value, primitive: str) -> Future:
    return Future(value, primitive)


def done(future, primitive: str):
    """Resolve `future`; TypeError (as JAX's async done abstract eval) for a non-Future."""
    if not isinstance(future, Future):
        raise TypeError(
            f"async done op {primitive} got {type(future).__name__}, want a Future from a "
            "*_start collective; pass the value the matching *_start returned.")
    return future.value
