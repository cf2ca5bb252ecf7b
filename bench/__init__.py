"""Benchmarks: refsim against XLA:CPU on the same programs (`python -m bench`, docs/performance.md)."""
