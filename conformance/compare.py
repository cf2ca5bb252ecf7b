"""`conformance.compare` is `conformance.verdict.compare` under its older name (the same module
object, so every name, patching included, is shared)."""
import sys

from conformance.verdict import compare as _module

sys.modules[__name__] = _module
