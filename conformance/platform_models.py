"""`conformance.platform_models` is `conformance.verdict.platform_models` under its older name
(the same module object, so every name, patching included, is shared)."""
import sys

from conformance.verdict import platform_models as _module

sys.modules[__name__] = _module
