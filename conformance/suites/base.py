"""What a suite hands the runner: tasks, each one conformance case (one `CaseResult`).

A `ProgramTask` is a `conformance.cases.Program` case id with its examples: every drawn
structure (function, mesh, specs) run with `DATA_VARIANTS` data sets, so examples that
differ only in data reuse one compiled XLA executable. Its `shrink` names the strategy a
failure is shrunk with. A `CheckTask` is any other check (layouts, errors, MPMD): a
picklable callable ``check(xla) -> Outcome``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed

from conformance.report.failure import Failure
from conformance.strategies.arrays import _EXACT, _INT_K, _is_float, special_values
from conformance.verdict.compare import _finfo
from refsim.values import complex_from_parts

# Data sets per drawn structure: the first is hypothesis's draw, the others refill the same
# shapes and dtypes, so they hit xla_backend's compile cache. What each refill holds is one of
# DATA_KINDS: "exact" (exact-friendly: every sum exact in any order), "special" (exact-friendly
# with special values: NaN with payloads, ±inf, -0, subnormals, the largest finite values),
# "special-ieee" (only NaN, ±inf and -0, whose sums no order changes: for whole programs, which
# have no per-element sum model), "rounding" (random floats over several binades: sums round).
DATA_VARIANTS = 3
DATA_KINDS = ("exact", "special", "special-ieee", "rounding")
COLLECTIVE_DATA = ("drawn", "special", "rounding")
PROGRAM_DATA = ("drawn", "exact", "special-ieee")


@dataclasses.dataclass
class Outcome:
    """What a check found: status (pass / fail / error / unsupported), a message, examples, and the
    failure record `details` (`conformance.report.failure.Failure`; a dict is read with `Failure.from_json`)."""

    status: str
    message: str = ""
    examples: int = 1
    details: Failure = dataclasses.field(default_factory=Failure)

    def __post_init__(self):
        self.details = Failure.from_json(self.details)


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


def flatten(chunks) -> list:
    """The tasks of a suite's `task_chunks` as one list, in order (the suite's `tasks`)."""
    return [t for chunk in chunks for t in chunk]


def draw(strategy, count: int, seed: int) -> list:
    """`count` examples of `strategy`, deterministic in `seed` (hypothesis generate phase only)."""
    out: list = []
    if count <= 0:
        return out

    @hseed(seed)
    @settings(max_examples=count, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(x):
        out.append(x)

    with source_constants_off():
        collect()
    return out[:count]


_CONSTANTS_LOCK = threading.Lock()


@contextlib.contextmanager
def source_constants_off():
    """Hypothesis without the constants it collects from the source of every loaded local module.

    Recent hypothesis (6.170 here) sometimes draws a number literal found in a local module's source, so
    without this a seeded plan changed with any literal edited anywhere in refsim, xla_backend or
    conformance, with which modules happened to be imported, and between a checkout and an
    installed copy (whose modules are not "local"). The plan is a function of the seed, the
    strategies and the versions only (a plan's identity, `conformance.engine.plan.IDENTITY_KEYS`, names exactly those).
    Hypothesis has no setting for it: this empties its private hook while drawing, and is a no-op
    on a hypothesis without one."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:   # a hypothesis without source constants
        yield
        return
    get = getattr(providers, "_get_local_constants", None)
    cache = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    if get is None or cache is None:
        yield
        return
    empty = Constants()
    with _CONSTANTS_LOCK:
        # the permitted-constants cache holds local constants filtered per constraint: dropped on
        # entry and on exit, so neither this draw nor a later test sees the other's pool
        cache.clear()
        providers._get_local_constants = lambda: empty
        try:
            yield
        finally:
            providers._get_local_constants = get
            cache.clear()


def exact_friendly(rng: np.random.Generator, like: np.ndarray) -> np.ndarray:
    """New data with the shape and dtype of `like`, drawn as `conformance.strategies.arrays` draws
    exact-friendly values (small integers times small powers of two), so sums stay exact."""
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


def special_fill(rng: np.random.Generator, like: np.ndarray, kinds=("nan", "inf", "-0", "subnormal", "max"),
                 share: float = 0.3) -> np.ndarray:
    """Exact-friendly data of `like`'s shape and dtype in which about `share` of the elements
    (of each component of a complex dtype) are `conformance.strategies.arrays.special_values`
    of `kinds`; integers and bools get plain exact-friendly data."""
    base = exact_friendly(rng, like)
    table = special_values(base.dtype, kinds)
    if not len(table) or not base.size:
        return base
    if base.dtype.kind == "c":
        real = np.dtype(f"f{base.dtype.itemsize // 2}")
        re = special_fill(rng, base.real.astype(real), kinds, share)
        im = special_fill(rng, base.imag.astype(real), kinds, share)
        return complex_from_parts(re, im, base.dtype)
    pick = rng.random(base.shape) < share
    return np.where(pick, table[rng.integers(0, len(table), size=base.shape)], base).astype(base.dtype)


def rounding_fill(rng: np.random.Generator, like: np.ndarray) -> np.ndarray:
    """Random floats of `like`'s shape and dtype over 16 binades with both signs, so sums round
    (the comparator's bound applies); integers and bools get exact-friendly data."""
    like = np.asarray(like)
    dt = like.dtype

    if not _is_float(dt):
        return exact_friendly(rng, like)

    real_dt = np.dtype(f"f{dt.itemsize // 2}") if dt.kind == "c" else dt
    hi = min(8, int(np.log2(float(_finfo(real_dt).max))) - 1)   # float8's range is small

    def real():
        mag = rng.uniform(1, 2, size=like.shape) * 2.0 ** rng.integers(-8, hi, size=like.shape)
        return np.where(rng.random(like.shape) < 0.5, -mag, mag)

    if dt.kind == "c":
        return (real() + 1j * real()).astype(dt)
    return real().astype(dt)


def refill(rng: np.random.Generator, like: np.ndarray, kind: str) -> np.ndarray:
    """New data of `like`'s shape and dtype of one of `DATA_KINDS`."""
    if kind == "exact":
        return exact_friendly(rng, like)
    if kind == "special":
        return special_fill(rng, like)
    if kind == "special-ieee":
        return special_fill(rng, like, ("nan", "inf", "-0"))
    if kind == "rounding":
        return rounding_fill(rng, like)
    raise ValueError(f"data kind {kind!r}; choose from {DATA_KINDS}.")


def with_data_variants(case, count: int, seed: int, data=None) -> list:
    """`case` plus `count - 1` copies with fresh data of the same shapes: the i-th copy of kind
    ``data[i]`` (`DATA_KINDS`; `data[0]` is the drawn case itself), "exact" by default."""
    rng = np.random.default_rng(seed)
    out = [case]
    kinds = list(data[1:]) if data else []
    for i in range(count - 1):
        kind = kinds[i % len(kinds)] if kinds else "exact"
        out.append(dataclasses.replace(case, args=tuple(refill(rng, a, kind) for a in case.args)))
    return out


def group_tasks(suite: str, cases: list, *, seed: int, shrink_of: Callable | None = None,
                variants: int = DATA_VARIANTS, data=None) -> list[ProgramTask]:
    """Program cases grouped by case id into tasks, each drawn structure with `variants` data
    sets of the kinds `data` names (see `with_data_variants`)."""
    tasks: dict[str, ProgramTask] = {}
    for i, case in enumerate(cases):
        cid = case.case_id
        if cid not in tasks:
            tasks[cid] = ProgramTask(cid, suite, case.family, case.dtype, [],
                                     shrink_of(case) if shrink_of else None)
        tasks[cid].variants += with_data_variants(case, variants, seed * 7919 + i, data)
    return list(tasks.values())
