"""conformance: check refsim against XLA."""
