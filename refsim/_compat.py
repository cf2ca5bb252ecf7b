"""Deprecated alias of `refsim.compat` (the JAX-version compatibility layer); import refsim.compat."""
import sys

from refsim import compat

sys.modules[__name__] = compat
