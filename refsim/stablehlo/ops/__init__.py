"""Rules of refsim.stablehlo, one module per op family (each registers into `registry.OPS`)."""
