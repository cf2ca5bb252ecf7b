"""The engine: plan a run, run its cases and hand the results to reporters.

* `runner`        `run()`: draw every suite's tasks, run them (in this process or in workers),
                  apply the xfails file, shrink failures, report each case as it finishes;
* `plan`          a run's identity (suites, seed, versions), `--shard K/N` and `--resume` checks;
* `workers`       crash-isolated worker processes (a fatal XLA CHECK or a hang is one case's result);
* `distributed`   one run over every process of a `jax.distributed` job;
* `merge`         one report from the report folders of a plan's shards;
* `preflight`     the platform comes up (in a child process) before any case runs;
* `compile_cache` JAX's persistent compilation cache for reruns;
* `mutate`        the suite's power against injected miscompiles (`conformance.faults`).

Nothing is imported here: `python -m conformance` configures the platform before JAX loads.
"""
