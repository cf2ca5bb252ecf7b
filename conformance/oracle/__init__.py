"""Oracle mode: check users' own programs (`conformance.check`) and test suites
(`pytest --conformance-oracle`, `python -m conformance check SCRIPT.py`) against refsim.

* `program`   traces a call and evaluates it on refsim, laid out as the program states.
* `policy`    the tolerance policy for general programs (exact, or a magnitude-scaled bound).
* `reproduce` standalone reproducer files for a user's program.
* `intercept` wraps `jax.jit`, `jax.shard_map`, `jax.pmap` (and `jax.experimental`'s shard_map
  and pjit) so top-level calls are checked.
* `session`   counts, per-call records, the summary line and the JSON report.
"""
