"""`conformance.check`: `conformance.oracle.check.check`, and on a disagreement
`conformance.explain` on the same call, so the message ends with the stage and the op that
introduced the difference ("explain: diverged in compiler at stablehlo.scatter (op #12)").

It lives in debug, above oracle: the oracle compares, the debugger localises; the public
`conformance.check` composes the two.
"""
from __future__ import annotations

import functools
import threading
from typing import Any

from conformance import validation
from conformance.debug.explain import core
from conformance.oracle import check as oracle_check
from conformance.oracle import intercept
from conformance.oracle.check import ConformanceError, XlaError

__all__ = ["EXPLAIN_TIMEOUT", "check", "explain_disagreement", "explain_line"]

#: Seconds `check` gives `conformance.explain` on a disagreement before it ends the message without it.
EXPLAIN_TIMEOUT = 120.0


def check(fn, *args, mesh=None, in_specs=None, out_specs=None, check_vma: bool = True, axis_names=None,
          in_shardings=None, out_shardings=None, policy="auto", ulps: int = oracle_check.policy_mod.DEFAULT_ULPS,
          repro_dir: str | None = None, name: str | None = None, timeout: float | None = oracle_check.DEFAULT_TIMEOUT,
          explain: bool = True, explain_timeout: float | None = EXPLAIN_TIMEOUT, **kwargs):
    """Run ``fn(*args, **kwargs)`` on XLA and on refsim and compare every output, device by device:
    `conformance.oracle.check.check`, whose arguments, results and exceptions these are. On a
    disagreement with `explain` (default True), `conformance.explain` runs on the same call (XLA
    in its worker process, so a fatal CHECK cannot end this one) and the message ends with its
    verdict, e.g. "explain: diverged in compiler at stablehlo.scatter (op #12)" or "explain:
    undetermined (...)"; it is paid only when the call disagrees, and gets `explain_timeout`
    seconds (None: no limit) before the message says it did not finish. XLA failing to compile
    or run (`XlaError`) is raised as it is: its stage is known."""
    if not isinstance(explain, bool):
        raise TypeError(f"check: explain={explain!r} must be True (run conformance.explain on a disagreement) "
                        "or False (do not).")
    validation.check_seconds("explain_timeout", explain_timeout, none=True,
                             what="seconds explain may take on a disagreement", none_means="for no limit")
    layout = dict(mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma, axis_names=axis_names,
                  in_shardings=in_shardings, out_shardings=out_shardings)
    try:
        return oracle_check.check(fn, *args, **layout, policy=policy, ulps=ulps, repro_dir=repro_dir, name=name,
                                  timeout=timeout, **kwargs)
    except XlaError:
        raise
    except ConformanceError as e:
        if not explain:
            raise
        line, explanation = explain_disagreement(fn, args, kwargs, layout, timeout=explain_timeout,
                                                 policy=policy if isinstance(policy, str) else "auto")
        err = ConformanceError(e.result, e.note, line)
        err.explanation = explanation
        raise err from None


def explain_line(exp) -> str:
    """One line for a `conformance.debug.explain.Explanation`: the stage and the op it names, or
    why it could not decide."""
    if exp.diverged_in in ("lowering", "compiler", "backend"):
        if exp.crash:
            return f"explain: diverged in {exp.diverged_in} (crash: {exp.crash.strip().splitlines()[0][:200]})"
        if exp.op:
            where = f" (op #{exp.op_index})" if exp.op_index is not None else ""
            return f"explain: diverged in {exp.diverged_in} at {exp.op}{where}" + (f", {exp.source}" if exp.source else "")
        return f"explain: diverged in {exp.diverged_in} (no op could be named)"
    head = exp.headline()
    if exp.diverged_in == "undetermined":
        return "explain: " + head.removeprefix("diverged in: ")
    return ("explain: no stage differs from the one before under explain's per-op tolerance "
            f"({exp.tolerance or 'auto'}; {head}), although the outputs differ under check's policy")


def explain_disagreement(fn, args, kwargs, layout: dict, *, timeout: float | None,
                         policy: str = "auto") -> tuple[str, Any]:
    """(line, Explanation or None): `conformance.explain` on the call `check` found disagreeing, under
    check's `policy` where explain has it ("auto", "spec", "heuristic"; else "auto").

    It runs on a helper thread that `check` waits for at most `timeout` seconds (the
    refsim stages run in this process; XLA compiles and runs in explain's worker process, so a
    fatal CHECK ends only the worker). An explain that fails or does not finish is reported in
    the line, never raised: the disagreement is the error."""
    layout = {k: v for k, v in layout.items() if v is not None and not (k == "check_vma" and v is True)}
    target = functools.partial(fn, **kwargs) if kwargs else fn
    box: dict = {}

    def work():
        try:
            with intercept.unchecked():       # in oracle mode, explain's own runs are not checked again
                box["exp"] = core.explain(target, *args, **layout,
                                          policy=policy if policy in ("auto", "spec", "heuristic") else "auto")
        except BaseException as e:  # noqa: BLE001 - reported in the message, the mismatch stays the error
            box["error"] = e

    worker = threading.Thread(target=work, name="conformance-check-explain", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return (f"explain: not finished within {timeout:g} s (explain_timeout); run "
                "conformance.explain(fn, *args, ...) to wait for it"), None
    if "error" in box:
        e = box["error"]
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return f"explain: could not run ({type(e).__name__}: {first})", None
    return explain_line(box["exp"]), box["exp"]
