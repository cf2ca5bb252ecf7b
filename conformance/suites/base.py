"""What a suite hands the runner: tasks, each one conformance case (one `CaseResult`).

A `ProgramTask` is a `conformance.cases.Program` case id with its examples: every drawn
structure (function, mesh, specs) run with `DATA_VARIANTS` data sets, so examples that
differ only in data reuse one compiled XLA executable. Its `shrink` names the strategy a
failure is shrunk with. A `CheckTask` is any other check (layouts, errors, MPMD): a
picklable callable ``check(xla) -> Outcome``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

# Data sets per drawn structure: the first is hypothesis's draw, the others refill the same
# shapes and dtypes, so they hit xla_backend's compile cache.
DATA_VARIANTS = 3


@dataclasses.dataclass
class Outcome:
    """What a check found: status (pass / fail / error / unsupported), a message, examples, details."""

    status: str
    message: str = ""
    examples: int = 1
    details: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ProgramTask:
    """One case id of Program examples; `shrink` = (suite, family, dtype) for `strategy_for`."""

    case_id: str
    suite: str
    family: str
    dtype: str
    variants: list
    shrink: tuple | None = None


@dataclasses.dataclass
class CheckTask:
    """One case id checked by `check(xla) -> Outcome` (a module-level function or a partial of one)."""

    case_id: str
    suite: str
    family: str
    dtype: str
    check: Callable


def draw(strategy, count: int, seed: int) -> list:
    """`count` examples of `strategy`, deterministic in `seed` (hypothesis generate phase only)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    out: list = []
    if count <= 0:
        return out

    @hseed(seed)
    @settings(max_examples=count, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(x):
        out.append(x)

    collect()
    return out[:count]


def exact_friendly(rng: np.random.Generator, like: np.ndarray) -> np.ndarray:
    """New data with the shape and dtype of `like`, drawn as `conformance.strategies.arrays` draws
    exact-friendly values (small integers times small powers of two), so sums stay exact."""
    from conformance.strategies.arrays import _EXACT, _INT_K

    like = np.asarray(like)
    dt, shape = like.dtype, like.shape
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.kind in "iu":
        k = _INT_K[dt.itemsize]
        return rng.integers(0 if dt.kind == "u" else -k, k + 1, size=shape).astype(dt)
    k, emin = _EXACT.get(dt.name, (2, 0))

    def real():
        return rng.integers(-k, k + 1, size=shape) * 2.0 ** rng.integers(emin, 1, size=shape)

    if dt.kind == "c":
        return (real() + 1j * real()).astype(dt)
    return real().astype(dt)


def with_data_variants(case, count: int, seed: int) -> list:
    """`case` plus `count - 1` copies with fresh exact-friendly data of the same shapes."""
    rng = np.random.default_rng(seed)
    out = [case]
    for _ in range(count - 1):
        out.append(dataclasses.replace(case, args=tuple(exact_friendly(rng, a) for a in case.args)))
    return out


def group_tasks(suite: str, cases: list, *, seed: int, shrink_of: Callable | None = None,
                variants: int = DATA_VARIANTS) -> list[ProgramTask]:
    """Program cases grouped by case id into tasks, each drawn structure with `variants` data sets."""
    tasks: dict[str, ProgramTask] = {}
    for i, case in enumerate(cases):
        cid = case.case_id
        if cid not in tasks:
            tasks[cid] = ProgramTask(cid, suite, case.family, case.dtype, [],
                                     shrink_of(case) if shrink_of else None)
        tasks[cid].variants += with_data_variants(case, variants, seed * 7919 + i)
    return list(tasks.values())
