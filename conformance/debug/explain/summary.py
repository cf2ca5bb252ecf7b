"""The stage of a failing case, as the runner records it and the reports show it.

`stage_of_reproducer(path)` runs `explain` on a reproducer file and returns a small JSON-able
dict (`diverged_in`, `op`, `source`, per-stage agreement); it never raises, so a case whose
stages cannot be evaluated still gets its report (with `error` saying why).
"""
from __future__ import annotations

# the one line a report prints for a stage record lives with the failure record it formats
from conformance.report.failure import stage_line  # noqa: F401 - kept name

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.


def summarize(exp) -> dict:
    """{"diverged_in", "op", "source", "stages": {stage: agrees with the previous}, "headline",
    and, where they apply, "candidates" (undetermined), "crash", "not_evaluated"} of an Explanation."""
    out = {"diverged_in": exp.diverged_in, "op": exp.op, "source": exp.source,
           "stages": {s.name: exp.agrees.get(s.name) for s in exp.stages if s.name != "jaxpr"},
           "headline": exp.headline()}
    if exp.candidates:
        out["candidates"] = list(exp.candidates)
    if exp.crash:
        out["crash"] = exp.crash
    if exp.not_evaluated:
        out["not_evaluated"] = dict(exp.not_evaluated)
    return out


def stage_of_reproducer(path: str) -> dict:
    """`summarize(explain(...))` of the case a reproducer file holds; {"error": ...} if it cannot run."""
    import jax

    # a reproducer may set JAX's config when it is loaded (the sharded suite's GSPMD cases switch the
    # partitioner): the process that explains it gets its own setting back
    shardy = getattr(jax.config, "jax_use_shardy_partitioner", None)
    try:
        return _stage_of_reproducer(path)
    finally:
        if shardy is not None:
            jax.config.update("jax_use_shardy_partitioner", shardy)


def _stage_of_reproducer(path: str) -> dict:
    try:
        from conformance.debug import loader
        from conformance.debug.explain.core import explain

        case = loader.load(path)
        if case.kind == "device_put":
            return {"diverged_in": None, "error": "a device_put case has no program to lower"}
        kw = case.bisect_kwargs()
        fn = kw.pop("_fn", case.program)
        return summarize(explain(fn, *case.inputs, **kw))
    except Exception as e:  # noqa: BLE001 - the failure is reported whatever happens here
        return {"diverged_in": None, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
