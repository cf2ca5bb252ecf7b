"""`conformance.xfails` is `conformance.verdict.xfails` under its older name (the same module
object, so every name, patching included, is shared)."""
import sys

from conformance.verdict import xfails as _module

sys.modules[__name__] = _module
