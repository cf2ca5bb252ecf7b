"""conformance: check refsim against XLA.

`conformance.check(fn, *args)` checks one call of your own program (docs/oracle.md); it and
`ConformanceError`, `XlaError`, `NotCheckable`, `CheckResult` load on first use.
`conformance.explain(fn, *args)` (the callable `conformance.explain` module) and
`conformance.bisect(fn, *args)` take the same arguments and localise a disagreement to a
compiler stage and an op, or to an equation (docs/debugging.md).
"""
_CHECK_API = ("check", "ConformanceError", "NotCheckable", "CheckResult", "XlaError")


def __getattr__(name):
    if name in _CHECK_API:
        from conformance.oracle import check as _check

        return getattr(_check, name)
    if name == "explain":
        import importlib

        return importlib.import_module("conformance.explain")
    if name == "bisect":
        from conformance.debug.bisect import bisect

        return bisect
    raise AttributeError(f"module 'conformance' has no attribute {name!r}")
