"""The cross-version export matrix: every installed JAX exports, every installed JAX runs.

    python scripts/export_matrix.py [--programs 20] [--seed 0] [--out export-bundles/matrix]
                                    [--venvs .venv,.venv312,...] [--doc docs/export.md]

Each Python environment of the checkout (``.venv*/bin/python``: the project installed with one
JAX each; ``--venvs`` names them) exports a bundle of ``--programs`` sharded programs with
``python -m conformance export-bundle`` (the same ``--seed``: the same draws, where the JAX
versions draw alike), and every environment runs every bundle with ``python -m conformance
run-bundle`` (both directions, and each version its own). Printed: the matrix, exported by (rows)
× run by (columns), each cell the programs, agree, disagree, error and outside-window counts,
then each cell's findings. ``--doc`` rewrites the block between ``<!-- export-matrix:begin -->``
and ``<!-- export-matrix:end -->`` of that page with the matrix, the command, the commit and the
machine. The bundles and run reports stay under ``--out`` (git-ignored); ``matrix.json`` there
holds every cell's counts and findings.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- export-matrix:begin -->", "<!-- export-matrix:end -->"
COLUMNS = ("programs", "agree", "disagree", "error", "outside-window")


def _run(cmd, timeout=1800) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def jax_version(python: str) -> str | None:
    """The JAX an environment's Python imports, or None when it has no JAX or no project."""
    p = _run([python, "-c", "import jax, conformance.export.run; print(jax.__version__)"], timeout=300)
    return p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else None


def _key(version: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in version.split("."))


def environments(names=None) -> list:
    """[(venv name, python, jax version)] sorted by JAX version, of the environments that have both."""
    paths = [os.path.join(ROOT, n) for n in names] if names else sorted(glob.glob(os.path.join(ROOT, ".venv*")))
    found = []
    for path in paths:
        python = os.path.join(path, "bin", "python")
        if os.path.exists(python):
            v = jax_version(python)
            if v is not None:
                found.append((os.path.basename(path), python, v))
            else:
                print(f"skipping {os.path.basename(path)}: no JAX or no project installed", file=sys.stderr)
    return sorted(found, key=lambda e: _key(e[2]))


def _tail(p) -> str:
    lines = [ln for ln in (p.stderr or "").splitlines() + (p.stdout or "").splitlines()
             if ln.strip() and not ln.startswith("W")]
    return lines[-1][:300] if lines else f"exit status {p.returncode}"


def matrix(envs, *, programs: int, seed: int, out: str) -> dict:
    """Export with each environment, run each bundle with each; the cells' counts and findings."""
    if os.path.isdir(out):
        shutil.rmtree(out)   # the matrix folder is this script's own (under the git-ignored export-bundles/)
    os.makedirs(out)
    exports, cells = {}, {}
    for name, python, version in envs:
        bundle = os.path.join(out, f"jax{version}")
        p = _run([python, "-m", "conformance", "export-bundle", "--out", bundle, "--programs", str(programs),
                  "--seed", str(seed)])
        manifest = os.path.join(bundle, "manifest.json")
        if p.returncode != 0 or not os.path.exists(manifest):
            exports[version] = {"venv": name, "ok": False, "why": _tail(p)}
            print(f"jax {version} ({name}) could not export: {_tail(p)}", file=sys.stderr)
            continue
        with open(manifest, encoding="utf-8") as fh:
            doc = json.load(fh)
        exports[version] = {"venv": name, "ok": True, "bundle": bundle, "programs": len(doc["programs"]),
                            "skipped": len(doc["skipped"]), "exporter": doc["exporter"],
                            "own_failures": [[e["id"], e["exporter_run"]["outcome"], e["exporter_run"]["message"]]
                                             for e in doc["programs"]
                                             if (e.get("exporter_run") or {}).get("outcome", "agree") != "agree"]}
        print(f"jax {version} ({name}) exported {len(doc['programs'])} programs "
              f"({len(doc['skipped'])} drawn programs skipped)", file=sys.stderr)
    for exp_version, ex in exports.items():
        if not ex["ok"]:
            continue
        for name, python, version in envs:
            report = os.path.join(out, f"jax{exp_version}", f"run-jax{version}")
            p = _run([python, "-m", "conformance", "run-bundle", ex["bundle"], "--report", report])
            record = os.path.join(report, "export-run.json")
            if p.returncode not in (0, 1) or not os.path.exists(record):
                cells[(exp_version, version)] = {"failed": _tail(p)}
                print(f"{exp_version} -> {version}: run-bundle failed: {_tail(p)}", file=sys.stderr)
                continue
            with open(record, encoding="utf-8") as fh:
                doc = json.load(fh)
            cells[(exp_version, version)] = {
                "counts": doc["counts"], "findings": doc["findings"], "runner": doc["runner"],
                "outside": sorted({w for pr in doc["programs"] for w in pr["outside"]}),
                "ran_outside": {k: sum(1 for pr in doc["programs"] if pr["outcome"] == "outside-window"
                                       and pr["ran"] == k) for k in ("agree", "disagree", "error")}}
            print(f"{exp_version} -> {version}: {_cell(cells[(exp_version, version)])}", file=sys.stderr)
    return {"versions": [v for _, _, v in envs], "venvs": {v: n for n, _, v in envs}, "exports": exports,
            "cells": {f"{a} -> {b}": c for (a, b), c in cells.items()}, "programs": programs, "seed": seed}


def _cell(cell: dict) -> str:
    if "failed" in cell:
        return f"run failed: {cell['failed']}"
    c = cell["counts"]
    text = f"{c['programs']} / {c['agree']} / {c['disagree']} / {c['error']} / {c['outside-window']}"
    extra = [f"{c['exporters-own']} own" if c.get("exporters-own") else "",
             f"{c['rejected']} rejected" if c.get("rejected") else ""]
    return text + (f" ({', '.join(x for x in extra if x)})" if any(extra) else "")


def table(result: dict) -> str:
    """The matrix as a Markdown table: exported by (rows) × run by (columns)."""
    versions = result["versions"]
    found = sum(len(c.get("findings", ())) for c in result["cells"].values())
    lines = ["Each cell: programs / agree / disagree / error / outside-window; \"own\": of the disagreements and "
             "errors, those the exporting JAX has on its own round trip too (not cross-version). Cross-version "
             f"findings (inside the window, the exporter's own round trip agreeing): {found}.", "",
             "| exported by ↓ · run by → | " + " | ".join(f"jax {v}" for v in versions) + " |",
             "|---|" + "---|" * len(versions)]
    for a in versions:
        ex = result["exports"].get(a, {})
        if not ex.get("ok"):
            lines.append(f"| jax {a} | " + " | ".join(["not exported"] * len(versions))
                         + f" |\n\njax {a} could not export: {ex.get('why', '?')}\n")
            continue
        lines.append(f"| jax {a} | " + " | ".join(_cell(result["cells"][f"{a} -> {b}"]) for b in versions) + " |")
    return "\n".join(lines)


def notes(result: dict) -> str:
    """Per cell: why programs are outside the window (and what they did anyway), and the findings."""
    out = []
    for version, ex in result["exports"].items():
        for pid, outcome, message in ex.get("own_failures", ()):
            out.append(f"* jax {version}'s own round trip of its {pid}: {outcome}: {message[:160]}")
    for key, cell in result["cells"].items():
        if "failed" in cell:
            continue
        if cell["outside"]:
            ran = cell["ran_outside"]
            out.append(f"* {key}: outside the window: {'; '.join(cell['outside'])}. Run anyway: {ran['agree']} "
                       f"agreed, {ran['disagree']} disagreed, {ran['error']} raised.")
        own = cell["counts"].get("exporters-own", 0)
        if own:
            out.append(f"* {key}: {own} of the disagreements and errors happen in the exporting JAX's own round "
                       "trip too: not cross-version differences.")
        for f in cell["findings"]:
            out.append(f"* {key}: finding [{f['stage']}] {f['op']}: {f['error']} ({f['count']} program(s))")
    return "\n".join(out) or "* no program outside the window, no finding."


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count()
    return f"{platform.system()} {platform.machine()}, {cpu}, {cores} CPU cores"


def commit() -> str:
    p = _run(["git", "rev-parse", "--short=12", "HEAD"], timeout=30)
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], timeout=30).stdout.strip()
    return (p.stdout.strip() or "unknown") + (" (with uncommitted changes)" if dirty else "")


def block(result: dict, argv: list) -> str:
    cmd = shlex.join(["python", "scripts/export_matrix.py", *argv])
    return "\n".join([
        BEGIN,
        f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC at commit {commit()} on "
        f"{machine()} (CPU platform, 8 virtual devices), {result['programs']} programs per exporter, seed "
        f"{result['seed']}; environments: "
        + ", ".join(f"`{n}` (jax {v})" for v, n in result["venvs"].items()) + ". Regenerate with:", "",
        "```bash", cmd, "```", "", table(result), "", notes(result), END])


def write_doc(path: str, text: str) -> None:
    with open(path, encoding="utf-8") as fh:
        page = fh.read()
    if BEGIN not in page or END not in page:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} block to rewrite")
    head, rest = page.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(head + text + tail)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join("export-bundles", "matrix"))
    ap.add_argument("--venvs", help="comma-separated environment folders (default: every .venv* of the checkout)")
    ap.add_argument("--doc", help="a page whose export-matrix block to rewrite (docs/export.md)")
    args = ap.parse_args(argv)
    if args.programs < 1:
        ap.error("--programs must be >= 1")
    envs = environments(args.venvs.split(",") if args.venvs else None)
    if not envs:
        print("error: no environment with JAX and this project", file=sys.stderr)
        return 2
    result = matrix(envs, programs=args.programs, seed=args.seed, out=os.path.join(ROOT, args.out))
    with open(os.path.join(ROOT, args.out, "matrix.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    text = block(result, argv)
    print(text)
    if args.doc:
        write_doc(os.path.join(ROOT, args.doc), text)
    bad = any(c.get("counts", {}).get("disagree") or c.get("counts", {}).get("error") or "failed" in c
              for c in result["cells"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
