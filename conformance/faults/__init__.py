"""Planted miscompiles, on XLA's side only, to check that the suite, `conformance.check`, the
bisector and `explain` catch them. One module per stage a fault enters at:

* `jaxpr`     runners for `conformance.debug.bisect` that rewrite one equation of the program
              XLA compiles (`bisect(..., runner=jaxpr.reversed_ppermute())`);
* `lowering`  JAX's lowering rules of collectives replaced by wrong ones modelled on real bugs:
              the named `FAULTS` of the mutation run (`python -m conformance mutate`);
* `numerics`  a lowering fault of an ordinary op for programs without explicit collectives
              (`numerics.DOT_GENERAL_BF16`: a matmul that rounds its operands to bfloat16);
* `compiler`  edits of the lowered StableHLO text before XLA compiles it
              (`explain(..., edit_module=compiler.reversed_permute_pairs)`).

`inject(fault)` activates lowering-stage faults for a ``with`` block: a name of `FAULTS`, a
`Fault` (such as `numerics.DOT_GENERAL_BF16`) or a list of them. refsim never lowers, so it
still computes the right answer while XLA runs the wrong one.
"""
from conformance.faults.lowering import FAULTS, Fault, RuleEnv, apply, inject, names

__all__ = ["FAULTS", "Fault", "RuleEnv", "apply", "inject", "names"]
