"""`python -m conformance hunt`: draw random programs and keep every distinct failure, ready to file.

    python -m conformance hunt (--minutes N | --programs M) [--seed S] [--ops OP,...] [--classes C,...]
        [--report DIR]
        [--processes K] [--xfails FILE] [--devices N] [--database DIR] [--shrink-seconds T]
        [--case-timeout T] [--no-upstream] [--progress-every T]

Unlike `run` (a fixed plan), a hunt draws batches of programs from the suite's strategy (or from
the ops ``--ops`` names, called as the program classes ``--classes`` names:
`conformance.strategies.sharded.CLASSES`) until the time or the program budget is spent, runs them in worker
processes that survive XLA's fatal CHECKs, and writes every program's result to
``DIR/results.jsonl`` (with its ops, sharding patterns, transform, axis types and partitioner, for
`conformance.coverage`). Its seed (``--seed``, else a random one) is recorded in the plan and in
``DIR/hunt.json``: the same seed and ``--programs`` draw the same programs. Every
``--progress-every`` seconds a line on stderr gives the programs done, their rate, the findings
(new and known) and the other outcomes. Each failure is classified by a signature
(stage, op, error class):

* stage: ``trace`` (JAX raised while tracing a well-typed program), ``refsim`` (a refsim rule
  raised), ``lowering`` / ``compile`` / ``runtime`` (XLA's side raised there), ``crash`` (the
  worker died: a fatal CHECK), ``hang`` (killed after ``--case-timeout``), or ``mismatch:STAGE``
  (values differ; STAGE is `conformance.explain`'s verdict: lowering, compiler, backend);
* op: the op `explain` names, XLA's source file of a CHECK or RET_CHECK, the primitive a JAX
  lowering error names (jax 0.12: "... for primitive reduce_sum"), or else the ops of the program;
* error class: the exception class and its message's first line (digits dropped), the CHECK
  that failed, or the element classes of a mismatch.

The first failure of each signature is cut to the fewest ops and devices that still fail the
same way (wrong values in one fresh process running refsim and XLA side by side, an exception or
a crash one variant per fresh process; `conformance.suites.sharded.candidates`, then
`conformance.upstream.shrink`'s earlier values and fewer devices) and written at once to one
folder, ``DIR/findings/NNN-stage-op/`` (`conformance.findings`): ``finding.json``, ``repro.py``
(the project's reproducer), ``case.json`` (the case as data, `case_to_data`, which
``python -m conformance hunt --check FILE`` runs), and ``upstream.py`` / ``UPSTREAM.md``, a plain-JAX
script and an issue body run under Shardy and GSPMD (`conformance.upstream.report`). Each
finding is matched against docs/found-bugs.md (`conformance.upstream.known`) and the findings
are grouped by root cause in ``DIR/findings/CAUSES.md`` (`conformance.upstream.causes`). A
signature that a finding of an earlier hunt on the same ``DIR`` already has (a hunt rerun after a
kill replays its failing programs first) keeps that finding's number and folder: it is counted,
not written again. SIGINT / SIGTERM end the hunt cleanly: cases in flight finish, the reports are
written and ``DIR/hunt.json`` says ``"partial": true``.

Failing programs are kept in a hypothesis example database (``--database``, default
``DIR/examples``), whose programs the next hunt with that database runs first. Nothing read back
is executed or unpickled. A database may be shared between machines and jobs, so an entry holds
no program: it is JSON naming how the strategy draws it (`DB_FORMAT`: the batch seed, batch size
and position, the device count, the ops of an ``--ops`` hunt, and the path through `candidates`
that shrank it) and the sha256
of the case the strategy derived (`program_digest`). A replay draws the program again with this
version's strategy, follows the path, and runs it only if its digest is the stored one; so the
programs a database can make a hunt run are programs the strategy itself would draw. An entry
that is not such JSON (garbage, an older pickle, another format), asks for more devices than the
hunt has, or derives another program (the strategy or a version changed) is skipped and counted
(``hunt.json``'s ``database``), never an error, and left in place for the version that wrote it.
A finding's ``case.json`` (and the file the hunt hands to ``--check`` while shrinking) does hold the
program's source, which ``--check`` compiles: it runs what a user chose to run, like a reproducer;
its arrays are ``.npy`` bytes, loaded without pickle.
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from hypothesis.database import DirectoryBasedExampleDatabase

import numpy as np

import refsim
from conformance.cli import _cores, _Parser, _positive, _seconds, _seed, _timeout
from conformance.engine import runner, workers
from conformance.findings import Finding, earlier_findings, print_findings, write_causes, write_record
from conformance.report import open_report_dir, prepare_report_dir, timing
from conformance.report.results import CaseResult, Failure, summarize
from conformance.suites import base
from conformance.suites import sharded as suite_mod
from conformance.suites.base import ProgramTask
from conformance.strategies import _program_classes
from conformance.strategies.sharded import CLASSES, OPS, Graph, make_case, sharded_programs
from conformance.suites.sharded import candidates
from conformance.upstream import report as upstream_report
from conformance.upstream.causes import cause_key
from conformance.upstream.shrink import greedy
from conformance.verdict import xfails as xfails_mod
from xla_backend import platform as xplat

# None of these loads JAX (the worker processes and `--check` configure the platform first).

__all__ = ["DB_FORMAT", "Finding", "HuntResult", "case_from_data", "case_to_data", "check_in_subprocess", "hunt",
           "main", "program_digest", "signature"]

DB_KEY = b"conformance-hunt-failing-programs"
#: The ``format`` of an example-database entry (how the strategy draws a program, never the program).
DB_FORMAT = "conformance-hunt-entry-1"
#: The ``format`` of a case file (a finding's ``case.json``, the file ``--check`` runs).
CASE_FORMAT = "conformance-hunt-case-1"
BATCH = 8
SHARDING_OPS = ("with_sharding_constraint", "reshard")


@dataclasses.dataclass
class HuntResult:
    """What a hunt did: programs run, minutes, whether it was cut short, and the distinct failures."""

    programs: int
    minutes: float
    partial: bool
    findings: list
    report_dir: str | None
    generator_errors: list = dataclasses.field(default_factory=list)
    database: dict = dataclasses.field(default_factory=dict)
    seed: int | None = None
    causes: list = dataclasses.field(default_factory=list)


# -- classifying a result -------------------------------------------------------------------------
def _key(text: str) -> str:
    """A message's first line without numbers and addresses, for grouping failures."""
    line = next((ln for ln in str(text).splitlines() if ln.strip()), "")
    line = re.sub(r"0x[0-9a-f]+", "", line)
    line = re.sub(r"\d+", "N", line)
    return line.strip()[:100]


def _program_ops(case) -> str:
    ops = [op for op, _ in getattr(case, "op_patterns", ()) if op not in SHARDING_OPS]
    return "+".join(dict.fromkeys(ops)) or "-"


def signature(result, case=None) -> tuple | None:
    """(stage, op, error class) of a failing `CaseResult` (None for a pass / xfail / unsupported)."""
    d = result.details
    ops = _program_ops(case) if case is not None else "-"
    failure = d.signature or {}
    if result.status == "fail" or result.status == "error" and failure.get("kind") == "mismatch":
        # (an "error" mismatch: a listed case that differs otherwise than its xfails entry says)
        st = d.stage or {}
        classes = ",".join(failure.get("classes") or failure.get("layout") or ["value"])
        return (f"mismatch:{st.get('diverged_in') or 'unlocalised'}", st.get("op") or ops, classes)
    if result.status == "timeout":
        return ("hang", ops, "timeout")
    if result.status != "error":
        return None
    if d.worker_exit is not None:
        tail = (d.fatal_line or "") + "\n" + (d.stderr_tail or "")
        check = (re.search(r"(Check failed:[^\n]*|RET_CHECK failure[^\n]*)", tail)
                 or re.search(r"([A-Za-z_]+\.(?:cc|h):\d+\][^\n]*)", tail))
        where = re.search(r"([a-z_]+\.(?:cc|h)):\d+", tail)
        return ("crash", where.group(1) if where else ops, _key(check.group(1) if check else d.worker_exit))
    side = failure.get("side", "unknown")
    exc = failure.get("exception") or d.exception_type or "Exception"
    tb = d.traceback or ""
    if side == "refsim":
        stage = "refsim" if re.search(r"refsim/interpreter/(rules|core\.py)", tb) else "trace"
    elif side == "xla" and "Cannot lower jaxpr" in (failure.get("message") or ""):
        stage = "lowering"
    elif side == "xla":
        # the innermost frame JAX shows says where it raised: its own frames are filtered out, so a
        # lowering error surfaces at the project's `.lower(` call even though a compile call is outside it
        frames = re.findall(r'File "[^"]*", line \d+, in \w+\n\s*(.*)', tb)
        innermost = frames[-1] if frames else ""
        stage = ("runtime" if "timed_run" in tb else "lowering" if ".lower(" in innermost
                 else "compile" if ".compile()" in tb or "compiled(" in tb else "lowering" if "lower" in tb else "xla")
    else:
        stage = side
    msg = failure.get("message") or result.message
    # where: XLA's source file, else the primitive JAX names (0.12's lowering errors do), else the program's ops
    where = re.search(r"([a-z_]+\.cc):\d+", msg) or re.search(r"for primitive (\w+)", msg)
    return (stage, where.group(1) if where else ops, f"{exc}: {_key(msg)}")


# -- a case as data (JSON; arrays as .npy bytes, read without pickle) -----------------------------
def _array_data(a) -> str:
    buf = io.BytesIO()
    np.save(buf, np.asarray(a), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _array(text) -> np.ndarray:
    if not isinstance(text, str):
        raise ValueError(f"an array is base64 text of .npy bytes, got {type(text).__name__}")
    return np.load(io.BytesIO(base64.b64decode(text, validate=True)), allow_pickle=False)


def _spec_data(sharding) -> list:
    spec = sharding.spec
    if getattr(spec, "unreduced", None) or getattr(spec, "reduced", None):
        raise ValueError(f"{spec!r} has unreduced or reduced axes, which a hunt case does not draw")
    from conformance.export.bundle import spec_to_data

    return spec_to_data(spec)


def _sharding(mesh, entries) -> NamedSharding:
    if not isinstance(entries, list) or not all(e is None or isinstance(e, str) or (
            isinstance(e, list) and all(isinstance(a, str) for a in e)) for e in entries):
        raise ValueError(f"a spec is a list of null, axis names or lists of them, got {entries!r}")
    return refsim.NamedSharding(mesh, refsim.PartitionSpec(*[tuple(e) if isinstance(e, list) else e
                                                             for e in entries]))


def _tuples(x):
    return tuple(_tuples(e) for e in x) if isinstance(x, list) else x


def case_to_data(case) -> dict:
    """A `ShardedProgram` as JSON-able data: its op graph (`conformance.strategies.sharded.Graph`),
    mesh, argument arrays (base64 of `np.save` bytes), in/out specs, partitioner and axis types,
    from which `case_from_data` rebuilds it with `make_case`."""
    g, m = case.graph, case.mesh
    if g is None:
        raise ValueError(f"{case.case_id} has no op graph: only drawn sharded programs are stored")
    return {
        "graph": {"helpers": [list(h) for h in g.helpers], "lines": list(g.lines),
                  "line_ops": [list(o) for o in g.line_ops],
                  "outs": [[n, list(shape), dt, float(err)] for n, shape, dt, err in g.outs],
                  "args": [[dt, list(shape), ax] for dt, shape, ax in g.args], "batch": g.batch,
                  "transform": g.transform, "program_class": _program_classes.class_to_data(g.program_class)},
        "mesh": {"shape": [int(n) for n in m.axis_sizes], "names": list(m.axis_names),
                 "device_ids": np.asarray(m.device_ids).tolist(), "axis_types": [t.value for t in m.axis_types]},
        "args": [_array_data(a) for a in case.args],
        "in_specs": [_spec_data(x) for x in case.in_shardings],
        "out_specs": [_spec_data(x) for x in case.out_shardings],
        "partitioner": case.partitioner, "axis_types": case.axis_types,
    }


def case_from_data(data) -> "suite_mod.ShardedProgram":
    """The `ShardedProgram` of `case_to_data`'s data; ValueError naming what is wrong otherwise.
    Its op graph is source text that running the case compiles: load only a case you mean to run."""
    try:
        g, m = data["graph"], data["mesh"]
        graph = Graph(helpers=tuple((str(n), str(t)) for n, t in g["helpers"]), lines=tuple(map(str, g["lines"])),
                      line_ops=tuple((str(o), str(p)) for o, p in g["line_ops"]),
                      outs=tuple((str(n), tuple(int(d) for d in shape), str(dt), float(err))
                                 for n, shape, dt, err in g["outs"]),
                      args=tuple((str(dt), tuple(int(d) for d in shape), None if ax is None else int(ax))
                                 for dt, shape, ax in g["args"]),
                      batch=None if g["batch"] is None else int(g["batch"]), transform=str(g["transform"]),
                      program_class=_program_classes.class_from_data(g.get("program_class", ["plain", []])))
        mesh = refsim.Mesh(tuple(int(n) for n in m["shape"]), tuple(m["names"]),
                           device_ids=np.asarray(m["device_ids"], dtype=np.int64),
                           axis_types=tuple(refsim.AxisType(t) for t in m["axis_types"]))
        return make_case(graph, mesh=mesh, args=tuple(_array(a) for a in data["args"]),
                         in_shardings=tuple(_sharding(mesh, e) for e in data["in_specs"]),
                         out_shardings=tuple(_sharding(mesh, e) for e in data["out_specs"]),
                         partitioner=str(data["partitioner"]), axis_types=str(data["axis_types"]))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"not a hunt case ({type(e).__name__}: {e})") from None


def program_digest(case) -> str:
    """``sha256:<hex>`` of `case_to_data(case)`: equal for the same program, layouts and data."""
    text = json.dumps(case_to_data(case), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_case(path: str):
    """The case in a case file (a finding's ``case.json``); ValueError naming the file otherwise."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        if not isinstance(doc, dict) or doc.get("format") != CASE_FORMAT:
            raise ValueError(f"its format is not {CASE_FORMAT!r}")
        return case_from_data(doc.get("case"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not a hunt case file ({e}); pass a findings/NNN-*/case.json file a hunt wrote.") \
            from None


def write_case(case, path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"format": CASE_FORMAT, "case_id": case.case_id, "case": case_to_data(case)}, fh)


# -- the example database: how the strategy draws each failing program -----------------------------
_MAX_SEED = 2 ** 32   # the hunt's batch seeds: master.randrange(2 ** 32)


def _entry(origin: dict, case) -> bytes:
    """The database entry of `case`, drawn as `origin` says (seed, count, index, devices, shrink)."""
    return json.dumps({"format": DB_FORMAT, "suite": "sharded", **origin, "program": program_digest(case)},
                      sort_keys=True).encode("utf-8")


def _origin_of(blob: bytes, devices: int) -> dict:
    """The drawing recipe of a database entry; ValueError ("unreadable" / "foreign: ...") otherwise."""
    try:
        doc = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("unreadable") from None
    keys = {"format", "suite", "seed", "count", "index", "devices", "shrink", "program"}
    # "ops": drawn by a hunt restricted to those ops (--ops); absent: the suite's whole strategy
    # "classes": drawn by a hunt restricted to those program classes (--classes)
    if not isinstance(doc, dict) or doc.get("format") != DB_FORMAT or set(doc) - {"ops", "classes"} != keys:
        raise ValueError("unreadable")

    def whole(v, lo, hi):
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v < hi

    ok = (doc["suite"] == "sharded" and whole(doc["seed"], 0, _MAX_SEED) and whole(doc["count"], 1, 257)
          and whole(doc["index"], 0, doc["count"]) and whole(doc["devices"], 1, 1 << 16)
          and isinstance(doc["shrink"], list) and len(doc["shrink"]) <= 256
          and all(whole(k, 0, 4096) for k in doc["shrink"])
          and isinstance(doc["program"], str) and re.fullmatch(r"sha256:[0-9a-f]{64}", doc["program"])
          and ("ops" not in doc or isinstance(doc["ops"], list) and 0 < len(doc["ops"]) <= len(OPS)
               and all(isinstance(o, str) for o in doc["ops"]))
          and ("classes" not in doc or isinstance(doc["classes"], list) and 0 < len(doc["classes"]) <= len(CLASSES)
               and all(isinstance(o, str) for o in doc["classes"])))
    if not ok:
        raise ValueError("unreadable")
    if doc["devices"] > devices:
        raise ValueError("foreign")   # its meshes may need more devices than this hunt has
    if any(o not in OPS for o in doc.get("ops", ())) or any(c not in CLASSES for c in doc.get("classes", ())):
        raise ValueError("stale")     # an op this version's strategy does not draw
    return doc


def replay(blobs, devices: int) -> tuple[list, dict, dict]:
    """The programs of example-database entries `blobs`, each drawn again by the strategy and
    checked against its digest: (cases, {case_id: origin}, {reason: count} of the entries skipped:
    "unreadable" (not an entry of this format: garbage, an older pickle), "foreign" (drawn with
    more devices than `devices`), "stale" (the strategy draws another program now))."""
    cases, origins, skipped = [], {}, {}
    batches: dict = {}
    for blob in blobs:
        try:
            doc = _origin_of(blob, devices)
            key = (doc["seed"], doc["count"], doc["devices"], tuple(doc.get("ops", ())), tuple(doc.get("classes", ())))
            if key not in batches:
                batches[key] = base.draw(_strategy(doc["devices"], doc.get("ops"), doc.get("classes")), doc["count"],
                                         doc["seed"])
            drawn = batches[key]
            if doc["index"] >= len(drawn):
                raise ValueError("stale")
            case = drawn[doc["index"]]
            for k in doc["shrink"]:
                options = list(candidates(case))
                if k >= len(options):
                    raise ValueError("stale")
                case = options[k]
            if program_digest(case) != doc["program"]:
                raise ValueError("stale")
        except ValueError as e:
            reason = str(e) if str(e) in ("unreadable", "foreign", "stale") else "stale"
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        except Exception:  # noqa: BLE001 - the strategy cannot draw it in this version: not a case now
            skipped["stale"] = skipped.get("stale", 0) + 1
            continue
        cases.append(case)
        origins[case.case_id] = {k: doc[k] for k in ("seed", "count", "index", "devices", "shrink", "ops", "classes")
                                 if k in doc}
    return cases, origins, skipped


def _shrink_path(case, accepted: list) -> list | None:
    """The positions in `candidates` that lead from `case` through the `accepted` variants, in
    order (None when one of them is not a candidate of the one before)."""
    path, cur = [], case
    for acc in accepted:
        want = program_digest(acc)
        options = list(candidates(cur))
        k = next((i for i, c in enumerate(options) if program_digest(c) == want), None)
        if k is None:
            return None
        path.append(k)
        cur = options[k]
    return path


# -- running one case in a fresh process (shrinking exceptions and crashes) ------------------------
def check_in_subprocess(case, devices: int = 8, timeout: float = 300.0, *, with_xfails: bool = False) -> tuple | None:
    """The signature of `case` run alone in a fresh Python process (None when it passes, or, with
    `with_xfails`, fails as the CPU xfails file expects): a fatal CHECK in XLA kills only that process."""
    with tempfile.TemporaryDirectory(prefix="conformance-hunt-") as tmp:
        path = os.path.join(tmp, "case.json")
        write_case(case, path)
        env = dict(os.environ, XLA_BACKEND_DEVICES=str(devices))
        try:
            p = subprocess.run([sys.executable, "-m", "conformance.hunt", "--check", path]
                               + (["--xfails"] if with_xfails else []), capture_output=True,
                               text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return ("hang", _program_ops(case), "timeout")
        for line in reversed(p.stdout.splitlines()):
            if line.startswith("SIGNATURE "):
                sig = json.loads(line[len("SIGNATURE "):])
                return tuple(sig) if sig else None

        how = f"killed by signal {-p.returncode}" if p.returncode < 0 else f"exit code {p.returncode}"
        res = CaseResult(case_id=case.case_id, suite="sharded", family=case.family, dtype=case.dtype, status="error",
                         details=Failure(worker_exit=how, stderr_tail="\n".join(p.stderr.splitlines()[-20:]),
                                         fatal_line=next((ln for ln in reversed(p.stderr.splitlines())
                                                          if re.match(r"F\d{4} .*\.(cc|h):\d+\]", ln)), "")))
        return signature(res, case)


def _check_main(path: str, with_xfails: bool = False) -> int:
    """`--check FILE [--xfails]`: run the case of a case file (`read_case`: a finding's ``.json``)
    once (no shrinking) and print its signature (with the platform's xfails applied when asked: a
    known bug's signature is then null)."""
    xplat.configure()
    try:
        case = read_case(path)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    task = ProgramTask(case.case_id, "sharded", case.family, case.dtype, [case], None)
    entry = xfails_mod.load(None, platform="cpu").lookup(case.case_id) if with_xfails else None
    with tempfile.TemporaryDirectory() as tmp:
        res = runner.run_task(task, None, entry, repro_dir=tmp, shrink_seconds=0)
    print("SIGNATURE " + json.dumps(signature(res, case)), flush=True)
    return 0


# -- shrinking a new finding: fewest ops, then fewest devices --------------------------------------
def _shrink_out_of_process(case, sig: tuple, devices: int, seconds: float):
    """(`case` cut down while a fresh process running the variant still fails with the same stage
    and error class: first its op graph and layouts (`conformance.suites.sharded.candidates`, the
    positions of which are returned for the example database, or None), then its mesh
    (`conformance.upstream.shrink.fewer_devices`) and the graph again, the variant returned last)."""
    stop = time.monotonic() + seconds

    def same(cand) -> bool:
        got = check_in_subprocess(cand, devices, timeout=max(30.0, seconds))
        return got is not None and got[0] == sig[0] and got[2] == sig[2]

    small, steps = greedy(case, same, seconds / 2, cuts=(candidates,))
    smallest, _ = greedy(small, same, max(0.0, stop - time.monotonic()))
    return small, [pos for _, pos in steps], smallest


def _shrink_values(case, devices: int, seconds: float):
    """(the op-shrunk case, its `candidates` path, the smallest case) of a case whose values
    disagree, cut down in one fresh process (`conformance.upstream.helper shrink`: refsim and XLA
    side by side, JAX started once); the last variant it printed, if a variant killed it."""
    lines: list = []
    with tempfile.TemporaryDirectory(prefix="conformance-hunt-") as tmp:
        src = os.path.join(tmp, "case.json")
        write_case(case, src)
        env = dict(os.environ, XLA_BACKEND_DEVICES=str(devices))
        try:
            p = subprocess.run([sys.executable, "-m", "conformance.upstream.helper", "shrink", src, "--seconds",
                                str(seconds), "--devices", str(devices)], capture_output=True, text=True,
                               timeout=seconds + 180, env=env)
            lines = p.stdout.splitlines()
        except subprocess.TimeoutExpired as e:
            lines = (e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or "").splitlines()
    latest, small, path = case, None, None
    for line in lines:
        try:
            if line.startswith("STEP "):
                latest = case_from_data(json.loads(line[len("STEP "):]))
            elif line.startswith("PATH "):
                small, path = latest, json.loads(line[len("PATH "):])
        except ValueError:   # a line cut short by a dying process
            break
    return (case, None, latest) if small is None else (small, path, latest)


def _reproducer(case, path: str) -> None:
    """Write `case`'s reproducer: refsim's values embedded, or (refsim cannot run it) none, so the
    script shows JAX's own error."""
    try:
        expected = case.run(refsim)
        tols = case.tolerances()
    except Exception:  # noqa: BLE001 - a tracing error: the script reproduces it by running the program
        expected, tols = [], []
    text = case.repro(expected=expected, tolerances=tols)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


# -- the hunt -------------------------------------------------------------------------------------
class _Stop:
    """SIGINT / SIGTERM: the first asks the hunt to stop drawing and finish; the second interrupts."""

    def __init__(self):
        self.asked = False
        self._old = {}

    def __enter__(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


class _Progress:
    """A line on stderr every `every` seconds (0: never): programs done and their rate, findings
    (new / known), the other failures, time left. Plain lines: no terminal needed."""

    def __init__(self, every: float, stream, budget: str):
        self.every, self.stream, self.budget = every, stream, budget
        self.t0 = self.last = time.monotonic()
        self.done, self.statuses, self.shown = 0, {}, None

    def result(self, res) -> None:
        self.done += 1
        self.statuses[res.status] = self.statuses.get(res.status, 0) + 1

    def tick(self, found: dict, *, force: bool = False) -> None:
        now = time.monotonic()
        if not self.every or (now - self.last < self.every and not force):
            return
        state = (self.done, len(found), tuple(sorted(self.statuses.items())))
        if force and state == self.shown:
            return   # the closing line would repeat the last one
        self.last, self.shown = now, state
        dt = now - self.t0
        new = sum(1 for f in found.values() if f.known is None)
        other = ", ".join(f"{n} {s}" for s, n in sorted(self.statuses.items()) if s != "pass")
        print(f"hunt {int(dt) // 60}:{int(dt) % 60:02d} | {self.done} programs ({self.done / max(dt, 1e-9):.2f}/s) | "
              f"{len(found)} finding(s): {new} new, {len(found) - new} known | {other or 'no failures'} | "
              f"{self.budget}", file=self.stream, flush=True)


def _strategy(devices: int, ops, classes=None):
    """The sharded suite's strategy, or its programs drawn from `ops` alone (``--ops``) and called
    as the program `classes` alone (``--classes``)."""
    if not ops and not classes:
        return suite_mod.strategy("sharded", None, devices)
    return sharded_programs(ops=tuple(ops or OPS), max_devices=devices,
                            classes=tuple(classes) if classes else ("plain",))


def hunt(*, minutes: float | None = None, suite: str = "sharded", report_dir=None, seed: int | None = None,
         processes: int = 1, xfails=None, devices: int = 8, platform: str = "cpu", database=None,
         shrink_seconds: float = 60.0, case_timeout: float = 300.0, programs: int | None = None, ops=None,
         classes=None, upstream: bool = True, progress_every: float = 5.0, progress_stream=None,
         out=print) -> HuntResult:
    """Draw and run programs of `suite` for `minutes` (or until `programs` have been drawn, or
    both: whichever ends first); return the distinct failures (see the module). seed: the draws'
    seed (None: a random one, recorded); ops: draw programs of these `OPS` only; classes: call them
    as these program classes only (`CLASSES`; default: every class, or "plain" with `ops`); upstream: write
    each finding's plain-JAX script and issue body; progress_every: seconds between progress
    lines on `progress_stream` (default stderr; 0: none)."""
    if suite != "sharded":
        raise ValueError(f"suite={suite!r}: hunting draws from a suite's strategy; 'sharded' is the one built "
                         "for it.")
    if minutes is None and programs is None:
        raise ValueError("pass minutes= (a time budget), programs= (a program budget) or both.")
    if minutes is not None and not minutes > 0:
        raise ValueError(f"minutes={minutes!r}; pass a positive number of minutes.")
    if programs is not None and (isinstance(programs, bool) or not isinstance(programs, int) or programs < 1):
        raise ValueError(f"programs={programs!r}; pass a positive whole number of programs.")
    if ops:
        ops = tuple(dict.fromkeys(ops))
        bad = [o for o in ops if o not in OPS]
        if bad:
            raise ValueError(f"ops={bad!r} are not ops the sharded strategy draws; pick from "
                             f"conformance.strategies.sharded.OPS ({', '.join(sorted(OPS)[:6])}, ...).")
    if classes:
        classes = tuple(dict.fromkeys(classes))
        bad = [c for c in classes if c not in CLASSES]
        if bad:
            raise ValueError(f"classes={bad!r} are not program classes the sharded strategy draws; pick from "
                             f"conformance.strategies.sharded.CLASSES ({', '.join(CLASSES)}).")
    xplat.configure(platform, devices)
    if seed is None:   # recorded, so the hunt can be repeated
        seed = random.SystemRandom().randrange(_MAX_SEED)

    report_dir = report_dir or tempfile.mkdtemp(prefix="conformance-hunt-")
    prepare_report_dir(report_dir)
    findings_dir = os.path.join(report_dir, "findings")
    os.makedirs(findings_dir, exist_ok=True)
    # the workers' reproducers, until a finding takes one (each finding's files are written once, in its folder)
    scratch = tempfile.mkdtemp(prefix="conformance-hunt-repros-")
    db = DirectoryBasedExampleDatabase(database or os.path.join(report_dir, "examples"))
    xf = xfails if isinstance(xfails, xfails_mod.XfailList) else xfails_mod.load(xfails, platform=platform)
    master = random.Random(seed)
    deadline = time.monotonic() + minutes * 60 if minutes is not None else float("inf")
    budget = " · ".join(x for x in ((f"{minutes:g} min" if minutes is not None else ""),
                                    (f"{programs} programs" if programs is not None else "")) if x)
    progress = _Progress(progress_every, progress_stream or sys.stderr, f"budget {budget}, seed {seed}")
    t0 = time.perf_counter()
    by_id: dict = {}
    stop = _Stop()
    counts = {"sent": 0, "done": 0, "drawn": 0}
    generator_errors: list = []
    origins: dict = {}     # case id -> how the strategy draws it (the example database's entry)
    database: dict = {"replayed": 0, "skipped": {}}
    results, found = [], {}

    def batch_tasks(cases, s, drawn_as=None):
        tasks = base.group_tasks("sharded", cases, seed=s, shrink_of=lambda c: ("sharded", c.family, c.dtype),
                                 variants=len(suite_mod.DATA), data=suite_mod.DATA)
        for t in tasks:
            by_id[t.case_id] = t
            if drawn_as is not None:
                origins[t.case_id] = drawn_as[t.case_id]
            else:
                i = next(i for i, c in enumerate(cases) if c.case_id == t.case_id)
                origins[t.case_id] = {"seed": s, "count": BATCH, "index": i, "devices": devices, "shrink": []} \
                    | ({"ops": list(ops)} if ops else {}) | ({"classes": list(classes)} if classes else {})
        counts["sent"] += len(tasks)
        return [(t, xf.lookup(t.case_id)) for t in tasks]

    def feed():
        again, drawn_as, skipped = replay(db.fetch(DB_KEY), devices)
        database.update(replayed=len(again), skipped=skipped)
        if skipped:
            out(f"skipped {sum(skipped.values())} example-database entr{'y' if sum(skipped.values()) == 1 else 'ies'} "
                f"this hunt cannot replay ({', '.join(f'{k}: {v}' for k, v in sorted(skipped.items()))}; left in "
                "place)")
        if again:
            out(f"replaying {len(again)} failing program(s) from the example database first")
            yield batch_tasks(again, 0, drawn_as)
        strategy = _strategy(devices, ops, classes)
        while not stop.asked and time.monotonic() < deadline and (programs is None or counts["drawn"] < programs):
            progress.tick(found)
            if counts["sent"] - counts["done"] > 2 * processes:
                # the workers are busy: draw the next batch when they have taken most of this one
                time.sleep(0.05)
                yield []
                continue
            s = master.randrange(_MAX_SEED)
            try:
                cases = base.draw(strategy, BATCH, s)
            except Exception as e:  # noqa: BLE001 - a generator defect is a finding, not the hunt's end
                generator_errors.append(f"seed {s}: {type(e).__name__}: {e}")
                out(f"the strategy failed to draw a batch (seed {s}): {type(e).__name__}: {str(e).splitlines()[0]}")
                continue
            if programs is not None:   # the budget's last batch: its first programs only, so a seed and
                cases = cases[:programs - counts["drawn"]]   # a budget name the same programs every time
            counts["drawn"] += len(cases)
            yield batch_tasks(cases, s)

    plan = dict(platform=platform, devices=devices, suite=suite, seed=seed, mode="hunt", minutes=minutes,
                programs=programs, ops=list(ops) if ops else None, classes=list(classes) if classes else None,
                processes=processes, xfails=xf.source,
                **runner._versions())
    reporters = open_report_dir(report_dir)
    for r in reporters:
        r.start(dict(plan))
    known, numbered = earlier_findings(findings_dir)   # a rerun on this folder keeps their numbers
    opts = dict(repro_dir=scratch, devices=devices, shrink_seconds=shrink_seconds, seed=0)
    rec = dict(db=db, findings_dir=findings_dir, devices=devices, shrink_seconds=shrink_seconds, out=out,
               upstream=upstream, platform=platform, timeout=case_timeout, ops=ops)
    interrupted = False
    with stop:
        try:
            for res in workers.run_in_workers([], run_task=runner.run_task, write_repro=runner.write_repro,
                                              processes=processes, platform=platform, devices=devices,
                                              opts=opts, case_timeout=case_timeout, more=feed()):
                counts["done"] += 1
                task = by_id.get(res.case_id)
                case = task.variants[0] if task is not None else None
                if case is not None:
                    res.details.program = {
                        "ops": [list(p) for p in case.op_patterns], "transform": case.transform,
                        "axis_types": case.axis_types, "partitioner": case.partitioner,
                        "program_class": case.program_class,
                        "mesh": list(case.mesh.axis_sizes)}
                sig = signature(res, case)
                if sig is not None:
                    if sig in found:
                        found[sig].count += 1
                    elif sig in known:
                        found[sig] = dataclasses.replace(known[sig], count=1, case_id=res.case_id, status=res.status)
                        out(f"known failure [{sig[0]}] {sig[1]}: {sig[2]}\n  case {res.case_id}\n  finding "
                            f"{known[sig].number:03d} of an earlier hunt on this folder: {known[sig].folder}")
                    else:
                        numbered += 1
                        found[sig] = _record(sig, res, case, number=numbered, origin=origins.get(res.case_id), **rec)
                    # one reproducer per finding, in its folder: the worker's copy goes
                    _discard(res.repro_path, scratch)
                    res.repro_path = found[sig].path
                progress.result(res)
                results.append(res)
                for r in reporters:
                    r.case_finished(res)
                progress.tick(found)
        except KeyboardInterrupt:
            interrupted = True
    progress.tick(found, force=True)
    shutil.rmtree(scratch, ignore_errors=True)
    partial = stop.asked or interrupted
    wall = time.perf_counter() - t0
    summary = summarize(results, wall_seconds=wall, compile_seconds=sum(r.compile_seconds for r in results))
    runner._xfail_summary(summary, xf, results, False, complete=False)
    summary["plan"] = dict(plan)
    summary["phases"] = timing.totals(results, 0.0)
    # the share of the work (summed over the workers, as the phase line counts it), not of the wall time
    work = sum(summary["phases"].values())
    summary["compile_share"] = summary["phases"].get("xla_compile", 0.0) / work if work > 0 else 0.0
    groups = write_causes(findings_dir, list(found.values())) if found else []
    summary["hunt"] = {"partial": partial, "seed": seed, "programs": len(results), "minutes": wall / 60,
                       "budget": {"minutes": minutes, "programs": programs}, "ops": list(ops) if ops else None,
                       "classes": list(classes) if classes else None,
                       "findings": [dataclasses.asdict(f) for f in sorted(found.values(), key=lambda f: f.number)],
                       "new": sum(1 for f in found.values() if f.known is None),
                       "known": sum(1 for f in found.values() if f.known is not None),
                       "causes": groups, "generator_errors": generator_errors, "database": database}
    for r in reporters:
        r.finish(summary)
    result = HuntResult(len(results), wall / 60, partial, sorted(found.values(), key=lambda f: f.number), report_dir,
                        generator_errors, database, seed, groups)
    with open(os.path.join(report_dir, "hunt.json"), "w", encoding="utf-8") as fh:
        json.dump(summary["hunt"] | {"report_dir": report_dir, "plan": summary["plan"]}, fh, indent=1, default=str)
    return result


def _discard(path, scratch: str) -> None:
    if path and os.path.dirname(os.path.abspath(path)) == os.path.abspath(scratch):
        try:
            os.remove(path)
        except OSError:
            pass


def _record(sig, res, case, *, db, findings_dir, devices, shrink_seconds, out, number: int, upstream: bool,
            platform: str, timeout: float, ops=None, origin: dict | None = None) -> Finding:
    """A new distinct failure, finding `number`: shrink it to the fewest ops and devices that
    still fail the same way (`_shrink_values` for wrong values, `_shrink_out_of_process` for the
    rest), write its folder (`conformance.findings`) now, with its plain-JAX script and issue body
    (`conformance.upstream.report.write`), and keep how the strategy draws it (`origin`, and the
    shrinking path) in the example database."""
    stage, op, error = sig
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{number:03d}-{stage}-{op}")[:80]
    folder = os.path.join(findings_dir, slug)
    os.makedirs(folder, exist_ok=True)
    text = res.details.fatal_line or (res.details.signature or {}).get("message") or res.message or ""
    finding = Finding(stage, op, error, 1, res.case_id, res.status, None,
                      res.message.splitlines()[0] if res.message else "", number=number, folder=folder)
    out(f"new failure [{stage}] {op}: {error}\n  case {res.case_id}\n  finding {number:03d}: shrinking it (up to "
        f"{shrink_seconds:g} s)" + (", then writing and running its plain-JAX script" if upstream else ""))
    smallest = case
    if case is not None:
        small, path = case, []
        if shrink_seconds > 0:
            if stage.startswith("mismatch"):   # (an "error" too: a listed case that differs otherwise)
                small, path, smallest = _shrink_values(case, devices, shrink_seconds)
            else:
                small, path, smallest = _shrink_out_of_process(case, sig, devices, shrink_seconds)
        if smallest is not case:
            finding.note = (f"shrunk from {len(case.op_patterns)} op(s), {len(case.graph.outs)} output(s) on "
                            f"{case.mesh.size} device(s) to {len(smallest.op_patterns)}, {len(smallest.graph.outs)} "
                            f"on {smallest.mesh.size}")
        finding.path = os.path.join(folder, "repro.py")
        _reproducer(smallest, finding.path)
        write_case(smallest, os.path.join(folder, "case.json"))
        finding.digest = program_digest(smallest)
        if origin is not None:
            if path is None:   # the shrunk program cannot be named by its path: keep the drawn one
                small, path = case, []
            db.save(DB_KEY, _entry(dict(origin, shrink=list(origin["shrink"]) + path), small))
    finding.cause = cause_key(stage, op, error, text=text, op_patterns=getattr(smallest, "op_patterns", ()))
    if stage == "hang":   # its script would hang too: the finding's repro.py and case.json say enough
        finding.note = (finding.note + "; " if finding.note else "") + "a hang: no upstream script run"
    if case is not None and upstream and stage not in ("refsim", "hang"):
        rep = upstream_report.write(folder, smallest, number=number, stage=stage, stage_record=res.details.stage,
                                    platform=platform, timeout=timeout,
                                    found_with=f"drawn from the ops {', '.join(ops)}" if ops else "")
        finding.upstream = rep.to_json()
        if rep.known is not None:
            finding.known, finding.known_why = rep.known.number, rep.known.why
        first = next((rep.outcomes[p] for p in rep.failing), None)
        if first is not None and stage != "crash":   # the plain script's own message names the cause best
            finding.cause = cause_key(stage, op, error, text=first.fatal_line or first.message,
                                      op_patterns=smallest.op_patterns)
    write_record(finding)
    out(f"  finding {number:03d}: {finding.verdict()}" + (f"; {finding.note}" if finding.note else "")
        + f"\n  folder: {folder}")
    return finding


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m conformance hunt",
                 description="Draw random programs for N minutes (or M programs); keep every distinct failure with "
                             "its reproducer, a plain-JAX script and an issue body.")
    ap.add_argument("--minutes", type=float, help="how long to hunt")
    ap.add_argument("--programs", type=_positive, help="how many programs to draw (with --seed: the same programs "
                                                       "every time)")
    ap.add_argument("--suite", default="sharded", choices=["sharded"], help="the suite whose strategy draws programs")
    ap.add_argument("--ops", metavar="OP[,OP...]", help="draw programs of these ops only "
                                                       "(conformance.strategies.sharded.OPS), e.g. slice,pad")
    ap.add_argument("--classes", metavar="CLASS[,CLASS...]", help="call programs as these program classes only "
                                                                "(conformance.strategies.sharded.CLASSES), e.g. "
                                                                "scan_layers,remat")
    ap.add_argument("--report", metavar="DIR", help="results.jsonl, junit.xml, report.html, findings/, hunt.json")
    ap.add_argument("--seed", type=_seed, default=None, help="seed of the draws (default: random, printed and recorded "
                                                            "in hunt.json)")
    ap.add_argument("--processes", type=_positive, default=_cores(), help="worker processes (default: one per core)")
    ap.add_argument("--xfails", metavar="FILE", help="expected failures (default xfails/<platform>.txt; an empty "
                                                    "file expects nothing, so known bugs are found again)")
    ap.add_argument("--devices", type=_positive, default=8, help="virtual CPU devices (default 8)")
    ap.add_argument("--platform", default="cpu", help="JAX platform (default cpu)")
    ap.add_argument("--database", metavar="DIR", help="hypothesis example database of failing programs "
                                                     "(default DIR/examples)")
    ap.add_argument("--shrink-seconds", type=_seconds, default=60.0, help="time to shrink each new failure")
    ap.add_argument("--case-timeout", type=_timeout, default=300.0, help="seconds before a case counts as a hang")
    ap.add_argument("--no-upstream", action="store_true", help="no plain-JAX script or UPSTREAM.md per finding")
    ap.add_argument("--progress-every", type=_seconds, default=5.0, help="seconds between progress lines on stderr "
                                                                        "(0: none)")
    return ap


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--check"]:
        return _check_main(argv[1], "--xfails" in argv[2:])
    args = build_parser().parse_args(argv)
    if args.minutes is None and args.programs is None:
        print("error: pass --minutes N, --programs N or both", file=sys.stderr)
        return 2
    if args.minutes is not None and not args.minutes > 0:
        print("error: --minutes must be > 0", file=sys.stderr)
        return 2
    try:
        result = hunt(minutes=args.minutes, suite=args.suite, report_dir=args.report, seed=args.seed,
                      processes=args.processes, xfails=args.xfails, devices=args.devices, platform=args.platform,
                      database=args.database, shrink_seconds=args.shrink_seconds, case_timeout=args.case_timeout,
                      programs=args.programs, ops=args.ops.split(",") if args.ops else None,
                      classes=args.classes.split(",") if args.classes else None,
                      upstream=not args.no_upstream, progress_every=args.progress_every)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_findings(result)
    return 1 if result.findings or result.generator_errors else 0


if __name__ == "__main__":
    sys.exit(main())
