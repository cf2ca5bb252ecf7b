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

`inject(fault)` (`conformance.faults.stages`) is the one entry: it plants a fault of any stage,
or a list of them, for a ``with`` block, dispatching on the fault's stage (`stage_of`): a name
of `FAULTS` or a `Fault` (such as `numerics.DOT_GENERAL_BF16`) at lowering, a runner of `jaxpr`
for `bisect`, an edit of `compiler` for `explain`. refsim never lowers, so it still computes the
right answer while XLA runs the wrong one. `lowering.inject` is the lowering stage's own step.

`inject` yields a `Planted`: the names planted (a list) and `fired`, how many times each changed
what XLA compiled or ran (`firing`); a fault that never fired in its block is reported with a
`FaultNotFired` warning. `catalogue` names every fault for the command line (`--plant NAME` of
`check`, `explain` and `bisect`).
"""
from conformance.faults.firing import FaultNotFired, NothingToEdit, Planted
from conformance.faults.lowering import FAULTS, Fault, RuleEnv, apply, names
from conformance.faults.stages import STAGES, inject, mark, stage_of

__all__ = ["FAULTS", "STAGES", "Fault", "FaultNotFired", "NothingToEdit", "Planted", "RuleEnv", "apply", "inject",
           "mark", "names", "stage_of"]
