"""xla_backend: run refsim's programs on real XLA through JAX."""
