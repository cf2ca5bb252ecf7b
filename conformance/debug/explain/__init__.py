"""Which compiler stage miscompiled a program: `conformance.explain(fn, *args, ...)`.

`conformance.explain` is this module and is callable: ``conformance.explain(fn, *args)`` is
``conformance.explain.explain(fn, *args)``, taking what `conformance.check` takes. See
`conformance.debug.explain.core` for the stages and `python -m conformance explain REPRO.py` for the
command line.
"""
import sys
import types

from conformance.debug.explain.core import Explanation, explain, explain_staged, localise
from conformance.debug.explain.stages import BOUNDARY, STAGES

__all__ = ["BOUNDARY", "Explanation", "STAGES", "explain", "explain_staged", "localise"]


class _CallableModule(types.ModuleType):
    """This package, callable as its `explain` function (submodules and names stay as they are)."""

    def __call__(self, fn, *args, **kwargs) -> Explanation:
        return explain(fn, *args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
