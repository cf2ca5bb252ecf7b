"""`python -m conformance run-bundle`: run an export bundle under the installed JAX and judge it.

    python -m conformance run-bundle DIR [--report OUT] [--devices D] [--no-findings]

Each program of the bundle (`conformance.export.bundle`) has its files checked against their
sha256 (a mismatch: reported as ``rejected``, never run), is deserialized with
`jax.export.deserialize`, called on a mesh of the same shape, axis names, axis types and device
ids with its inputs laid out by the stored in-shardings (inside ``jax.set_mesh``, under the
installed JAX's default partitioner), and its outputs are compared with refsim's stored
expected outputs, laid out by the stored out-shardings, by `conformance.verdict.compare` (the
layout, then per output exact or within the value model's error bound, as the sharded suite
judges the same program). Outcomes:

* ``agree`` / ``disagree`` / ``error`` (deserializing or calling raised) inside the window;
* ``outside-window``: the program is outside the installed JAX's compatibility window
  (`conformance.export.window`), or JAX refused it as expired; it is still run and what happened
  is said, but it is no failure;
* ``rejected``: a file does not match its sha256.

The programs run in a child process of the same Python (this process never loads JAX): a
program that kills it (a fatal CHECK in XLA) or runs past ``CASE_TIMEOUT`` seconds is an
``error`` naming XLA's fatal line, and a fresh child runs the rest.

The exporter runs each artifact once itself (the manifest's ``exporter_run``). A disagreement or
error that the exporting JAX's own round trip had too is counted as such (``exporters-own``) and
is not a cross-version finding: it is the exporter version's own refsim-vs-XLA difference (or
refsim's), which a run or hunt under that version reports.

The report folder (default ``DIR/run-jax<version>``) gets the project's reports (results.jsonl,
junit.xml, report.html: statuses pass / fail / error / unsupported for agree / disagree / error /
outside-window), ``export-run.json`` (the counts and one record per program) and ``findings/``:
one folder per distinct cross-version disagreement or error inside the window, ready to file
(`conformance.export.findings`). Exit status 0 when nothing disagreed, erred or was rejected, 1
otherwise, 2 on bad arguments or a folder that is no bundle.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform as _platform
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

from conformance.arguments import Parser
from conformance.export import window
from conformance.export.bundle import IntegrityError, load_program, read_bundle, spec_from_data
from conformance.report import open_report_dir, prepare_report_dir, print_table
from conformance.report.failure import Failure
from conformance.report.results import CaseResult, summarize
from xla_backend import platform as xplat

# None of these loads JAX: `run_bundle` configures the platform first.

__all__ = ["OUTCOMES", "BundleRun", "ProgramOutcome", "main", "run_bundle", "run_outcomes", "run_program", "tolerances"]

#: A program's outcome -> the `CaseResult` status the project's reports use.
OUTCOMES = {"agree": "pass", "disagree": "fail", "error": "error", "outside-window": "unsupported",
            "rejected": "error"}
RUN_RECORD = "export-run.json"
CASE_TIMEOUT = 300.0
#: A test hook: the child process aborts before running the program of this id, as on a fatal CHECK.
ABORT_AT = "CONFORMANCE_EXPORT_ABORT_AT"


@dataclasses.dataclass
class ProgramOutcome:
    """One bundle program run here: its outcome (`OUTCOMES`), the message, why it is outside the
    window (empty inside), what happened when it ran (`ran`: agree / disagree / error / not run)."""

    id: str
    case_id: str
    outcome: str
    message: str = ""
    outside: list = dataclasses.field(default_factory=list)
    ran: str = ""
    seconds: float = 0.0
    report: str = ""          # the comparison's report, or the traceback's last lines
    signature: tuple = ()     # (stage, op, error class) of a disagreement or error
    exporter_run: str = ""    # how the exporting JAX's own round trip ended ("" when the bundle does not say)

    @property
    def exporters_own(self) -> bool:
        """A disagreement or error the exporting JAX's own round trip had too: no cross-version difference."""
        return self.outcome in ("disagree", "error") and self.exporter_run not in ("", "agree")


@dataclasses.dataclass
class BundleRun:
    """A bundle run: the exporter's and this runner's records, every program's outcome, the counts."""

    bundle: str
    report_dir: str
    exporter: dict
    runner: dict
    programs: list
    findings: list
    summary: dict = dataclasses.field(default_factory=dict)   # `summarize`'s, as the reporters got it

    @property
    def counts(self) -> dict:
        c = {"programs": len(self.programs), "agree": 0, "disagree": 0, "error": 0, "outside-window": 0,
             "rejected": 0}
        for p in self.programs:
            c[p.outcome] += 1
        c["exporters-own"] = sum(p.exporters_own for p in self.programs)
        return c

    @property
    def ok(self) -> bool:
        c = self.counts
        return not (c["disagree"] or c["error"] or c["rejected"])

    def to_json(self) -> dict:
        return {"bundle": self.bundle, "exporter": self.exporter, "runner": self.runner, "counts": self.counts,
                "verdict": "AGREE" if self.ok else "DISAGREE",
                "programs": [dataclasses.asdict(p) for p in self.programs],
                "findings": [dataclasses.asdict(f) for f in self.findings]}


def _mesh(entry: dict):
    import refsim

    m = entry["mesh"]
    types = m.get("axis_types")
    return refsim.Mesh(tuple(int(n) for n in m["shape"]), tuple(m["names"]),
                       device_ids=np.asarray(m["device_ids"], dtype=np.int64),
                       axis_types=tuple(refsim.AxisType(t) for t in types) if types else None)


def tolerances(expected: list, policies) -> list:
    """The comparison policy of each output from the manifest's policies, as
    `conformance.strategies.sharded.ShardedProgram.tolerances` builds them around refsim's value:
    ``("exact", 0)`` either sign of a zero; ``("abs", b)`` within 2·b; ``("rel", r)`` within r times
    the output's largest finite magnitude (at least 1)."""
    from conformance.strategies.sharded import ErrorBound
    from conformance.verdict.compare import Exact

    out = []
    for arr, (kind, value) in zip(expected, policies):
        if kind == "exact":
            out.append(Exact(signed_zero=False))
        elif kind == "abs":
            out.append(ErrorBound.around(arr, 2 * value, "the value model's error bound, both sides"))
        elif kind == "rel":
            scale = max([float(np.max(np.abs(x[np.isfinite(x)]), initial=0.0))
                         for x in (np.asarray(s.data, np.float64) for s in arr.shards)] + [1.0])
            out.append(ErrorBound.around(arr, value * scale, f"{value:.3g} x the largest |value| of a derivative"))
        else:
            raise ValueError(f"unknown policy {kind!r} in the manifest (exact, abs or rel)")
    return out


def _key(text: str) -> str:
    line = next((ln for ln in str(text).splitlines() if ln.strip()), "")
    return re.sub(r"\d+", "N", re.sub(r"0x[0-9a-f]+", "", line)).strip()[:100]


def run_program(loaded, runner: dict) -> ProgramOutcome:
    """Deserialize, call and judge one checked bundle program (`bundle.LoadedProgram`)."""
    import jax

    import refsim
    import xla_backend
    from conformance.verdict.compare import compare

    entry = loaded.entry
    t0 = time.perf_counter()
    res = ProgramOutcome(entry["id"], entry.get("case_id", ""), "error", outside=window.outside(entry, runner),
                         exporter_run=str((entry.get("exporter_run") or {}).get("outcome", "")))
    ops = "+".join(entry.get("ops") or []) or "-"
    stage = "deserialize"
    try:
        exp = jax.export.deserialize(bytearray(loaded.exported))
        stage = "call"
        mesh = _mesh(entry)
        ins = [refsim.NamedSharding(mesh, refsim.PartitionSpec(*spec_from_data(s))) for s in entry["in_specs"]]
        args = []
        for a, s in zip(loaded.inputs, ins):
            jsh = xla_backend.to_jax_sharding(s)
            args.append(jax.make_array_from_callback(a.shape, jsh, lambda idx, a=a: a[idx], dtype=a.dtype))
        with jax.set_mesh(xla_backend.jax_mesh(mesh)):
            outs = jax.tree_util.tree_leaves(exp.call(*args))
        got = [xla_backend.to_refsim(o) for o in outs]
        stage = "compare"
        want = [refsim.device_put(x, refsim.NamedSharding(mesh, refsim.PartitionSpec(*spec_from_data(s))))
                for x, s in zip(loaded.expected, entry["out_specs"])]
        cmp = compare(want, got, tolerances=tolerances(want, entry["policies"]))
        res.ran = "agree" if cmp.ok else "disagree"
        res.report = cmp.report()
        res.message = "agreed with refsim" if cmp.ok else (
            f"{len(cmp.mismatches)} mismatch(es), the first: {cmp.mismatches[0].render().splitlines()[0]}")
        if not cmp.ok:
            classes = ",".join(cmp.classes) or ",".join(sorted({m.kind for m in cmp.mismatches}))
            res.signature = ("cross-version:mismatch", ops, classes or "value")
    except Exception as e:  # noqa: BLE001 - JAX raising on a valid artifact is the program's result
        import traceback

        res.ran = "error"
        res.message = f"{stage} raised {type(e).__name__}: " + next((ln for ln in str(e).splitlines() if ln.strip()),
                                                                     "")[:400]
        res.report = "".join(traceback.format_exception(e)[-6:])
        res.signature = (f"cross-version:{stage}", ops, f"{type(e).__name__}: {_key(str(e))}")
        if window.refused_as_expired(e):
            res.outside.append("JAX refused the artifact as older than its backward-compatibility window")
    res.seconds = time.perf_counter() - t0
    return _settled(res)


def _settled(res: ProgramOutcome) -> ProgramOutcome:
    """`res` with its outcome: outside-window where the window excludes it, else what happened."""
    res.outcome = "outside-window" if res.outside else res.ran
    if res.exporters_own:
        res.message += f" (the exporting JAX's own round trip: {res.exporter_run}; not a cross-version difference)"
    return res


def runner_record() -> dict:
    import jax

    return dict(window.installed(), numpy=np.__version__, python=_platform.python_version(),
                platform=jax.devices()[0].platform, devices=jax.device_count())


def _case_result(p: ProgramOutcome, entry: dict, family: str) -> CaseResult:
    msg = p.message
    if p.outcome == "outside-window":
        msg = f"outside the compatibility window: {'; '.join(p.outside)} (ran anyway: {p.ran}: {p.message})"
    details = Failure() if p.outcome == "agree" else Failure(
        signature={"kind": "export", "outcome": p.outcome, "signature": list(p.signature)})
    dtype = (entry.get("inputs") or [{"dtype": "none"}])[0]["dtype"]
    return CaseResult(case_id=f"{p.id} {p.case_id}", suite="export", family=family, dtype=dtype,
                      status=OUTCOMES[p.outcome], seconds=p.seconds, message=msg, details=details)


def _run_entry(bundle, entry: dict, runner: dict) -> ProgramOutcome:
    try:
        loaded = load_program(bundle, entry)
    except (IntegrityError, ValueError) as e:
        return ProgramOutcome(entry["id"], entry.get("case_id", ""), "rejected", message=str(e), ran="not run")
    if os.environ.get(ABORT_AT) == entry["id"]:
        os.abort()   # a fault the tests plant: this process dies here as on a fatal CHECK in XLA
    return run_program(loaded, runner)


def _child_main(argv) -> int:
    """``python -m conformance.export.run --child BUNDLE START RECORDS DEVICES``: run the bundle's
    programs from position START on, one JSON line per event in RECORDS (flushed as it happens)."""
    path, start, records, devices = argv[0], int(argv[1]), argv[2], int(argv[3])
    bundle = read_bundle(path)
    xplat.configure("cpu", devices)
    runner = runner_record()
    with open(records, "a", encoding="utf-8") as fh:
        def put(record):
            fh.write(json.dumps(record, default=str) + "\n")
            fh.flush()

        put({"runner": runner})
        for entry in bundle.programs[start:]:
            put({"start": entry["id"]})
            put({"done": dataclasses.asdict(_run_entry(bundle, entry, runner))})
    return 0


def _records(path: str) -> list:
    out = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except ValueError:   # a line cut short by the process's death
                    break
    except OSError:
        pass
    return out


def _fatal_line(stderr: str) -> str:
    """XLA's fatal log line (``F1206 ... file.cc:N] Check failed: ...``) of a dead process, else its last line."""
    m = re.search(r"^F\d{4} [\d:.]+\s+\d+ (.*)$", stderr, re.M)
    if m:
        return m.group(1).strip()
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(("W", "    @"))]
    return lines[-1].strip() if lines else ""


def run_outcomes(path, *, devices: int = 8, case_timeout: float = CASE_TIMEOUT, on_result=None) -> tuple:
    """(runner record, [ProgramOutcome]) of every program of the bundle at `path`, run in a child
    process of this Python (JAX starts there, not here): a program that kills it (a fatal CHECK in
    XLA) or runs past `case_timeout` seconds is an error naming the fatal line, and a fresh child
    runs the rest. `on_result(outcome)` is called as each program ends."""
    bundle = read_bundle(path)
    by_id = {e["id"]: (i, e) for i, e in enumerate(bundle.programs)}
    runner, outcomes, start = None, [], 0
    with tempfile.TemporaryDirectory(prefix="conformance-run-bundle-") as tmp:
        while True:
            records, errors = os.path.join(tmp, f"records-{start}.jsonl"), os.path.join(tmp, f"stderr-{start}.txt")
            with open(errors, "w", encoding="utf-8") as err:
                try:
                    p = subprocess.run([sys.executable, "-m", "conformance.export.run", "--child", bundle.path,
                                        str(start), records, str(devices)], stdout=subprocess.DEVNULL, stderr=err,
                                       timeout=case_timeout * max(1, len(bundle.programs) - start) + 120)
                    how = None if p.returncode == 0 else (f"was killed by signal {-p.returncode}" if p.returncode < 0
                                                          else f"exited with status {p.returncode}")
                except subprocess.TimeoutExpired:
                    how = f"ran past {case_timeout:g} s per program and was killed"
            with open(errors, encoding="utf-8", errors="replace") as fh:
                stderr = fh.read()
            started = None
            for rec in _records(records):
                if "runner" in rec:
                    runner = rec["runner"]
                elif "start" in rec:
                    started = rec["start"]
                elif "done" in rec:
                    done = ProgramOutcome(**dict(rec["done"], signature=tuple(rec["done"]["signature"])))
                    outcomes.append(done)
                    started = None
                    if on_result is not None:
                        on_result(done)
            if how is None:
                return runner, outcomes
            if runner is None or started is None:
                raise RuntimeError(f"the runner process {how} before it ran a program: {_fatal_line(stderr)}")
            i, entry = by_id[started]
            fatal = _fatal_line(stderr)
            dead = _settled(ProgramOutcome(
                entry["id"], entry.get("case_id", ""), "error", message=f"the runner process {how}: {fatal}",
                outside=window.outside(entry, runner), ran="error", report=stderr[-3000:],
                signature=("cross-version:crash", "+".join(entry.get("ops") or []) or "-", _key(fatal) or how),
                exporter_run=str((entry.get("exporter_run") or {}).get("outcome", ""))))
            outcomes.append(dead)
            if on_result is not None:
                on_result(dead)
            start = i + 1
            if start >= len(bundle.programs):
                return runner, outcomes


def run_bundle(path, *, report_dir=None, devices: int = 8, findings: bool = True, case_timeout: float = CASE_TIMEOUT,
               say=print) -> BundleRun:
    """Run every program of the bundle at `path` under the installed JAX (see the module)."""
    from conformance.export import findings as findings_mod

    bundle = read_bundle(path)
    t0 = time.perf_counter()

    def said(p):
        say(f"{p.id} {p.outcome:<14} {p.case_id[:90]}" + (f"\n    {p.message}" if p.outcome != "agree" else ""))

    runner, outcomes = run_outcomes(bundle.path, devices=devices, case_timeout=case_timeout, on_result=said)
    report_dir = prepare_report_dir(report_dir or os.path.join(bundle.path, f"run-jax{runner['jax']}"))
    family = f"jax {bundle.exporter.get('jax', '?')} -> {runner['jax']}"
    reporters = open_report_dir(report_dir)
    plan = {"mode": "run-bundle", "bundle": bundle.path, "exporter": bundle.exporter, "runner": runner,
            "platform": runner["platform"], "devices": devices, "suite": "export"}
    for r in reporters:
        r.start(dict(plan))
    entries = {e["id"]: e for e in bundle.programs}
    results = [_case_result(p, entries[p.id], family) for p in outcomes]
    for res in results:
        for r in reporters:
            r.case_finished(res)
    found = findings_mod.write(report_dir, bundle, entries, outcomes, runner) if findings else []
    summary = summarize(results, wall_seconds=time.perf_counter() - t0, compile_seconds=0.0)
    summary["plan"] = plan
    for r in reporters:
        r.finish(summary)
    run = BundleRun(bundle.path, report_dir, bundle.exporter, runner, outcomes, found, summary)
    with open(os.path.join(report_dir, RUN_RECORD), "w", encoding="utf-8") as fh:
        json.dump(run.to_json(), fh, indent=1, default=str)
    return run


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="python -m conformance run-bundle",
                description="Run an export bundle (written by `export-bundle` under any JAX) under this JAX and "
                            "compare every program with refsim's stored expected outputs.")
    ap.add_argument("bundle", metavar="DIR", help="the bundle folder")
    ap.add_argument("--report", metavar="OUT", help="report folder (default DIR/run-jax<version>)")
    ap.add_argument("--devices", type=int, default=8, help="virtual CPU devices (default 8)")
    ap.add_argument("--no-findings", action="store_true", help="write no findings/ folders")
    return ap


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return _child_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.devices < 1:
        print(f"error: --devices {args.devices}: pass a whole number >= 1", file=sys.stderr)
        return 2
    try:
        run = run_bundle(args.bundle, report_dir=args.report, devices=args.devices, findings=not args.no_findings)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_table(run.summary)
    c = run.counts
    print(f"export bundle: jax {run.exporter.get('jax', '?')} exported, jax {run.runner['jax']} ran: "
          f"{c['programs']} programs, {c['agree']} agree, {c['disagree']} disagree, {c['error']} error, "
          f"{c['outside-window']} outside the window" + (f", {c['rejected']} rejected (sha256)" if c["rejected"] else "")
          + (f"; {c['exporters-own']} of the disagreements and errors the exporting JAX has on its own round trip "
             "too (not cross-version)" if c["exporters-own"] else ""))
    for f in run.findings:
        print(f"finding {f.number:03d} [{f.stage}] {f.op}: {f.error} ({f.count}x): {f.folder}")
    print(f"report: {run.report_dir}/{RUN_RECORD}, results.jsonl, junit.xml, report.html")
    return 0 if run.ok else 1


if __name__ == "__main__":
    sys.exit(main())
