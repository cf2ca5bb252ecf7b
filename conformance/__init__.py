"""conformance: check refsim against XLA.

`conformance.check(fn, *args)` checks one call of your own program (docs/oracle.md); it and
`ConformanceError`, `NotCheckable`, `CheckTimeout`, `CheckResult` load on first use.
"""
_CHECK_API = ("check", "ConformanceError", "NotCheckable", "CheckTimeout", "CheckResult")


def __getattr__(name):
    if name in _CHECK_API:
        from conformance.oracle import check as _check

        return getattr(_check, name)
    raise AttributeError(f"module 'conformance' has no attribute {name!r}")
