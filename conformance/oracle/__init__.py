"""Oracle mode: check users' own programs (`conformance.check`) and test suites
(`pytest --conformance-oracle`, `python -m conformance check SCRIPT.py`) against refsim.

* `program`   traces a call and evaluates it on refsim, laid out as the program states.
* `policy`    the tolerance policy for general programs (exact, or a magnitude-scaled bound).
* `reproduce` standalone reproducer files for a user's program.
* `intercept` hooks JAX's jit dispatch so every distributed program is seen where it executes
  (jit, pjit, pmap, eager shard_map, transformations outside jit, eager ops on sharded arrays).
* `session`   counts, per-call records, the census, the summary line and the JSON report.
"""
