"""Cross-version export conformance: `jax.export` round trips between installed JAX versions.

A drawn sharded program is exported with one JAX (`jax.export`, its in/out shardings on a mesh
of virtual CPU devices) and serialized, together with its inputs and refsim's expected outputs
(computed from the exporter's jaxpr), into a bundle folder (`bundle`); another JAX deserializes
and runs it on a mesh of the same shape and device order, and the project's verdict
(`conformance.verdict.compare`) judges its outputs (`run`). StableHLO's and jax.export's
compatibility promise decides which pairs must agree (`window`): a pair outside it is reported as
outside the window, never as a failure; a disagreement or crash inside it is a finding, written
ready to file (`findings`).

    python -m conformance export-bundle --out DIR --programs N --seed S     (conformance.export.write)
    python -m conformance run-bundle DIR [--report DIR]                      (conformance.export.run)

The rooms: `bundle` (the folder format: a JSON manifest, the serialized Exported, inputs and
expected outputs as .npz read without pickle, a sha256 per file) and `window` import no JAX
at module level; `write` and `run` load it when they run, after the platform is configured.
"""
