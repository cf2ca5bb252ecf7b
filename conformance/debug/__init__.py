"""Debugging miscompiles: which equation, which devices and which elements diverged.

`bisect(fn, *args, mesh=..., in_specs=..., out_specs=...)` compiles prefixes of the
program on XLA and compares each with refsim to find the diverging equation;
`picture.render` draws the per-device errors; `loader.load("file.py:NAME")` reads a
conformance reproducer; `python -m conformance.debug FILE.py[:NAME]` runs it all.
"""
from conformance.debug.bisect import BisectResult, Divergence, InputInfo, Step, ValueReport, bisect, bisect_region
from conformance.debug.diff import DeviceDiff, abs_error, differing_ranges, ulp_error
from conformance.debug.region import Region, refsim_values, trace, xla_runner

__all__ = [
    "BisectResult", "DeviceDiff", "Divergence", "InputInfo", "Region", "Step", "ValueReport", "abs_error",
    "bisect", "bisect_region", "differing_ranges", "refsim_values", "trace", "ulp_error", "xla_runner",
]
