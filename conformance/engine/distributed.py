"""`python -m conformance run --distributed`: one conformance run over every process of a
`jax.distributed` job (`python -m xla_backend launch`, or one process per host under Slurm,
Open MPI or a TPU VM, which JAX detects itself).

Every process draws the same plan from the same seed (checked: process 0 publishes a digest
of its plan and every other process compares), and runs the XLA side of every case on the
*global* devices: the plan's logical device ids 0..D-1 are the first D devices of
`jax.devices()`, so a mesh may span processes and carries the ids the platform gives its
devices (on CPU 0..3 and 2048..2051 for 2 processes x 4 devices). Each process sends its
shards of every result to process 0 through the distributed runtime's key-value store;
process 0 assembles whole results, compares them with refsim (`conformance.engine.runner.run_task`)
and writes the report. The other processes log what they ran. A process that dies or hangs
ends the run with a message naming it within the case timeout (`DistributedRunError`, and a
watchdog in every process).

Only suites of programs (collectives, programs) run distributed: the layouts, errors and
mpmd suites check single-process behaviour (and so do the corpus checks of the programs suite,
reported "unsupported"). A pmap case runs on the process that owns all
its devices; one whose devices span processes is "unsupported" (not run): multi-process
`jax.pmap` takes each process's own rows, not the case's global arguments. Cross-process
collectives are checked through shard_map, which the collectives suite draws for every one.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import sys
import threading
import time
import traceback

import numpy as np

from conformance.engine import plan as plan_mod
from conformance.engine import preflight, runner
from conformance.report.results import CaseResult
from conformance.suites import base, selected
from conformance.verdict import xfails as xf
from refsim import compat
from refsim.array import Array
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
import xla_backend
from xla_backend import distributed as xdist
from xla_backend import platform as xplat
from xla_backend.distributed import LocalResult

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.

__all__ = ["DEFAULT_CASE_TIMEOUT_S", "DISTRIBUTED_SUITES", "DistributedRunError", "Job", "join", "remap_case"]

DEFAULT_CASE_TIMEOUT_S = 600.0
DISTRIBUTED_SUITES = ("collectives", "programs")
_NS = "conformance"
# Test hook: "hang:P:N" makes process P sleep at its N-th case, "die:P:N" makes it exit 17 there.
FAULT_ENV = "CONFORMANCE_DISTRIBUTED_FAULT"


class DistributedRunError(RuntimeError):
    """A process of the job died, hung, or drew another plan; the message names it."""


@dataclasses.dataclass
class _Leaf:
    """One output of one process: what it holds of a (possibly multi-process) array."""

    shape: tuple
    dtype: str
    sharding: object
    shards: list
    info: dict


# -- device ids -----------------------------------------------------------------------------------
def remap_case(case, ids: list):
    """`case` with logical device id k replaced by ``ids[k]`` in its mesh and shardings.

    The remapped case names the platform's ids (in its description, mismatches and reproducer);
    the task keeps the plan's case id, so reports of every run of the plan line up."""
    if list(ids) == list(range(len(ids))):
        return case

    table = np.asarray(ids, dtype=np.int64)
    memo: dict = {}

    def mesh(m):
        if id(m) not in memo:
            memo[id(m)] = Mesh(m.axis_sizes, m.axis_names, device_ids=table[np.asarray(m.device_ids)],
                               axis_types=m.axis_types)
        return memo[id(m)]

    def sharding(s):
        if isinstance(s, NamedSharding) and isinstance(s.mesh, Mesh):
            return NamedSharding(mesh(s.mesh), s.spec, memory_kind=s.memory_kind)
        if isinstance(s, (tuple, list)):
            return type(s)(sharding(x) for x in s)
        return s

    return dataclasses.replace(case, mesh=mesh(case.mesh), in_shardings=sharding(case.in_shardings),
                               out_shardings=sharding(case.out_shardings))


# -- the job ------------------------------------------------------------------------------------
def join(*, platform: str, init_timeout_s: float = 300.0, case_timeout_s: float = DEFAULT_CASE_TIMEOUT_S,
         log_dir: str | None = None) -> "Job":
    """Join the distributed runtime (`xla_backend.distributed.initialize`) and return this process's Job."""
    xplat.configure(platform, None)  # local devices: XLA_BACKEND_DEVICES (set by the launcher) or 8 on CPU
    try:
        xdist.initialize(timeout_s=int(init_timeout_s))
    except ValueError as e:  # no coordinator: neither the launcher's variables nor a detected cluster
        raise ValueError(
            f"--distributed needs a jax.distributed job, and none was found ({e}): start the processes with "
            "`python -m xla_backend launch --processes N -- python -m conformance run --distributed ...`, or one "
            "per host under Slurm, Open MPI or on a TPU VM, where JAX finds the job itself.") from None
    import jax  # here: the platform is configured above, and the CLI imports this module before that

    return Job(jax.process_index(), jax.process_count(), compat.distributed_client(),
               [int(d.id) for d in jax.devices()], {int(d.id): int(d.process_index) for d in jax.devices()},
               float(case_timeout_s), log_dir)


class Job:
    """This process's part of a distributed conformance run; `execute` is the runner's executor."""

    def __init__(self, process_index, process_count, client, device_ids, owner, case_timeout_s, log_dir=None):
        self.process_index = process_index
        self.process_count = process_count
        self.client = client
        self.device_ids = device_ids          # jax.devices() order: logical id k -> device_ids[k]
        self.owner = owner                    # device id -> process index
        self.case_timeout_s = case_timeout_s
        self.log_path = None
        self._log = None
        if log_dir is not None:
            os.makedirs(os.path.join(log_dir, "logs"), exist_ok=True)
            self.log_path = os.path.join(log_dir, "logs", f"process-{process_index}.log")
        self._watchdog = _Watchdog(self)
        self._fault = _parse_fault(os.environ.get(FAULT_ENV, ""), process_index)
        self.identity: dict = {}  # what decides the plan; compared with process 0's

    @property
    def is_coordinator(self) -> bool:
        return self.process_index == 0

    # -- logging ----------------------------------------------------------------------
    def log(self, text: str) -> None:
        line = f"[conformance process {self.process_index}/{self.process_count}] {text}\n"
        if self.log_path is not None:
            if self._log is None:
                self._log = open(self.log_path, "a", encoding="utf-8")
            self._log.write(line)
            self._log.flush()
        if not self.is_coordinator:  # process 0 shows the progress bar and the table instead
            sys.stderr.write(line)
            sys.stderr.flush()

    # -- key-value store --------------------------------------------------------------------
    def _wait(self, key: str, timeout_s: float, what: str, sender: int) -> bytes:
        try:
            return self.client.blocking_key_value_get_bytes(key, int(timeout_s * 1000))
        except Exception as e:  # noqa: BLE001 - DEADLINE_EXCEEDED, or the service is gone
            raise DistributedRunError(
                f"process {sender} did not send {what} within {timeout_s:g} s: it is hung or has died "
                f"({self.progress_text()}). The runtime said: {type(e).__name__}: {str(e)[:200]}") from None

    def progress_text(self) -> str:
        """Each process's last finished case, as far as the key-value store knows."""
        parts = []
        for p in range(self.process_count):
            try:
                done = self.client.key_value_dir_get(f"{_NS}/progress/{p}/")
                last = max((int(k.rsplit("/", 1)[1]) for k, _ in done), default=None)
            except Exception:  # noqa: BLE001 - the coordination service itself may be gone
                last = "unknown"
            parts.append(f"process {p}: " + ("no case finished" if last is None else f"last finished case #{last}"))
        return "; ".join(parts)

    # -- the runner's executor ---------------------------------------------------------------
    def execute(self, todo: list, opts: dict):
        """Run `todo` [(task, xfails entry)] on every process; yield CaseResults on process 0 only."""
        ids = self._shared_todo([t.case_id for t, _ in todo])
        todo = [(t, e) for t, e in todo if t.case_id in ids]
        n_devices = opts.get("devices", len(self.device_ids))
        table = self.device_ids[:n_devices]
        self._watchdog.start()
        try:
            for n, (task, entry) in enumerate(todo):
                self._watchdog.arm(n, task.case_id)
                self._maybe_fault(n)
                if not isinstance(task, base.ProgramTask):
                    # a check (e.g. a corpus program against its NumPy reference) runs in one process
                    if self.is_coordinator:
                        yield _single_process_check(task)
                    self._finished(n)
                    continue
                if entry is not None and (entry.crash or entry.aborts):  # not run anywhere
                    if self.is_coordinator:
                        yield runner.run_task(task, None, entry, **opts)
                    self._finished(n)
                    continue
                variants = [remap_case(c, table) for c in task.variants]
                if any(c.entry == "pmap" and self._pmap_owner(c) is None for c in variants):
                    # decided from the case alone, so every process skips it alike
                    if self.is_coordinator:
                        yield _spanning_pmap(task, variants)
                    self.log(f"case #{n} {task.case_id}: not run (pmap over devices of several processes)")
                    self._finished(n)
                    continue
                local = [self._run_xla(c) for c in variants]
                if not self.is_coordinator:
                    self.client.key_value_set_bytes(f"{_NS}/case/{n}/{self.process_index}",
                                                    pickle.dumps(local, protocol=pickle.HIGHEST_PROTOCOL))
                    self.log(f"case #{n} {task.case_id}: " + ", ".join(_brief(x) for x in local))
                    self._finished(n)
                    continue
                parts = {0: local}
                for p in range(1, self.process_count):
                    key = f"{_NS}/case/{n}/{p}"
                    parts[p] = pickle.loads(self._wait(key, self.case_timeout_s, f"its results of case #{n} "
                                                       f"{task.case_id}", p))
                    self.client.key_value_delete(key)
                replay = _Replay({id(c): _assemble([parts[p][k] for p in sorted(parts)], self)
                                  for k, c in enumerate(variants)})
                mapped = dataclasses.replace(task, variants=variants)
                # shrinking draws new cases on one process only: the others could not take part
                result = runner.run_task(mapped, replay, entry, **{**opts, "shrink_seconds": 0})
                self.log(f"case #{n} {task.case_id}: {result.status}")
                self._finished(n)
                yield result
        finally:
            self._watchdog.stop()

    def _shared_todo(self, case_ids: list) -> set:
        """Process 0's list of cases to run (it alone reads --resume's finished cases), checked against
        this process's own plan: DistributedRunError when the processes drew different plans."""
        key = f"{_NS}/todo"
        mine = json.loads(json.dumps(self.identity, default=str))
        if self.is_coordinator:
            self.client.key_value_set_bytes(key, json.dumps({"identity": mine, "cases": case_ids}).encode())
            return set(case_ids)
        theirs = json.loads(self._wait(key, self.case_timeout_s, "the list of cases to run", 0))
        diff = plan_mod.differences(theirs["identity"], mine, names=("on process 0", "here"))
        if theirs["identity"].get("shard") != mine.get("shard"):
            diff.append(f"shard: {theirs['identity'].get('shard')} on process 0, {mine.get('shard')} here")
        drawn = set(case_ids)
        missing = [c for c in theirs["cases"] if c not in drawn]
        if diff or missing:
            why = "; ".join(diff) or (f"process 0 runs {missing[0]!r}, which this process did not draw (different "
                                      "hypothesis, NumPy or JAX versions?)")
            raise DistributedRunError(f"process {self.process_index} drew another plan than process 0: {why}. Every "
                                      "process must run the same code, versions and arguments.")
        return set(theirs["cases"])

    def _finished(self, n: int) -> None:
        self.client.key_value_set(f"{_NS}/progress/{self.process_index}/{n}", "1")

    def _run_xla(self, case):
        """This process's part of one case on XLA: ("ok", tree of _Leaf) / ("absent",) / ("raised", ...)."""
        import jax  # not at the top: the CLI imports this module before the platform is configured

        try:
            if case.entry == "pmap":
                if self._pmap_owner(case) != self.process_index:
                    return ("absent",)  # pmap runs on the process that owns its devices only
                # devices always named: pmap's default is every device of every process
                ids = [int(i) for i in np.asarray(case.mesh.device_ids).ravel()]
                out = xla_backend.pmap(case.fn, axis_name=case.mesh.axis_names[0], devices=ids)(*case.args)
            else:
                out = case.run(xla_backend)
        except Exception as e:  # noqa: BLE001 - the case's result, reported by process 0
            # process 0 keeps the exception itself; the others send its class name and text
            return ("raised", type(e).__module__, type(e).__name__, str(e), traceback.format_exc(),
                    e if self.is_coordinator else None)

        def leaf(a):
            return _Leaf(tuple(a.shape), str(np.dtype(a.dtype)), a.sharding, list(a.shards), dict(a.info or {}))

        return ("ok", jax.tree_util.tree_map(leaf, out, is_leaf=lambda x: isinstance(x, (Array, LocalResult))))

    def _pmap_owner(self, case):
        """The one process owning every device of a pmap case; None when they span processes."""
        owners = {self.owner[int(i)] for i in np.asarray(case.mesh.device_ids).ravel()}
        return owners.pop() if len(owners) == 1 else None

    def _maybe_fault(self, n: int) -> None:
        if self._fault is None or self._fault[1] != n:
            return
        if self._fault[0] == "die":
            os._exit(17)
        time.sleep(10 ** 6)

    def finish(self) -> None:
        """Wait for every process (so none exits while another still needs it), then leave the runtime."""
        try:
            self.client.wait_at_barrier(f"{_NS}/finish", int(self.case_timeout_s * 1000))
        finally:
            if self._log is not None:
                self._log.close()
            xdist.shutdown()


def _single_process_check(task):
    return CaseResult(case_id=task.case_id, suite=task.suite, family=task.family, dtype=task.dtype,
                      status="unsupported", examples=0, message=(
                          "not run: a check case (not a program whose shards can be gathered) runs in a single "
                          "process; run it without --distributed"))


def _spanning_pmap(task, variants):
    ids = sorted({int(i) for c in variants for i in np.asarray(c.mesh.device_ids).ravel()})
    return CaseResult(case_id=task.case_id, suite=task.suite, family=task.family, dtype=task.dtype,
                      status="unsupported", examples=0, message=(
                          f"not run: pmap over devices {ids} of several processes. Multi-process jax.pmap takes "
                          "each process's own rows (host-local inputs), another calling convention than the "
                          "global arguments of the case, and JAX refuses device orders that interleave "
                          "processes; the distributed run checks cross-process collectives through shard_map."))


def _parse_fault(text: str, me: int):
    if not text:
        return None
    kind, proc, case = text.split(":")
    return (kind, int(case)) if int(proc) == me else None


def _brief(part) -> str:
    if part[0] == "ok":
        return "ran"
    if part[0] == "absent":
        return "no local devices"
    return f"raised {part[2]}"


# -- assembling process 0's view ---------------------------------------------------------------
class RemoteError(RuntimeError):
    """A case raised on another process (the message names the process, the class and the text)."""


def _assemble(parts: list, job: Job):
    """The whole result of one case from every process's part, or the exception to re-raise."""
    try:
        return _assemble_parts(parts, job)
    except Exception as e:  # noqa: BLE001 - e.g. shards whose indices do not tile the array: the case's error
        return _Raise(0, type(e).__module__, type(e).__name__, str(e), traceback.format_exc(), e)


def _assemble_parts(parts: list, job: Job):
    import jax  # not at the top: the CLI imports this module before the platform is configured

    raised = [(p, part) for p, part in enumerate(parts) if part[0] == "raised"]
    if raised:
        p, (_, module, name, message, tb, exc) = raised[0]
        return _Raise(p, module, name, message, tb, exc)
    present = [part[1] for part in parts if part[0] == "ok"]
    if not present:
        return _Raise(0, "builtins", "RuntimeError", "no process took part in the case", "",
                      RuntimeError("no process owns a device of the case"))
    is_leaf = lambda x: isinstance(x, _Leaf)  # noqa: E731
    first, treedef = jax.tree_util.tree_flatten(present[0], is_leaf=is_leaf)
    others = [jax.tree_util.tree_flatten(t, is_leaf=is_leaf)[0] for t in present[1:]]
    out = []
    for k, leaf in enumerate(first):
        shards = {}
        for lv in [leaf] + [o[k] for o in others]:
            for s in lv.shards:
                shards.setdefault(s.device_id, s)
        order = list(leaf.sharding.devices_indices_map(leaf.shape))
        info = {**leaf.info, "gathered": True, "processes": job.process_count}
        out.append(Array(leaf.shape, np.dtype(leaf.dtype), leaf.sharding,
                         [shards[d] for d in order if d in shards], info=info))
    return jax.tree_util.tree_unflatten(treedef, out)


@dataclasses.dataclass
class _Raise:
    process: int
    module: str
    name: str
    message: str
    traceback: str
    original: BaseException | None = None  # process 0's own exception

    def exception(self) -> BaseException:
        if self.original is not None:
            return self.original
        return RemoteError(f"on process {self.process}: {self.name}: {self.message}")


class _Replay:
    """The XLA-side engine process 0 hands `run_task`: each case's assembled result, or its exception."""

    # stage localisation reruns a failing case on the devices, which span every process here
    can_explain = False

    def __init__(self, results: dict):
        self._results = results

    def run_case(self, case):
        got = self._results[id(case)]
        if isinstance(got, _Raise):
            raise got.exception()
        return got


# -- watchdog ---------------------------------------------------------------------------------
class _Watchdog:
    """Ends this process, naming the case and every process's progress, when one case runs past
    the case timeout plus a margin (a peer that died or hung leaves this one stuck in a collective)."""

    MARGIN_S = 30.0  # at most: process 0's own message about a missing peer comes first

    def __init__(self, job: Job):
        self.job = job
        self._case = None
        self._deadline = None
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self._loop, daemon=True, name="conformance-watchdog")
        self._thread.start()

    def arm(self, n: int, case_id: str):
        self._case = (n, case_id)
        self._deadline = time.monotonic() + self.job.case_timeout_s + self._margin()

    def _margin(self) -> float:
        return min(self.MARGIN_S, self.job.case_timeout_s)

    def stop(self):
        self._stop.set()

    def _loop(self):
        while not self._stop.wait(0.5):
            if self._deadline is not None and time.monotonic() > self._deadline:
                n, cid = self._case
                sys.stderr.write(
                    f"conformance --distributed: process {self.job.process_index} is stuck in case #{n} {cid} "
                    f"after {self.job.case_timeout_s + self._margin():g} s ({self.job.progress_text()}); a process "
                    "that is behind is hung or has died. Ending this process.\n")
                sys.stderr.flush()
                from conformance.report.results import EXIT_INCOMPLETE

                os._exit(EXIT_INCOMPLETE)  # the run did not cover its plan


# -- expected failures -------------------------------------------------------------------------
def multiprocess_xfails(platform: str):
    """The xfails of a multi-process run: ``xfails/<platform>-multiprocess.txt`` (differences that
    show only when collectives cross processes) ahead of ``xfails/<platform>.txt``; the first
    entry whose pattern matches a case applies, so the multi-process entries take precedence."""
    entries, sources = [], []
    for path in (xf.default_path(f"{platform}-multiprocess"), xf.default_path(platform)):
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                entries += xf.parse(fh.read(), source=path)
            sources.append(path)
    return xf.XfailList(entries, source=" + ".join(sources) or xf.default_path(platform))


# -- the command line -------------------------------------------------------------------------
def run_command(args, console, report_result) -> int:
    """`python -m conformance run --distributed ...` on this process; the exit status.

    Process 0 prints the table and writes the report (`report_result`); the others log what
    they ran and exit 0 unless they fail themselves. A DistributedRunError ends this process at
    once with the message (exit status 3, INCOMPLETE, on process 0, whose report the runner marked
INCOMPLETE; 1 on the others): waiting for a dead peer at shutdown would hang.
    """
    suites = DISTRIBUTED_SUITES if args.suite == "all" else selected(args.suite)
    other = [s for s in suites if s not in DISTRIBUTED_SUITES]
    if other:
        raise ValueError(f"--suite {args.suite}: {', '.join(other)} cannot run with --distributed (they check "
                         f"single-process behaviour); choose from {', '.join(DISTRIBUTED_SUITES)}.")
    job = join(platform=args.platform, case_timeout_s=args.case_timeout or DEFAULT_CASE_TIMEOUT_S,
               log_dir=args.report)
    try:
        n = len(job.device_ids)
        if args.devices not in (None, n):
            raise ValueError(f"--devices {args.devices}: a distributed run draws its meshes over every global device "
                             f"({n} here, over {job.process_count} processes); leave --devices out.")
        hardware = preflight.check(args.platform, n, in_process=True)
        # the hardware record (a dict: kept in results.jsonl, not in the HTML table) lists every device
        extra = {**preflight.plan_entries(hardware), "distributed": True, "global_devices": n}
        data_sets = getattr(args, "data_per_program", None) or runner.DEFAULT_DATA_PER_PROGRAM
        job.identity = {"suite": ",".join(suites), "seed": args.seed, "examples": args.examples, "devices": n,
                        "data_per_program": data_sets,
                        "platform": args.platform, "shard": getattr(args, "shard", None), **runner._versions()}
        lead = job.is_coordinator
        job.log(f"joined: {n} devices over {job.process_count} processes ({hardware.get('topology', '')})")
        result = runner.run(suite=",".join(suites), examples=args.examples, seed=args.seed, platform=args.platform,
                            devices=n, report_dir=args.report if lead else None,
                            progress=lead and not args.no_progress, resume=args.resume and lead,
                            xfails=args.xfails or (multiprocess_xfails(args.platform) if job.process_count > 1 else None),
                            processes=None, shrink_seconds=0, console=console, shard=getattr(args, "shard", None),
                            plan_extra=extra, executor=job.execute, data_per_program=data_sets)
        code = report_result(args, result, console) if lead else 0
        if not lead:
            job.log(f"done: took part in every case; process 0 reports the results")
        job.finish()
        return code
    except DistributedRunError as e:
        from conformance.report.results import EXIT_INCOMPLETE

        sys.stdout.flush()
        sys.stderr.write(f"error: {e}\n")
        sys.stderr.flush()
        # process 0's report is INCOMPLETE (the runner marked it so): its exit status says the same
        os._exit(EXIT_INCOMPLETE if job.is_coordinator else 1)
