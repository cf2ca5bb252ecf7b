"""Importing this package registers every rule module in the registry."""
from refsim.interpreter.rules import elementwise, indexing, linalg, random, reductions, sorting, structural  # noqa: F401  (NumPy rules for non-collective primitives)
from refsim.interpreter.rules import collectives  # noqa: F401  (every collective primitive)
