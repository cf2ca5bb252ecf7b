"""Writing one finding's upstream report: ``upstream.py`` and ``UPSTREAM.md`` (see the package).

`write(folder, case, ...)` computes refsim's global outputs, chooses how the script gets its
expected values (the same program on one device, confirmed against refsim in a fresh process;
else refsim's values written in), writes the script, runs it under every partitioner the
installed JAX has (`conformance.upstream.runs.run_script`), matches the failure against
docs/found-bugs.md (`conformance.upstream.known.match`) and writes the issue body.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform as _platform
import subprocess
import sys
import tempfile
from importlib.metadata import version

import numpy as np

import refsim
from conformance.upstream import known as known_mod
from conformance.upstream.runs import Outcome, run_script
from conformance.upstream.script import manual_ops, script_text, tolerances_of
from conformance.verdict.compare import as_outputs
from refsim import compat

__all__ = ["UpstreamReport", "versions", "write"]

SCRIPT = "upstream.py"
ISSUE = "UPSTREAM.md"
_NAMES = {"shardy": "Shardy", "gspmd": "GSPMD"}
_VERB = {"trace": "tracing", "lowering": "lowering", "compile": "compiling", "runtime": "running", "xla": "compiling",
         "crash": "compiling", "hang": "compiling"}


@dataclasses.dataclass
class UpstreamReport:
    """What `write` wrote and found: the script and issue paths, how the expected values were
    computed, each partitioner's outcome, and the known bug (docs/found-bugs.md) if it is one."""

    script: str
    issue: str
    title: str
    expected: str
    outcomes: dict
    failing: list
    known: known_mod.Match | None = None
    resembles: known_mod.Match | None = None   # a weaker hint for a new finding (`known.resembles`)
    devices: int = 0
    ops: list = dataclasses.field(default_factory=list)
    op_lines: int = 0   # the program's op lines (sharding constraints included)

    @property
    def reproduces(self) -> bool:
        return bool(self.failing)

    def to_json(self) -> dict:
        return {"script": self.script, "issue": self.issue, "title": self.title, "expected": self.expected,
                "outcomes": {p: o.to_json() for p, o in self.outcomes.items()}, "failing": self.failing,
                "reproduces": self.reproduces, "devices": self.devices, "ops": self.ops, "op_lines": self.op_lines,
                "known": None if self.known is None else dataclasses.asdict(self.known),
                "resembles": None if self.resembles is None else dataclasses.asdict(self.resembles)}


def versions() -> dict:
    out = {"python": _platform.python_version()}
    for pkg in ("jax", "jaxlib", "numpy"):
        try:
            out[pkg] = version(pkg)
        except Exception:  # noqa: BLE001 - a package without metadata: say so
            out[pkg] = "?"
    return out


def _global_outputs(case):
    """refsim's global value of every output, or (None, why) when refsim cannot run it."""
    try:
        return [np.asarray(a) for a in as_outputs(case.run(refsim))], ""
    except Exception as e:  # noqa: BLE001 - a program refsim cannot evaluate still gets its script
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _confirm(script: str, values: list, timeout: float) -> tuple[bool, str]:
    """Whether the script's ``expected()`` (one device) agrees with refsim's `values`, in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="upstream-confirm-") as tmp:
        npz = os.path.join(tmp, "values.npz")
        np.savez(npz, **{f"out{k}": v for k, v in enumerate(values)})
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
        try:
            p = subprocess.run([sys.executable, "-m", "conformance.upstream.helper", "confirm", script, npz],
                               capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp)
        except subprocess.TimeoutExpired:
            return False, "the one-device run timed out"
    line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("CONFIRM ")), None)
    if line is None:
        last = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        return False, f"the one-device run failed: {last[:300]}"
    doc = json.loads(line[len("CONFIRM "):])
    return bool(doc["agree"]), "; ".join(doc["differences"])[:600]


_READABLE = {"pad_neg_interior": "a pad with a negative edge and interior padding", "jnp_pad": "jnp.pad",
             "at_get": "x.at[i].get", "any_all": "jnp.any / jnp.all", "tile_repeat": "jnp.tile / jnp.repeat",
             "tril_triu": "jnp.tril / jnp.triu", "unreduced_sum": "a sum into an unreduced sharding",
             "unreduced_add": "arithmetic on unreduced (and reduced) values",
             "reduced_dot": "a matmul with a reduced weight"}


def _readable(op: str) -> str:
    """An op of the strategy's table in words a JAX engineer knows."""
    if op in _READABLE:
        return _READABLE[op]
    if op.startswith("shard_map_"):
        return f"a shard_map with {op[len('shard_map_'):]}"
    if op.startswith("scatter_"):
        return f"x.at[i].{op[len('scatter_'):]}"
    return op


def _ops_text(case) -> str:
    ops = [op for op in dict.fromkeys(op for op, _ in case.op_patterns)]
    core = [op for op in ops if op not in ("with_sharding_constraint", "reshard")] or ops or ["identity"]
    text = " + ".join(map(_readable, core))
    if case.transform in ("grad", "vjp"):
        text = f"the {'gradient' if case.transform == 'grad' else 'pullback (vjp)'} of {text}"
    elif case.transform == "vmap":
        text = f"jax.vmap of {text}"
    return text


def _title(stage: str, case, outcome: Outcome | None, failing: list) -> str:
    who = " and ".join(_NAMES[p] for p in failing) if failing else _NAMES.get(case.partitioner, case.partitioner)
    what = _ops_text(case)
    what = what[:1].upper() + what[1:]
    where = f"sharded over {case.mesh.size} devices ({who})"
    if outcome is None or outcome.kind == "passes":
        return f"{what}, {where}"
    if outcome.kind == "wrong-values":
        return f"{what}: wrong values when {where}"
    if outcome.kind == "aborts":
        check = outcome.fatal_line.split("] ", 1)[-1].strip() if outcome.fatal_line else "a fatal error"
        return f"{what}: XLA aborts compiling it {where}: {check[:120]}"
    if outcome.kind == "raises":
        first = outcome.message.strip().splitlines()[0] if outcome.message.strip() else ""
        return f"{what}: {outcome.cls} {_VERB.get(stage, 'compiling')} it {where}: {first[:120]}"
    return f"{what}: {outcome.describe()} {where}"


def write(folder: str, case, *, number: int, stage: str, stage_record: dict | None = None, platform: str = "cpu",
          timeout: float = 300.0, bugs=None, found_with: str = "") -> UpstreamReport:
    """Write ``upstream.py`` and ``UPSTREAM.md`` for `case` (a shrunk `ShardedProgram`) into
    `folder` and return what was found. stage: the hunt's signature stage (``crash``,
    ``compile``, ``mismatch:compiler``, ...); stage_record: `explain`'s record for a mismatch."""
    os.makedirs(folder, exist_ok=True)
    script = os.path.join(folder, SCRIPT)
    vers = versions()
    values, refsim_error = _global_outputs(case)
    tol = tolerances_of(case, values)
    title0 = f"Finding {number:03d} of a sharded-program hunt: {stage}"
    about = (f"A random sharded program{(' (' + found_with + ')') if found_with else ''}, shrunk; found on jax "
             f"{vers['jax']} / jaxlib {vers['jaxlib']}, XLA:{platform.upper()}, {case.mesh.size} devices.")
    manual = manual_ops(case)
    if manual or values is None:
        mode = "one-device (unconfirmed: refsim could not run the program: " + refsim_error + ")" \
            if values is None else ("refsim's values (its shard_map is manual over a mesh axis of size > 1: one "
                                    "device would run another program)")
    else:
        mode = "one-device"
    kind = "embedded" if values is not None and manual else "one-device"

    def emit(kind_, why=""):
        with open(script, "w", encoding="utf-8") as fh:
            fh.write(script_text(case, title=title0, about=about, expected=kind_, values=values, why=why,
                                 tolerance=tol, platform=platform))

    emit(kind)
    if kind == "one-device" and values is not None:
        agree, diff = _confirm(script, values, timeout)
        if agree:
            mode = "one-device (the same program jitted on one device; it agrees with refsim)"
        else:
            mode = f"refsim's values (the same program on one device disagrees with them: {diff})"
            emit("embedded", "The program's global outputs, computed by refsim (a NumPy reference interpreter of JAX "
                             "programs). The same program jitted on one device gives other values here: "
                             + diff.replace('"""', "'''")[:300])
    outcomes = {p: run_script(script, p, timeout=timeout) for p in compat.partitioners()}
    failing = [p for p, o in outcomes.items() if o.fails]
    first = outcomes.get(case.partitioner) if outcomes.get(case.partitioner, None) is not None and \
        outcomes[case.partitioner].fails else next((o for o in outcomes.values() if o.fails), None)
    bugs = known_mod.load() if bugs is None else bugs
    match = None
    if first is not None:
        text = first.fatal_line if first.kind == "aborts" else first.message
        match = known_mod.match(bugs, version=vers["jax"], kind=first.kind, text=text, cls=first.cls,
                                ops=[op for op, _ in case.op_patterns], transform=case.transform,
                                partitioner=first.partitioner)
    like = None
    if first is not None and first.kind == "wrong-values" and match is None:
        like = known_mod.resembles(bugs, version=vers["jax"], ops=[op for op, _ in case.op_patterns],
                                   transform=case.transform)
    title = _title(stage, case, first, failing)
    report = UpstreamReport(script, os.path.join(folder, ISSUE), title, mode, outcomes, failing, match, like,
                            int(case.mesh.size), list(dict.fromkeys(op for op, _ in case.op_patterns)),
                            len(case.op_patterns))
    with open(report.issue, "w", encoding="utf-8") as fh:
        fh.write(issue_text(report, case, stage=stage, stage_record=stage_record, vers=vers, platform=platform,
                            number=number))
    return report


def _tracker(stage: str, stage_record: dict | None) -> str:
    diverged = (stage_record or {}).get("diverged_in") or stage.split(":", 1)[-1]
    if diverged in ("trace", "lowering"):
        return "jax-ml/jax (JAX's tracing or lowering)"
    if diverged == "backend" or stage == "runtime":
        return "openxla/xla (XLA:CPU's code generation or runtime)"
    return "openxla/xla (XLA's SPMD partitioner; Shardy is openxla/shardy)"


def issue_text(r: UpstreamReport, case, *, stage: str, stage_record: dict | None, vers: dict, platform: str,
               number: int) -> str:
    """The issue body (Markdown) of report `r`."""
    with open(r.script, encoding="utf-8") as fh:
        src = fh.read()
    triage = "new" if r.known is None else r.known.text()
    if r.known is None and r.resembles is not None:
        triage += f" (resembles found-bugs {r.resembles.number}: {r.resembles.why}; compare before filing)"
    lines = [f"<!-- triage (not for the issue): finding {number:03d}, {stage}; {triage}; file at "
             f"{_tracker(stage, stage_record)} -->", "", f"# {r.title}", ""]
    first = next((r.outcomes[p] for p in r.failing), None)
    where = " and ".join(_NAMES[p] for p in r.failing)
    ok = [_NAMES[p] for p, o in r.outcomes.items() if not o.fails]
    if first is None:
        lines += ["**This script does not reproduce the failure the hunt saw** (it passes under "
                  f"{', '.join(ok)}); do not file it as is. The hunt's record: `{stage}`.", ""]
    else:
        lines += ["## What happens", "",
                  f"`jax.jit` of the program below, with its inputs and outputs sharded over a {case.mesh.size}-device "
                  f"mesh, on XLA:{platform.upper()} with {where}"
                  + (f" (with {' and '.join(ok)} it is right)" if ok else "") + ":", ""]
        if first.kind == "wrong-values":
            lines += ["returns wrong values. The script's check (first differing elements per device):", "", "```text"]
            lines += [ln for ln in first.stdout.splitlines()[1:] if ln.strip()][:8] + ["```", ""]
        elif first.kind == "aborts":
            lines += ["aborts the process while compiling:", "", "```text", first.fatal_line or "(no fatal line)",
                      "```", ""]
        elif first.kind == "raises":
            msg = "\n".join(first.message.strip().splitlines()[:6])
            lines += [f"raises `{first.cls}`:", "", "```text", msg[:1500], "```", ""]
        else:
            lines += [first.describe(), ""]
        lines += ["## Expected", ""]
        if r.expected.startswith("one-device"):
            lines += ["The values the same program gives when jitted on one device (every mesh axis of size 1, so "
                      "nothing is split), which the script computes itself"
                      + (" and which agree with a NumPy reference interpreter of the program (refsim)" if
                         "agrees" in r.expected else "") + ". Sharding should not change them"
                      + (" beyond the tolerance the script states per output (float reductions may round "
                         "differently)" if any(o[0] != "exact" for o in case.policies) else " (bit for bit)") + "."]
        else:
            lines += [f"The program's values as computed by refsim, a NumPy reference interpreter of JAX programs, "
                      f"written into the script ({r.expected.split('(', 1)[-1].rstrip(')')})."]
        if first.kind != "wrong-values":
            lines[-1] += " The program is valid: it traces, and the same program compiles and runs on one device."
        lines += [""]
    if stage_record and stage_record.get("diverged_in"):
        said = {"lowered": "JAX's lowered StableHLO module", "compiled": "XLA's compiled (partitioned) per-device "
                "module", "executed": "XLA:CPU's execution of that module"}
        stages = stage_record.get("stages") or {}
        seen = "; ".join(f"{said.get(k, k)} {'agrees' if v else 'differs'}" for k, v in stages.items() if v is not None)
        lines += ["## Where it goes wrong", "",
                  "Evaluating each stage on virtual devices with a NumPy interpreter of StableHLO (refsim's `explain`, "
                  "on the program before its last cuts): the values first differ at the "
                  f"**{stage_record['diverged_in']}** stage"
                  + (f", at `{stage_record['op']}`" if stage_record.get("op") else "") + (f" ({seen})" if seen else "")
                  + ".", ""]
    lines += ["## Reproducer", "", f"Plain JAX and NumPy; it sets its own device count ({r.devices} XLA:CPU devices). "
              "Run `python upstream.py shardy` and `python upstream.py gspmd`.", "", "```python", src.rstrip(), "```",
              "", "## Partitioners", "", "| partitioner | result |", "|---|---|"]
    for p, o in r.outcomes.items():
        flag = f"`jax_use_shardy_partitioner={p == 'shardy'}`"
        lines.append(f"| {_NAMES[p]} ({flag}) | {o.describe().replace('|', '/')} |")
    lines += ["", "## Versions", "", f"- jax {vers['jax']}, jaxlib {vers['jaxlib']}, NumPy {vers['numpy']}, "
              f"Python {vers['python']}", f"- XLA:{platform.upper()}, {r.devices} virtual host devices "
              "(`--xla_force_host_platform_device_count`)",
              f"- found by a random sharded-program generator (refsim's `python -m conformance hunt`) and shrunk "
              f"to {r.op_lines} op(s) on {r.devices} device(s)", ""]
    return "\n".join(lines)
