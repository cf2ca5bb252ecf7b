"""The conformance suites: collectives, layouts, programs, errors, mpmd, sharded.

Each suite module has ``task_chunks(*, examples, seed, devices)``, a generator of lists of
`conformance.suites.base.ProgramTask` / `CheckTask` (one list per family, yielded as soon as
it is drawn, so a run can start cases while it draws the rest), and ``tasks(...) -> list``,
the same tasks flattened; suites whose failures shrink also
have ``strategy(family, dtype, devices)``, the hypothesis strategy a failing case is
shrunk within.
"""
from __future__ import annotations

import importlib

SUITES = ("collectives", "layouts", "programs", "errors", "mpmd", "sharded")


def module(name: str):
    """The suite module `name` (one of SUITES)."""
    if name not in SUITES:
        raise ValueError(f"suite={name!r}; choose one of {SUITES} or 'all'.")
    return importlib.import_module(f"conformance.suites.{name}")


def selected(suite) -> tuple:
    """The suite names `suite` selects: a name, 'all', or a comma-separated list / sequence of names."""
    if isinstance(suite, str):
        names = SUITES if suite == "all" else tuple(s.strip() for s in suite.split(",") if s.strip())
    else:
        names = tuple(suite)
    for n in names:
        module(n)
    if not names:
        raise ValueError(f"suite={suite!r} selects nothing; choose one of {SUITES} or 'all'.")
    return names
