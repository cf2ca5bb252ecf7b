"""Render the tables of docs/hardware.md ("Measured on") from an unpacked scripts/gpu_check.sh output.

    tar xzf gpu-check.tar.gz -C DIR && python scripts/gpu_tables.py DIR

Prints Markdown: the run's counts by suite and status, XLA:GPU's and XLA:CPU's ulp distance from
correctly rounded per transcendental (bench.accuracy on the GPU machine, both platforms), the
oracle rows (scripts/gpu_oracle.py) and the plain-JAX probes (scripts/gpu_confirm.py) side by side.
"""
from __future__ import annotations

import collections
import json
import pathlib
import re
import sys


def _jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def run_table(d: pathlib.Path) -> str:
    records = _jsonl(d / "report" / "results.jsonl")
    counts, examples = collections.Counter(), collections.Counter()
    summary = next((r for r in records if r.get("type") == "summary"), {})
    for r in records:
        if r.get("type") == "case":
            counts[(r["suite"], r["status"])] += 1
            examples[r["suite"]] += r["examples"]
    statuses = [s for s in ("pass", "fail", "error", "timeout", "xfail", "xpass", "unsupported")
                if any(k[1] == s for k in counts)]
    out = ["| suite | " + " | ".join(statuses) + " | examples |", "|---" * (len(statuses) + 2) + "|"]
    for suite in sorted(examples):
        out.append(f"| {suite} | " + " | ".join(str(counts[(suite, s)]) for s in statuses) + f" | {examples[suite]} |")
    out.append(f"\n{summary.get('cases', '?')} cases, {sum(examples.values())} examples in "
               f"{summary.get('wall_seconds', float('nan')):.1f} s; verdict "
               f"{'AGREE' if summary.get('ok') else 'DISAGREE'}")
    return "\n".join(out)


def accuracy_table(d: pathlib.Path) -> str:
    gpu = {(r["op"], r["dtype"]): r for r in _jsonl(d / "accuracy_cuda.jsonl")}
    cpu = {(r["op"], r["dtype"]): r for r in _jsonl(d / "accuracy_cpu.jsonl")}
    out = ["| op | XLA:GPU f32 ulp (mixed) | XLA:CPU f32 ulp (mixed) | XLA:GPU f64 ulp from refsim | "
           "XLA:CPU f64 ulp from refsim | f32 subnormal results GPU / CPU |", "|---|---|---|---|---|---|"]
    for (op, dt), g in gpu.items():
        c = cpu.get((op, dt))
        if dt != "float32" or c is None:
            continue
        g64, c64 = gpu.get((op, "float64"), {}), cpu.get((op, "float64"), {})
        out.append(f"| {op} | {g['xla_vs_correct_ulp']:.0f} ({g['xla_vs_correct_mixed']:.1f}) | "
                   f"{c['xla_vs_correct_ulp']:.0f} ({c['xla_vs_correct_mixed']:.1f}) | "
                   f"{g64.get('refsim_vs_xla_ulp', float('nan')):.0f} | {c64.get('refsim_vs_xla_ulp', float('nan')):.0f} | "
                   f"{g['subnormal_disagreements']} / {c['subnormal_disagreements']} |")
    return "\n".join(out)


def oracle_table(d: pathlib.Path) -> str:
    cpu = {(r["program"], r["dtype"]): r for r in _jsonl(d / "oracle_cpu.jsonl")}
    out = ["| program | dtype | XLA:GPU | worst \\|diff\\| / allowed (GPU) | XLA:CPU |", "|---|---|---|---|---|"]
    for r in _jsonl(d / "oracle_cuda.jsonl"):
        w = r.get("worst") or {}
        c = cpu.get((r["program"], r["dtype"]), {})
        note = " (TF32 note)" if r.get("notes") else ""
        out.append(f"| {r['program']} | {r['dtype']} | {r['verdict']}{note} | "
                   f"{w.get('max_abs_diff', float('nan')):.3g} / {w.get('allowed', float('nan')):.3g} | "
                   f"{c.get('verdict', '-')} |")
    return "\n".join(out)


def probe_table(d: pathlib.Path) -> str:
    def rows(name):
        path = d / name
        lines = path.read_text().splitlines()[1:] if path.exists() else []
        parts = [re.split(r"\s{2,}", ln.strip()) for ln in lines if ln.strip()]
        return {p[0]: p[1].split()[0] for p in parts if len(p) > 1}
    gpu, cpu = rows("confirm.txt"), rows("confirm_cpu.txt")
    out = ["| probe (plain JAX, scripts/gpu_confirm.py) | XLA:GPU | XLA:CPU |", "|---|---|---|"]
    for k, v in gpu.items():
        if k:
            name = k.replace("|", "\\|")
            out.append(f"| {name} | {v} | {cpu.get(k, '-')} |")
    return "\n".join(out)


def main(argv=None) -> int:
    d = pathlib.Path((argv or sys.argv[1:] or ["."])[0])
    for title, fn in (("Run", run_table), ("Accuracy", accuracy_table), ("Oracle", oracle_table),
                      ("Probes", probe_table)):
        print(f"### {title}\n\n{fn(d)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
