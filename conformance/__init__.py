"""conformance: check refsim against XLA.

`conformance.check(fn, *args)` checks one call of your own program (docs/oracle.md); it and
`ConformanceError`, `XlaError`, `NotCheckable`, `CheckTimeout`, `CheckResult` load on first use.
`conformance.explain(fn, *args)` (the callable `conformance.explain` module) and
`conformance.bisect(fn, *args)` take the same arguments and localise a disagreement to a
compiler stage and an op, or to an equation (docs/debugging.md). The package's rooms
(verdict, cases, strategies, suites, engine, report, oracle, debug, faults) are described in
docs/architecture.md.
"""
import importlib
import importlib.abc
import importlib.util
import sys

_CHECK_API = ("check", "ConformanceError", "NotCheckable", "CheckTimeout", "CheckResult", "XlaError")

#: Module paths of earlier layouts that documented code may still import, and the module each
#: now is. Importing an old path gives the new module object itself (patching included).
MOVED = {
    "conformance.compare": "conformance.verdict.compare",
    "conformance.xfails": "conformance.verdict.xfails",
    "conformance.platform_models": "conformance.verdict.platform_models",
    "conformance.runner": "conformance.engine.runner",
    "conformance.plan": "conformance.engine.plan",
    "conformance.results": "conformance.report.results",
    "conformance.corpus": "conformance.cases.corpus",
    "conformance.repro": "conformance.cases.repro",
    "conformance.mpmd_checks": "conformance.suites.mpmd_checks",
    "conformance.explain": "conformance.debug.explain",
    "conformance.explain.planted": "conformance.faults.compiler",
    "conformance.debug.planted": "conformance.faults.jaxpr",
    "conformance.oracle.planted": "conformance.faults.numerics",
}


def _moved_to(name: str) -> str | None:
    """The new path of `name`: an entry of MOVED, or a submodule of a moved package."""
    if name in MOVED:
        return MOVED[name]
    head, _, tail = name.rpartition(".")
    while head:
        if head in MOVED:
            return f"{MOVED[head]}.{name[len(head) + 1:]}"
        head, _, _ = head.rpartition(".")
    return None


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path (MOVED) as the module it now is."""

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("conformance.") or _moved_to(name) is None:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        module = importlib.import_module(_moved_to(spec.name))
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        spec = module.__spec__
        if spec is not None and spec.loader is self:  # the import system gave it the old path's spec
            module.__spec__ = spec.loader_state


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())


def __getattr__(name):
    if name == "check":  # the oracle's check, explained on a disagreement (loads JAX on first use only)
        from conformance.debug.explain import on_check

        return on_check.check
    if name in _CHECK_API:
        from conformance.oracle import check as _check  # loads JAX-facing code on first use only

        return getattr(_check, name)
    if name == "explain":
        import importlib

        return importlib.import_module("conformance.explain")
    if name == "bisect":
        from conformance.debug.bisect import bisect

        return bisect
    raise AttributeError(f"module 'conformance' has no attribute {name!r}")
