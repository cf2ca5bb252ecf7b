"""Which compiler stage miscompiled a program: `explain(fn, *args, ...)`.

See `conformance.explain.core` for the stages and `python -m conformance explain REPRO.py`
for the command line.
"""
from conformance.debug.explain.core import Explanation, explain, explain_staged
from conformance.debug.explain.stages import BOUNDARY, STAGES

__all__ = ["BOUNDARY", "Explanation", "STAGES", "explain", "explain_staged"]
