"""The mpmd suite: SPMD -> MPMD -> SPMD round trips (`conformance.suites.mpmd_checks.check_mpmd`),
refsim's stated properties plus XLA agreeing device by device, one task per drawn case."""
from __future__ import annotations

import functools

from conformance.suites.base import CheckTask, Outcome, flatten
from conformance.suites.mpmd_checks import MpmdCase, check_mpmd, draw_cases

NAME = "mpmd"
MIN_DEVICES = 2  # an MPMD mesh has at least two groups of devices


def not_drawn(devices: int) -> list[str]:
    """The families no mesh of `devices` devices can express (the run's plan lists them)."""
    if devices < MIN_DEVICES:
        return [f"{NAME}/round_trip: an MPMD mesh needs at least {MIN_DEVICES} devices (2 groups)"]
    return []


def check_case(case_json: str, xla) -> Outcome:
    (r,) = check_mpmd(cases=[MpmdCase.from_json(case_json)])
    return Outcome("pass" if r.passed else "fail", "" if r.passed else r.message)


def task_chunks(*, examples: int, seed: int, devices: int):
    """The suite's tasks, as one list (its cases are drawn together)."""
    if devices < MIN_DEVICES:  # nothing to draw: `not_drawn` says so in the plan
        yield []
        return
    out = []
    for case in draw_cases(max(1, examples), seed, max_devices=devices):
        dtypes = sorted({leaf.dtype for leaf in case.leaves})
        out.append(CheckTask(case.case_id, NAME, f"round_trip[{case.tree},{case.threshold_kind}]",
                             dtypes[0] if len(dtypes) == 1 else "mixed",
                             functools.partial(check_case, case.to_json())))
    yield out


def tasks(*, examples: int, seed: int, devices: int) -> list:
    return flatten(task_chunks(examples=examples, seed=seed, devices=devices))
