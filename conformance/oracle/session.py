"""Oracle mode's bookkeeping: one `Session` per pytest run or `python -m conformance check`.

`conformance.oracle.intercept` hands the session every jit execution JAX runs through Python
(`before`, then `after` with XLA's outputs). An execution whose program is distributed (a
shard_map, a collective, or inputs, outputs or stated layouts over several devices) is seen,
counted by the path it ran through (`PATHS`), and checked against refsim: recorded as "agree",
"disagree" or "not_checkable" (with a reason); single-device executions are counted as skipped.
Distributed executions that ran past the hooks are counted as "not intercepted" by reason. The
caller always gets XLA's result. `summary_lines()` gives the summary line
``conformance oracle: N calls checked, D disagreed, S not checkable; E distributed executions
seen, M not intercepted`` and the census by path and reason; `report()` the JSON object (keys:
checked, disagreed, not_checkable, skipped, census, overhead, calls, ...).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import statistics
import tempfile
import time
from typing import Any

from conformance.oracle import check as chk
from conformance.oracle import intercept
from conformance.oracle import program as prog
from conformance.oracle.policy import DEFAULT_ULPS
from refsim import compat

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.

#: How a distributed execution reached XLA (`intercept`): a jit object called by the program or a
#: library (`jax.jit`, `pjit`, JAX's private names, test utilities), `jax.pmap`, one operation of
#: an eager `shard_map` body, an eager operation on sharded arrays, `jax.device_put` onto or off
#: several devices (a reshard), or a jit equation run by a transformation applied outside jit
#: (grad / vjp / jvp / vmap / linearize of a jit).
PATHS = ("jit call", "pmap", "eager shard_map", "eager op", "device_put", *chk.PLACEMENTS,
         "transformation outside jit", "jit equation")

#: Why a value is passed through unchecked and left out of the census: not the user's data.
RUNTIME_TOKEN = "runtime token"


@dataclasses.dataclass
class _Pending:
    """One execution between `before` and `after`."""

    traced: Any
    name: str
    entry: str
    via: str
    ctx: dict
    t0: float
    t1: float
    record: dict | None = None      # set when the execution was recorded as not checkable already
    host_inputs: float = 0.0        # seconds of t1 - t0 spent reading the inputs off their devices


@dataclasses.dataclass
class _PendingPut:
    """One `jax.device_put` or placement between `before_*` and `after_*`: the host copies of its
    inputs, or the error reading them raised (recorded only if the put itself succeeds: a put of
    a deleted array raises the program's own error, which is not the oracle's)."""

    path: str
    keep: list            # positions of the put's values that are checked (runtime tokens are not)
    hosts: Any
    targets: Any
    t0: float
    t1: float
    error: Exception | None = None


def _label(fun, via: str, params: dict) -> str:
    """The name a record gives an execution: the user's function, or the operation run eagerly."""
    if via == "eager op":
        return str(params.get("name", "op"))
    if via == "eager shard_map":
        first = next(iter(getattr(fun, "args", ()) or ()), None)
        what = first.name if hasattr(first, "bind") else getattr(getattr(fun, "f", None), "__name__", "?")
        return f"shard_map body: {what}"
    return chk._name(fun) if fun is not None else str(params.get("name", "jit"))


class Session:
    """Counts and per-call records of one oracle run; `context` names the running test/script."""

    RUNTIME_TOKEN = RUNTIME_TOKEN

    def __init__(self, *, repro_dir: str | None = None, policy="auto", ulps: int = DEFAULT_ULPS, echo=None):
        self.active = True
        self._repro_dir = repro_dir
        self.policy, self.ulps = policy, ulps
        self.context = ""
        self.calls: list[dict] = []
        self.skipped = 0
        self.seen: collections.Counter = collections.Counter()          # path -> distributed executions
        self.missed: collections.Counter = collections.Counter()        # reason -> not intercepted
        self.passed: collections.Counter = collections.Counter()        # reason -> passed through unchecked
        self.failures: dict[str, list] = collections.defaultdict(list)
        self.echo = echo                    # called with each disagreement's report (the CLI prints it)

    @property
    def repro_dir(self) -> str:
        """Where reproducers go: the folder given, else a temporary folder made at the first one."""
        if self._repro_dir is None:
            self._repro_dir = tempfile.mkdtemp(prefix="conformance-oracle-")
        return self._repro_dir

    # -- one execution ----------------------------------------------------------------------------
    def before(self, args: tuple, params: dict, ctx: dict):
        """Before XLA runs a jit execution (`params`: the jit equation's; `ctx`: how it was
        called, `intercept`): decide whether it is distributed and take host copies of its
        inputs. Returns what `after` needs, or None (single-device, or not checkable: recorded).
        Nothing the oracle raises reaches the user (a failure of its own machinery is counted
        as not checkable, reason "oracle error")."""
        t0 = time.perf_counter()
        fun, via = ctx.get("fun"), ctx.get("via", "jit equation")
        name = _label(fun, via, params)
        entry = "pmap" if via == "pmap" else "jit"
        try:
            traced = prog.from_execution(params, args, fun)
        except Exception as e:  # noqa: BLE001 - see the docstring
            self.seen[via] += 1
            rec = self._not_checkable(name, entry, via, e, time.perf_counter() - t0, None)
            return _Pending(None, name, entry, via, ctx, t0, time.perf_counter(), rec)
        if not traced.distributed:
            self.skipped += 1
            return None
        self.seen[via] += 1
        try:
            prog.check_replayable(traced)
            t_host = time.perf_counter()
            prog.take_host_copies(traced)
        except Exception as e:  # noqa: BLE001 - see the docstring
            rec = self._not_checkable(name, entry, via, e, time.perf_counter() - t0, None)
            return _Pending(None, name, entry, via, ctx, t0, time.perf_counter(), rec)
        t1 = time.perf_counter()
        return _Pending(traced, name, entry, via, ctx, t0, t1, host_inputs=t1 - t_host)

    def after(self, pending: _Pending, out_flat) -> None:
        """After XLA ran it: evaluate the same jaxpr on refsim and compare; record the outcome."""
        t2 = time.perf_counter()
        p = pending
        if p.record is not None:                 # not checkable, recorded by `before`
            return
        out = list(out_flat)
        tree = p.ctx.get("out_tree")
        if tree is not None and getattr(tree, "num_leaves", -1) == len(out):
            import jax

            out = jax.tree_util.tree_unflatten(tree, out)
        try:
            res, ref, pols = chk.finish(p.traced, out, name=p.name, entry=p.entry, policy=self.policy,
                                        ulps=self.ulps, seconds={"trace": p.t1 - p.t0 - p.host_inputs,
                                                                 "host_inputs": p.host_inputs, "xla": t2 - p.t1})
            # the wait for XLA's asynchronously dispatched results is XLA's time, not the oracle's
            wait = res.seconds.get("xla_wait", 0.0)
            overhead = (p.t1 - p.t0) + (time.perf_counter() - t2) - wait
            rec = self._record(p.name, res.entry, p.via, "agree" if res.ok else "disagree", policy=res.policies,
                               overhead=overhead, xla=t2 - p.t1 + wait)
            rec["phases"] = {k: round(v, 6) for k, v in res.seconds.items()
                             if k not in ("xla", "xla_wait", "refsim_and_compare")}
            if not res.ok:
                self._disagreement(p, res, ref, pols, rec, [getattr(x, "sharding", None) for x in out_flat])
        except Exception as e:  # noqa: BLE001 - see `before`
            self._not_checkable(p.name, p.entry, p.via, e, (p.t1 - p.t0) + (time.perf_counter() - t2), t2 - p.t1)

    def _disagreement(self, p: _Pending, res, ref, pols, rec, out_shardings) -> None:
        """Record a disagreement with its reproducer: one that imports the module-level jit object
        that ran, else the executed program as jax.export serialized it (`check.write_reproducer`)."""
        fn = intercept.module_level_jit(p.ctx["fun"]) if p.ctx.get("fun") is not None else None
        try:
            path, note = chk.write_reproducer(fn, p.name, p.ctx.get("args", ()), p.ctx.get("kwargs", {}), ref, pols,
                                              None, lambda: self.repro_dir, traced=p.traced,
                                              out_shardings=out_shardings)
        except Exception as e:  # noqa: BLE001 - the disagreement is recorded either way
            path, note = None, f"no reproducer: {type(e).__name__}: {e}"
        res.repro_path = path
        rec["repro"] = path
        self._fail(chk.ConformanceError(res, note))

    def before_device_put(self, xs, targets):
        """Before `jax.device_put(xs, targets)`: None unless some input or target spans several
        devices (a single-device put is not counted); else the inputs' host copies. A runtime
        token (an ordered effect's, which JAX's dispatch moves onto the next execution's devices)
        carries no data: it is passed through, counted under `passed` and not in the census."""
        t0 = time.perf_counter()
        token = compat.runtime_token_type()
        keep = [k for k, x in enumerate(xs) if not isinstance(x, token)]
        if len(keep) < len(xs):
            self.passed[RUNTIME_TOKEN] += len(xs) - len(keep)
        xs, targets = [xs[k] for k in keep], [targets[k] for k in keep]
        if not (any(prog._multi_device(x) for x in xs)
                or any(prog._multi_device_sharding(getattr(t, "sharding", t)) for t in targets)):
            return None
        self.seen["device_put"] += 1
        try:
            hosts = chk.device_put_hosts(xs)
        except Exception as e:  # noqa: BLE001 - see `before`; recorded once the put has run
            return _PendingPut("device_put", keep, None, targets, t0, time.perf_counter(), e)
        return _PendingPut("device_put", keep, hosts, targets, t0, time.perf_counter())

    def after_device_put(self, pending: _PendingPut, ys) -> None:
        p = pending
        t0, t1 = p.t0, p.t1
        t2 = time.perf_counter()
        if p.error is not None:
            self._not_checkable("device_put", "device_put", "device_put", p.error, t1 - t0, t2 - t1)
            return
        hosts, targets, ys = p.hosts, p.targets, [ys[k] for k in p.keep]
        try:
            res, ref = chk.finish_device_put(hosts, targets, ys)
            wait = res.seconds.get("xla_wait", 0.0)         # XLA's transfer, dispatched asynchronously
            rec = self._record("device_put", "device_put", "device_put", "agree" if res.ok else "disagree",
                               policy=res.policies, overhead=(t1 - t0) + (time.perf_counter() - t2) - wait,
                               xla=t2 - t1 + wait)
            rec["phases"] = {"host_inputs": round(t1 - t0, 6),
                             **{k: round(v, 6) for k, v in res.seconds.items() if k != "xla_wait"}}
            if not res.ok:
                path, note = chk.write_device_put_reproducer(hosts, targets, ref, lambda: self.repro_dir)
                res.repro_path = rec["repro"] = path
                self._fail(chk.ConformanceError(res, note))
        except Exception as e:  # noqa: BLE001 - see `before`
            self._not_checkable("device_put", "device_put", "device_put", e, (t1 - t0) + (time.perf_counter() - t2), t2 - t1)

    def abandon_put(self, pending: _PendingPut) -> None:
        """The put raised (the program's own error, e.g. a put of a deleted or donated array, which
        reaches the user as itself): not counted, nor recorded."""
        self.seen[pending.path] -= 1

    def before_placement(self, api: str, sharding, values, devices):
        """Before JAX assembles one jax.Array from values given per device (`api`, one of
        `check.PLACEMENTS`): None unless `sharding` spans several devices; else their host copies."""
        if not prog._multi_device_sharding(sharding):
            return None
        t0 = time.perf_counter()
        self.seen[api] += 1
        try:
            hosts = chk.placement_hosts(values, devices)
        except Exception as e:  # noqa: BLE001 - see `before_device_put`
            return _PendingPut(api, [], None, sharding, t0, time.perf_counter(), e)
        return _PendingPut(api, [], hosts, sharding, t0, time.perf_counter())

    def after_placement(self, pending: _PendingPut, shape, dtype, result) -> None:
        """After it: each device must hold its block (`check.finish_placement`); `result` is the
        jax.Array made, or the [(device id, block)] its device assignment holds."""
        p = pending
        t2 = time.perf_counter()
        if p.error is not None:
            self._not_checkable(p.path, "placement", p.path, p.error, p.t1 - p.t0, t2 - p.t1)
            return
        try:
            res, _ = chk.finish_placement(p.path, p.targets, shape, dtype, p.hosts, result)
            rec = self._record(p.path, "placement", p.path, "agree" if res.ok else "disagree", policy=res.policies,
                               overhead=(p.t1 - p.t0) + (time.perf_counter() - t2), xla=t2 - p.t1)
            rec["phases"] = {"host_inputs": round(p.t1 - p.t0, 6), **{k: round(v, 6) for k, v in res.seconds.items()}}
            if not res.ok:
                self._fail(chk.ConformanceError(res, "no reproducer: a placement's values are the program's own "
                                                     "(rerun the test to see it again)"))
        except Exception as e:  # noqa: BLE001 - see `before`
            self._not_checkable(p.path, "placement", p.path, e, (p.t1 - p.t0) + (time.perf_counter() - t2), t2 - p.t1)

    def _fail(self, err) -> None:
        self.failures[self.context].append(err)
        if self.echo is not None:
            self.echo(str(err))

    def abandon(self, pending: _Pending) -> None:
        """XLA raised on the execution (the user's error, which reaches the user): not counted,
        nor recorded (e.g. a call on a deleted array)."""
        self.seen[pending.via] -= 1
        if pending.record is not None and pending.record in self.calls:
            self.calls.remove(pending.record)

    def not_intercepted(self, reason: str) -> None:
        """Count a distributed execution that ran past the hooks (e.g. an ahead-of-time compiled call)."""
        self.missed[reason] += 1

    def _not_checkable(self, name, entry, via, e, overhead, xla):
        if isinstance(e, prog.NotCheckable):
            reason, detail = e.reason, e.detail
        else:
            reason, detail = "oracle error", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        return self._record(name, entry, via, "not_checkable", reason=reason, detail=detail, overhead=overhead, xla=xla)

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
        return {
            "checked": len(checked),
            "disagreed": sum(c["outcome"] == "disagree" for c in checked),
            "not_checkable": dict(sorted(reasons.items())),
            "skipped": self.skipped,
            "census": {"seen": sum(self.seen.values()), "by_path": _by_path(self.seen),
                       "not_intercepted": dict(sorted(self.missed.items()))},
            "passed_through": dict(sorted((k, v) for k, v in self.passed.items() if v)),
            "overhead": _overhead(self.calls),
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


def _by_path(counter) -> dict:
    """Counts by path in `PATHS` order (others after), zero counts left out."""
    order = {p: i for i, p in enumerate(PATHS)}
    return {k: counter[k] for k in sorted(counter, key=lambda k: (order.get(k, len(order)), k)) if counter[k]}


def _overhead(calls) -> dict:
    over = [c["seconds"] for c in calls if c["outcome"] in ("agree", "disagree")]
    return {"mean_seconds": statistics.fmean(over) if over else 0.0,
            "median_seconds": statistics.median(over) if over else 0.0, "total_seconds": sum(over)}


def merge(reports: list[dict]) -> dict:
    """One report from several (pytest-xdist workers): counts added, calls concatenated."""
    out = {"checked": 0, "disagreed": 0, "not_checkable": collections.Counter(), "skipped": 0, "calls": []}
    seen, by_path, missed, passed = 0, collections.Counter(), collections.Counter(), collections.Counter()
    for r in reports:
        passed.update(r.get("passed_through", {}))
        for k in ("checked", "disagreed", "skipped"):
            out[k] += r[k]
        out["not_checkable"].update(r["not_checkable"])
        out["calls"] += r["calls"]
        census = r.get("census", {})
        seen += census.get("seen", 0)
        by_path.update(census.get("by_path", {}))
        missed.update(census.get("not_intercepted", {}))
    out["not_checkable"] = dict(sorted(out["not_checkable"].items()))
    out["census"] = {"seen": seen, "by_path": _by_path(by_path), "not_intercepted": dict(sorted(missed.items()))}
    out["passed_through"] = dict(sorted(passed.items()))
    out["overhead"] = _overhead(out["calls"])
    for k in ("platform", "devices", "jax_version"):
        if reports and k in reports[0]:
            out[k] = reports[0][k]
    return out


def summary_lines(c: dict) -> list[str]:
    """The summary line ``conformance oracle: N calls checked, D disagreed, S not checkable; E
    distributed executions seen, M not intercepted``, then the overhead per checked call, the
    skipped calls and the not-checkable reasons, then the census (seen by path, the share
    checked, not intercepted by reason); with no call checked, a warning line saying why (a zero
    count is no verdict)."""
    census = c.get("census", {"seen": 0, "by_path": {}, "not_intercepted": {}})
    nc = sum(c["not_checkable"].values())
    missed = sum(census["not_intercepted"].values())
    lines = [f"conformance oracle: {c['checked']} calls checked, {c['disagreed']} disagreed, "
             f"{nc} not checkable; {census['seen']} distributed executions seen, {missed} not intercepted"]
    o = c["overhead"]
    detail = [f"overhead per checked call: mean {o['mean_seconds'] * 1e3:.1f} ms, "
              f"median {o['median_seconds'] * 1e3:.1f} ms",
              f"{c['skipped']} single-device calls skipped"]
    if c["not_checkable"]:
        detail.append("not checkable: " + ", ".join(f"{k} x{v}" for k, v in c["not_checkable"].items()))
    if c.get("passed_through"):
        detail.append("passed through unchecked: " + ", ".join(f"{k} x{v}" for k, v in c["passed_through"].items()))
    lines.append("  " + "; ".join(detail))
    total = census["seen"] + missed
    share = f"{100.0 * c['checked'] / total:.1f}%" if total else "-"
    paths = ", ".join(f"{k} {v}" for k, v in census["by_path"].items())
    text = (f"  census: {census['seen']} seen" + (f" ({paths})" if paths else "")
            + f", {c['checked']} checked ({share} of distributed executions), {nc} not checkable, {missed} not intercepted")
    if missed:
        text += " (" + ", ".join(f"{k} x{v}" for k, v in census["not_intercepted"].items()) + ")"
    lines.append(text)
    if not c["checked"]:
        lines.append(_nothing_checked_warning(c))
    return lines


def _nothing_checked_warning(c: dict) -> str:
    seen = c["skipped"] + sum(c["not_checkable"].values())
    if not seen:
        return ("WARNING: conformance oracle checked nothing: no jit program, pmap, shard_map or eager operation "
                "on sharded arrays ran through JAX's dispatch while the oracle was on; see docs/oracle.md")
    return (f"WARNING: conformance oracle checked nothing: the {seen} calls it saw were single-device or "
            f"not checkable")
