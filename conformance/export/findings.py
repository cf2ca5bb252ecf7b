"""A cross-version failure, ready to file: one folder per distinct disagreement or error inside the window.

``OUT/findings/NNN-cross-version-STAGE/`` holds, as a hunt's findings do (`conformance.findings`):

* ``finding.json``: the record (`conformance.findings.Finding`): signature (stage, op, error
  class), how many programs of the bundle failed that way, the first one, its root cause;
* ``exported.bin``, ``inputs.npz``, ``expected.npz``, ``module.mlir``: the first failing
  program's files, copied from the bundle;
* ``upstream.py``: a script needing only JAX and NumPy that deserializes ``exported.bin``, calls
  it on the same mesh and checks each output against ``expected.npz`` (exit 1 on a difference);
* ``UPSTREAM.md``: the issue body: exporting and running versions, what differed, the program
  source, how to run the script.

Programs outside the compatibility window are never findings, nor are failures the exporting JAX
has on its own round trip too (`conformance.export.run.ProgramOutcome.exporters_own`). ``findings/CAUSES.md`` groups the
findings by root cause (`conformance.findings.write_causes`).
"""
from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np

from conformance.export.bundle import FILES
from conformance.findings import Finding, write_causes, write_record
from conformance.upstream.causes import cause_key

__all__ = ["SCRIPT", "write"]

SCRIPT = '''"""{title}

Exported with jax {ejax} (jaxlib {ejaxlib}), run here with whatever JAX is installed; needs only
JAX and NumPy. Exit 1 when an output differs from refsim's expected value.
"""
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count={ndev}")
import numpy as np
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE, NAMES, IDS, AXIS_TYPES = {shape!r}, {names!r}, {ids!r}, {types!r}
IN_SPECS, OUT_SPECS = {in_specs!r}, {out_specs!r}
POLICIES = {policies!r}   # per output: ("exact", 0) | ("abs", b): within 2b | ("rel", r): r x max|expected|


def spec(entries):
    return P(*[tuple(e) if isinstance(e, list) else e for e in entries])


def run():
    with open(os.path.join(HERE, "exported.bin"), "rb") as fh:
        exp = jax.export.deserialize(bytearray(fh.read()))
    by_id = {{d.id: d for d in jax.devices()}}
    devices = np.array([by_id[i] for i in np.ravel(IDS)], dtype=object).reshape(SHAPE)
    mesh = Mesh(devices, NAMES, axis_types=tuple(getattr(jax.sharding.AxisType, t) for t in AXIS_TYPES))
    with np.load(os.path.join(HERE, "inputs.npz"), allow_pickle=False) as z:
        args = [jax.device_put(z[f"arg{{i}}"], NamedSharding(mesh, spec(s))) for i, s in enumerate(IN_SPECS)]
    with jax.set_mesh(mesh):
        return [np.asarray(o) for o in jax.tree_util.tree_leaves(exp.call(*args))]


def check(outs):
    failures = []
    with np.load(os.path.join(HERE, "expected.npz"), allow_pickle=False) as z:
        want = [z[f"out{{k}}"] for k in range(len(POLICIES))]
    if len(outs) != len(want):
        return [f"{{len(outs)}} outputs, refsim has {{len(want)}}"]
    for k, (got, exp, (kind, value)) in enumerate(zip(outs, want, POLICIES)):
        if got.shape != exp.shape or got.dtype != exp.dtype:
            failures.append(f"output {{k}}: {{got.dtype}}{{list(got.shape)}}, refsim {{exp.dtype}}{{list(exp.shape)}}")
            continue
        if kind == "exact" or exp.dtype.kind not in "fc":
            same = (got == exp) | ((got != got) & (exp != exp))
        else:
            g, e = got.astype(np.float64), exp.astype(np.float64)
            scale = max(float(np.max(np.abs(e[np.isfinite(e)]), initial=0.0)), 1.0)
            bound = 2 * value if kind == "abs" else value * scale
            same = (np.abs(g - e) <= bound) | (np.isnan(g) & np.isnan(e)) | (g == e)
        if not np.all(same):
            i = tuple(int(x) for x in np.argwhere(~same)[0])
            failures.append(f"output {{k}}: {{int(np.sum(~same))}} of {{same.size}} elements differ; first at "
                            f"{{i}}: refsim {{exp[i].item()!r}}, jax {{got[i].item()!r}} (policy {{kind}} {{value}})")
    return failures


if __name__ == "__main__":
    failures = check(run())
    if failures:
        print(f"MISMATCH (jax {{jax.__version__}} running an export of jax {ejax}):")
        print("\\n".join(failures))
        sys.exit(1)
    print(f"OK: every output matches refsim (jax {{jax.__version__}} running an export of jax {ejax})")
'''


def _issue(title: str, f: Finding, entry: dict, exporter: dict, runner: dict, outcome, count: int) -> str:
    src = entry.get("source", "").rstrip()
    return f"""# {title}

A program exported with `jax.export` (with shardings) under one JAX, serialized, then deserialized
and run under another, gives a result that differs from the program's value, inside the
compatibility window both versions document (StableHLO artifact v{entry.get('stablehlo_version')},
calling convention {entry.get('calling_convention_version')}).

| | exported by | run by |
|---|---|---|
| jax | {exporter.get('jax')} | {runner.get('jax')} |
| jaxlib | {exporter.get('jaxlib')} | {runner.get('jaxlib')} |
| python | {exporter.get('python')} | {runner.get('python')} |
| StableHLO (current) | {exporter.get('stablehlo', {}).get('current')} | {runner.get('stablehlo', {}).get('current')} |
| calling conventions | {exporter.get('calling_convention')} | {runner.get('calling_convention')} |

Platform: {runner.get('platform')} with {runner.get('devices')} devices. {count} program(s) of the bundle
failed this way; this is the first (`{entry.get('case_id')}`).

## What happened

```text
{outcome.message}
{outcome.report.rstrip()}
```

## Reproduce

The folder holds the serialized artifact (`exported.bin`), the inputs (`inputs.npz`) and the
expected outputs (`expected.npz`, refsim's values from the exporter's jaxpr). With jax
{runner.get('jax')} installed:

```bash
python upstream.py
```

Mesh {dict(zip(entry['mesh']['names'], entry['mesh']['shape']))}, device ids
{entry['mesh']['device_ids']}, axis types {entry['mesh'].get('axis_types')}, exported under the
{entry.get('partitioner')} partitioner; in specs {entry['in_specs']}, out specs {entry['out_specs']}.

## The program (as exported by jax {exporter.get('jax')})

```python
{src}
```
"""


def write(report_dir: str, bundle, entries: dict, outcomes: list, runner: dict) -> list:
    """Write one folder per distinct (stage, op, error) signature among the `outcomes` that
    disagreed or erred inside the window where the exporter's own round trip agreed; return their
    `Finding` records."""
    failing = [p for p in outcomes if p.outcome in ("disagree", "error") and p.signature and not p.exporters_own]
    if not failing:
        return []
    root = os.path.join(report_dir, "findings")
    os.makedirs(root, exist_ok=True)
    found: dict = {}
    for p in failing:
        sig = tuple(p.signature)
        if sig in found:
            found[sig][0].count += 1
            continue
        stage, op, error = sig
        number = len(found) + 1
        folder = os.path.join(root, re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{number:03d}-{stage}")[:80])
        os.makedirs(folder, exist_ok=True)
        f = Finding(stage, op, error, 1, f"{p.id} {p.case_id}", "fail" if p.outcome == "disagree" else "error",
                    path=os.path.join(folder, "upstream.py"), message=p.message, number=number, folder=folder,
                    cause=cause_key(stage, op, error, text=p.message, op_patterns=()))
        found[sig] = (f, p)
    for f, p in found.values():
        entry = entries[p.id]
        for k, name in FILES.items():
            shutil.copyfile(os.path.join(bundle.path, entry["files"][k]["path"]), os.path.join(f.folder, name))
        m = entry["mesh"]
        title = (f"jax.export: an artifact of jax {bundle.exporter.get('jax')} run by jax {runner.get('jax')} "
                 f"{'gives wrong values' if p.outcome == 'disagree' else 'raises'} ({f.op})")
        script = SCRIPT.format(title=title, ejax=bundle.exporter.get("jax"), ejaxlib=bundle.exporter.get("jaxlib"),
                               ndev=max(8, int(np.max(np.asarray(m["device_ids"]))) + 1),
                               shape=tuple(m["shape"]), names=tuple(m["names"]), ids=m["device_ids"],
                               types=tuple(m.get("axis_types") or ["Auto"] * len(m["shape"])),
                               in_specs=entry["in_specs"], out_specs=entry["out_specs"],
                               policies=[tuple(x) for x in entry["policies"]])
        with open(os.path.join(f.folder, "upstream.py"), "w", encoding="utf-8") as fh:
            fh.write(script)
        with open(os.path.join(f.folder, "UPSTREAM.md"), "w", encoding="utf-8") as fh:
            fh.write(_issue(title, f, entry, bundle.exporter, runner, p, f.count))
        f.note = f"exported by jax {bundle.exporter.get('jax')}, run by jax {runner.get('jax')}"
        write_record(f)
    records = [f for f, _ in found.values()]
    write_causes(root, records)
    with open(os.path.join(root, "findings.json"), "w", encoding="utf-8") as fh:
        json.dump([{"number": f.number, "signature": list(f.signature), "count": f.count, "folder": f.folder}
                   for f in records], fh, indent=1)
    return records

