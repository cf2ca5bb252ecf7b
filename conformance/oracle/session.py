"""Oracle mode's bookkeeping: one `Session` per pytest run or `python -m conformance check`.

Every intercepted top-level call is traced; a call whose program is distributed (a
shard_map, a collective, or sharded inputs/outputs) is checked against refsim and recorded
as "agree", "disagree" or "not_checkable" (with a reason); other calls are counted as
skipped. The caller always gets XLA's result. `summary_lines()` gives the summary line
``conformance oracle: N calls checked, D disagreed, S not checkable`` and the overhead;
`report()` the JSON object (keys: checked, disagreed, not_checkable, skipped, overhead,
calls, ...).
"""
from __future__ import annotations

import collections
import json
import os
import statistics
import tempfile
import time

from conformance.oracle import check as chk
from conformance.oracle import program as prog
from conformance.oracle.policy import DEFAULT_ULPS


class Session:
    """Counts and per-call records of one oracle run; `context` names the running test/script."""

    def __init__(self, *, repro_dir: str | None = None, policy="auto", ulps: int = DEFAULT_ULPS, echo=None):
        self.active = True
        self.repro_dir = repro_dir or tempfile.mkdtemp(prefix="conformance-oracle-")
        self.policy, self.ulps = policy, ulps
        self.context = ""
        self.calls: list[dict] = []
        self.skipped = 0
        self.failures: dict[str, list] = collections.defaultdict(list)
        self.echo = echo                    # called with each disagreement's report (the CLI prints it)

    # -- one call ----------------------------------------------------------------------------------
    def call(self, inner, entry: str, args: tuple, kwargs: dict, static=((), ()), via: str | None = None):
        """Run `inner(*args, **kwargs)` on XLA and return its result; check it on refsim on the side.

        `entry`: the kind of program (jit, shard_map, pmap); `via`: the entry point the user
        called (``jax.experimental.pjit.pjit``; default ``jax.<entry>``), kept in the record.
        `static`: the jit's (static_argnums, static_argnames). The user's call runs exactly once
        and its exceptions reach the user; nothing the oracle itself raises does (a failure of
        the oracle's own machinery is counted as not checkable, reason "oracle error").
        """
        name = chk._name(inner)
        via = via or f"jax.{entry}"
        t0 = time.perf_counter()
        try:
            traced = prog.trace(inner, args, kwargs, static)
            if traced.distributed:
                prog.check_replayable(traced)
                prog.take_host_copies(traced)
        except Exception as e:  # noqa: BLE001 - see the docstring
            out = inner(*args, **kwargs)
            self._not_checkable(name, entry, via, e, time.perf_counter() - t0, None)
            return out
        if not traced.distributed:
            self.skipped += 1
            return inner(*args, **kwargs)
        t1 = time.perf_counter()
        out = inner(*args, **kwargs)          # the user's own call
        t2 = time.perf_counter()
        try:
            res, ref, pols = chk.finish(traced, out, name=name, entry=entry, policy=self.policy, ulps=self.ulps,
                                        seconds={"trace": t1 - t0, "xla": t2 - t1})
            overhead = (t1 - t0) + (time.perf_counter() - t2)
            rec = self._record(name, entry, via, "agree" if res.ok else "disagree", policy=res.policies,
                               overhead=overhead, xla=t2 - t1)
            if not res.ok:
                try:
                    path, note = chk.write_reproducer(inner, name, args, kwargs, ref, pols, None, self.repro_dir)
                except Exception as e:  # noqa: BLE001 - the disagreement is recorded either way
                    path, note = None, f"no reproducer: {type(e).__name__}: {e}"
                res.repro_path = path
                rec["repro"] = path
                err = chk.ConformanceError(res, note)
                self.failures[self.context].append(err)
                if self.echo is not None:
                    self.echo(str(err))
        except Exception as e:  # noqa: BLE001 - see the docstring
            self._not_checkable(name, entry, via, e, (t1 - t0) + (time.perf_counter() - t2), t2 - t1)
        return out

    def _not_checkable(self, name, entry, via, e, overhead, xla):
        if isinstance(e, prog.NotCheckable):
            reason, detail = e.reason, e.detail
        else:
            reason, detail = "oracle error", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        self._record(name, entry, via, "not_checkable", reason=reason, detail=detail, overhead=overhead, xla=xla)

    def _record(self, name, entry, via, outcome, *, overhead, xla, policy=None, reason=None, detail=None) -> dict:
        rec = {"test": self.context, "entry": entry, "via": via,
               "name": name, "outcome": outcome,
               "policy": policy or [], "seconds": round(overhead, 6),
               "xla_seconds": None if xla is None else round(xla, 6)}
        if reason is not None:
            rec["reason"] = reason
            rec["detail"] = detail or ""
        self.calls.append(rec)
        return rec

    # -- totals ------------------------------------------------------------------------------------
    def pop_failures(self, context: str) -> list:
        return self.failures.pop(context, [])

    def counts(self) -> dict:
        checked = [c for c in self.calls if c["outcome"] in ("agree", "disagree")]
        reasons = collections.Counter(c["reason"] for c in self.calls if c["outcome"] == "not_checkable")
        over = [c["seconds"] for c in checked]
        return {
            "checked": len(checked),
            "disagreed": sum(c["outcome"] == "disagree" for c in checked),
            "not_checkable": dict(sorted(reasons.items())),
            "skipped": self.skipped,
            "overhead": {"mean_seconds": statistics.fmean(over) if over else 0.0,
                         "median_seconds": statistics.median(over) if over else 0.0,
                         "total_seconds": sum(over)},
        }

    def summary_lines(self) -> list[str]:
        return summary_lines(self.counts())

    def report(self) -> dict:
        import jax

        devs = jax.devices()
        return {**self.counts(), "platform": devs[0].platform, "devices": len(devs),
                "jax_version": jax.__version__, "calls": self.calls}

    def write_report(self, path: str) -> None:
        write_json(path, self.report())


def write_json(path: str, report: dict) -> None:
    """Write the JSON report whole (through a temporary file, so no partial file is left)."""
    tmp = f"{path}.tmp"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(tmp, "w") as fh:
        json.dump(report, fh, indent=1)
    os.replace(tmp, path)


def merge(reports: list[dict]) -> dict:
    """One report from several (pytest-xdist workers): counts added, calls concatenated."""
    out = {"checked": 0, "disagreed": 0, "not_checkable": collections.Counter(), "skipped": 0, "calls": []}
    for r in reports:
        for k in ("checked", "disagreed", "skipped"):
            out[k] += r[k]
        out["not_checkable"].update(r["not_checkable"])
        out["calls"] += r["calls"]
    over = [c["seconds"] for c in out["calls"] if c["outcome"] in ("agree", "disagree")]
    out["not_checkable"] = dict(sorted(out["not_checkable"].items()))
    out["overhead"] = {"mean_seconds": statistics.fmean(over) if over else 0.0,
                       "median_seconds": statistics.median(over) if over else 0.0, "total_seconds": sum(over)}
    for k in ("platform", "devices", "jax_version"):
        if reports and k in reports[0]:
            out[k] = reports[0][k]
    return out


def summary_lines(c: dict) -> list[str]:
    """The summary line ``conformance oracle: N calls checked, D disagreed, S not checkable``,
    then the overhead per checked call, the skipped calls and the not-checkable reasons; with
    no call checked, a warning line saying why (a zero count is no verdict)."""
    lines = [f"conformance oracle: {c['checked']} calls checked, {c['disagreed']} disagreed, "
             f"{sum(c['not_checkable'].values())} not checkable"]
    o = c["overhead"]
    detail = [f"overhead per checked call: mean {o['mean_seconds'] * 1e3:.1f} ms, "
              f"median {o['median_seconds'] * 1e3:.1f} ms",
              f"{c['skipped']} single-device calls skipped"]
    if c["not_checkable"]:
        detail.append("not checkable: " + ", ".join(f"{k} x{v}" for k, v in c["not_checkable"].items()))
    lines.append("  " + "; ".join(detail))
    if not c["checked"]:
        lines.append(_nothing_checked_warning(c))
    return lines


def _nothing_checked_warning(c: dict) -> str:
    from conformance.oracle.intercept import WRAPPED

    seen = c["skipped"] + sum(c["not_checkable"].values())
    if not seen:
        return (f"WARNING: conformance oracle checked nothing: none of the calls went through the entry points "
                f"it wraps ({', '.join(WRAPPED)}), as top-level calls of callables built after the oracle "
                f"started; see docs/oracle.md")
    return (f"WARNING: conformance oracle checked nothing: the {seen} calls it saw were single-device or "
            f"not checkable")
