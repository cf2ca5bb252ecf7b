"""Worked examples: realistic distributed JAX programs checked against refsim (docs/oracle.md)."""
