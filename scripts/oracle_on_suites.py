"""Oracle mode on test suites nobody here wrote: each file run by pytest plainly and with
``--conformance-oracle``, and the two runs compared test by test.

    python scripts/oracle_on_suites.py [JAX_SRC] [--flax FLAX_SRC] [--files F1,F2] [--flax-files F1,F2]
                                       [--pythonpath DIR] [--out DIR] [--doc docs/oracle.md]

JAX_SRC is a JAX source checkout at the tag of the installed jax (``git clone`` of jax-ml/jax,
``git checkout jax-v0.10.2``; its ``tests/`` and root ``conftest.py`` / ``pyproject.toml`` are
used as JAX's CI uses them). FLAX_SRC is flax's source distribution unpacked (``pip download
flax==0.12.8 --no-deps --no-binary :all:``; it has ``tests/`` and flax's pytest settings), with
that flax importable (installed, or ``pip install --target DIR flax==0.12.8 --no-deps`` and
``--pythonpath DIR``). The suites are run from there and never copied into this repository.
JAX's test utilities need ``absl-py``. Each file runs twice in a fresh process on 8 virtual CPU
devices (a file that sets its own device count keeps it): plainly, and with
``--conformance-oracle --conformance-oracle-report``.
Printed (and with ``--doc``, written between the markers ``<!-- oracle-on-suites:begin -->`` and
``<!-- oracle-on-suites:end -->`` of that page, one block per suite and jax version: a run under
another jax keeps the other version's blocks; ``--summary`` rewrites them from earlier runs): one row
per file with the tests passed plainly,
the tests whose outcome changed under the oracle, the calls checked, disagreements, not
checkable (by reason), the census (distributed executions seen, not intercepted, the share
checked) and both wall times. ``--out DIR`` keeps the JUnit files, the oracle reports and a JSON
summary with every changed test and every disagreement.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The twelve files of issue 27 (JAX's tests/ directory).
JAX_FILES = ("pjit_test.py", "linalg_sharding_test.py", "array_test.py", "layout_test.py", "shard_alike_test.py",
             "async_collectives_test.py", "custom_partitioning_test.py", "debugging_primitives_test.py",
             "memories_test.py", "multi_device_test.py", "ragged_collective_test.py", "mesh_utils_test.py")
#: The eight files of flax 0.12.8 of issue 27 (flax's tests/ directory): nnx transforms, spmd,
#: partitioning and bridge, linen partitioning and meta, jax_utils.
FLAX_FILES = ("nnx/transforms_test.py", "nnx/spmd_test.py", "nnx/partitioning_test.py", "nnx/bridge/module_test.py",
              "nnx/bridge/wrappers_test.py", "linen/partitioning_test.py", "linen/linen_meta_test.py",
              "jax_utils_test.py")
BEGIN, END = "<!-- oracle-on-suites:begin -->", "<!-- oracle-on-suites:end -->"
EXTRA_PATH: list = []       # --pythonpath: folders put on the runs' PYTHONPATH (an installed flax)


def outcomes(junit: str) -> dict:
    """test id -> passed / failed / skipped, from a JUnit XML file (errors count as failed)."""
    if not os.path.exists(junit):
        return {}
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        tags = {child.tag for child in case}
        out[tid] = ("failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed")
    return out


def run_pytest(python: str, src: str, test_file: str, junit: str, extra: list, timeout: int) -> tuple[int, float, str]:
    """(exit status, wall seconds, output tail) of one pytest run of `test_file` from `src`."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, *EXTRA_PATH, os.environ.get("PYTHONPATH", "")) if p))
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    env.pop("CI", None)
    # -P: the checkout's own jax/ folder must not shadow the installed jax
    cmd = [python, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist",
           "--junitxml", junit, os.path.join("tests", test_file), *extra]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True, timeout=timeout)
        code, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        code, text = 124, f"timed out after {timeout} s\n{(e.stdout or b'')[-4000:]!r}"
    return code, time.perf_counter() - t0, text[-6000:]


def measure(python: str, src: str, test_file: str, out_dir: str, timeout: int) -> dict:
    """Both runs of one file and what changed between them."""
    stem = test_file[:-3].replace("/", ".")
    plain_xml, oracle_xml = (os.path.join(out_dir, f"{stem}.{k}.xml") for k in ("plain", "oracle"))
    report = os.path.join(out_dir, f"{stem}.oracle.json")
    for path in (plain_xml, oracle_xml, report):
        if os.path.exists(path):
            os.remove(path)
    code_p, t_p, tail_p = run_pytest(python, src, test_file, plain_xml, [], timeout)
    code_o, t_o, tail_o = run_pytest(python, src, test_file, oracle_xml,
                                     ["--conformance-oracle", "--conformance-oracle-report", report], timeout)
    plain, oracle = outcomes(plain_xml), outcomes(oracle_xml)
    changed = sorted((t, plain.get(t), oracle.get(t)) for t in set(plain) | set(oracle)
                     if plain.get(t) != oracle.get(t))
    rep = json.load(open(report)) if os.path.exists(report) else None
    row = {"file": test_file, "plain_status": code_p, "oracle_status": code_o,
           "tests": len(plain), "passed_plain": sum(v == "passed" for v in plain.values()),
           "failed_plain": sum(v == "failed" for v in plain.values()),
           "skipped_plain": sum(v == "skipped" for v in plain.values()),
           "changed": [{"test": t, "plain": a, "oracle": b} for t, a, b in changed],
           "seconds_plain": round(t_p, 1), "seconds_oracle": round(t_o, 1)}
    if rep is None:
        row["error"] = tail_o
        return row
    census = rep.get("census", {})
    row.update(checked=rep["checked"], disagreed=rep["disagreed"], not_checkable=rep["not_checkable"],
               seen=census.get("seen", 0), by_path=census.get("by_path", {}),
               not_intercepted=census.get("not_intercepted", {}), skipped_calls=rep.get("skipped", 0),
               disagreements=[{k: c.get(k) for k in ("test", "name", "via", "entry", "repro")}
                              for c in rep["calls"] if c["outcome"] == "disagree"],
               not_checkable_calls=[{k: c.get(k) for k in ("test", "name", "via", "reason", "detail")}
                                    for c in rep["calls"] if c["outcome"] == "not_checkable"])
    return row


def _share(checked: int, seen: int, missed: int) -> str:
    total = seen + missed
    return f"{100.0 * checked / total:.1f}%" if total else "-"


def table(rows: list[dict]) -> str:
    """The Markdown table (one row per file and a total)."""
    head = ("| file | tests passed plainly | changed under the oracle | calls checked | disagreed | "
            "not checkable | distributed executions seen | not intercepted | checked share | "
            "wall time plain / oracle |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    tot = {"tests": 0, "passed": 0, "changed": 0, "checked": 0, "disagreed": 0, "nc": 0, "seen": 0, "missed": 0,
           "tp": 0.0, "to": 0.0}
    for r in rows:
        nc = r.get("not_checkable", {})
        missed = sum(r.get("not_intercepted", {}).values())
        nc_text = (f"{sum(nc.values())}: " + ", ".join(f"{k} x{v}" for k, v in sorted(nc.items()))) if nc else "0"
        if "error" in r:
            lines.append(f"| {r['file']} | {r['passed_plain']} of {r['tests']} | {len(r['changed'])} | "
                         "(no oracle report) | | | | | | |")
            continue
        lines.append(f"| {r['file']} | {r['passed_plain']} of {r['tests']} | {len(r['changed'])} | {r['checked']} | "
                     f"{r['disagreed']} | {nc_text} | {r['seen']} | {missed} | "
                     f"{_share(r['checked'], r['seen'], missed)} | {r['seconds_plain']:.0f} s / {r['seconds_oracle']:.0f} s |")
        for k, v in (("tests", r["tests"]), ("passed", r["passed_plain"]), ("changed", len(r["changed"])),
                     ("checked", r["checked"]), ("disagreed", r["disagreed"]), ("nc", sum(nc.values())),
                     ("seen", r["seen"]), ("missed", missed), ("tp", r["seconds_plain"]), ("to", r["seconds_oracle"])):
            tot[k] += v
    lines.append(f"| **all** | {tot['passed']} of {tot['tests']} | {tot['changed']} | {tot['checked']} | "
                 f"{tot['disagreed']} | {tot['nc']} | {tot['seen']} | {tot['missed']} | "
                 f"{_share(tot['checked'], tot['seen'], tot['missed'])} | {tot['tp']:.0f} s / {tot['to']:.0f} s |")
    return "\n".join(lines)


_BLOCK = "<!-- oracle-on-suites:block "


def write_doc(path: str, blocks: dict) -> None:
    """Write `blocks` (key -> text, a key per suite and jax version) between the markers of `path`:
    a block of the same key is replaced, blocks of other keys (another jax version's run) are kept."""
    with open(path) as fh:
        doc = fh.read()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"--doc {path}: the page has no {BEGIN} ... {END} markers; add them where the table goes")
    head, rest = doc.split(BEGIN, 1)
    region, tail = rest.split(END, 1)
    old = {}
    for part in region.split(_BLOCK)[1:]:
        key, _, text = part.partition(" -->")
        old[key] = text.strip("\n")
    old.update(blocks)
    body = "\n\n".join(f"{_BLOCK}{k} -->\n{old[k]}" for k in sorted(old))
    with open(path, "w") as fh:
        fh.write(f"{head}{BEGIN}\n{body}\n{END}{tail}")


def doc_blocks(summary: dict) -> dict:
    """The doc's blocks of one run (`summary.json`): one table per suite, keyed by suite and jax version."""
    out = {}
    for name, rows in (summary.get("suites") or {"jax": summary["rows"]}).items():
        what = "JAX's test files" if name == "jax" else f"flax {summary.get('flax')}'s test files"
        note = f" ({summary['note']})" if summary.get("note") else ""
        key = f"{'JAX' if name == 'jax' else name} tests, jax {summary['jax']}"
        out[key] = (f"{what} under jax {summary['jax']}, Python {summary['python']}, 8 virtual CPU devices{note}:"
                    f"\n\n{table(rows)}")
    return out


def _suite(a, ap, src: str, files: str, label: str, out_dir: str) -> list[dict]:
    if not os.path.isdir(os.path.join(src, "tests")):
        ap.error(f"{src!r} has no tests/ folder; pass a {label} source checkout")
    rows = []
    for f in [x for x in files.split(",") if x]:
        if not os.path.exists(os.path.join(src, "tests", f)):
            ap.error(f"{f} is not in {src}/tests")
        row = measure(a.python, src, f, out_dir, a.timeout)
        rows.append(row)
        print(f"{label} {f}: {row.get('checked', '?')} checked, {row.get('disagreed', '?')} disagreed, "
              f"{len(row['changed'])} tests changed ({row['seconds_plain']:.0f} s / {row['seconds_oracle']:.0f} s)",
              flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jax_src", nargs="?", default=None,
                    help="a JAX source checkout at the installed jax's tag (its tests/ are run)")
    ap.add_argument("--files", default=",".join(JAX_FILES), help="comma-separated files of tests/ (default: issue 27's 12)")
    ap.add_argument("--flax", default=None, metavar="FLAX_SRC", help="flax's unpacked sdist (its tests/ are run)")
    ap.add_argument("--flax-files", default=",".join(FLAX_FILES),
                    help="comma-separated files of flax's tests/ (default: issue 27's 8)")
    ap.add_argument("--pythonpath", action="append", default=[], metavar="DIR",
                    help="a folder to put on the runs' PYTHONPATH (e.g. where flax was pip-installed with --target)")
    ap.add_argument("--out", default=None, help="folder for the JUnit files, oracle reports and summary JSON")
    ap.add_argument("--python", default=sys.executable, help="the interpreter to run pytest with (default: this one)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per pytest run (default 3600)")
    ap.add_argument("--doc", default=None, help="write the table between the markers of this Markdown page")
    ap.add_argument("--note", default="", help="a remark for the doc's heading of this run (e.g. the suites' commit)")
    ap.add_argument("--summary", action="append", default=[], metavar="JSON",
                    help="write --doc from this earlier run's summary.json (repeatable) instead of running")
    a = ap.parse_args(argv)
    if a.summary:
        if not a.doc:
            ap.error("--summary writes the tables into --doc; pass --doc PAGE")
        blocks = {}
        for path in a.summary:
            with open(path) as fh:
                blocks.update(doc_blocks(json.load(fh)))
        write_doc(a.doc, blocks)
        return 0
    if a.jax_src is None and a.flax is None:
        ap.error("pass a JAX source checkout (JAX_SRC), flax's sdist (--flax FLAX_SRC), or both")
    EXTRA_PATH[:] = [os.path.abspath(p) for p in a.pythonpath]
    out_dir = a.out or os.path.join(os.path.abspath("."), "oracle-on-suites")
    os.makedirs(out_dir, exist_ok=True)
    suites = {}
    if a.jax_src is not None:
        suites["jax"] = _suite(a, ap, a.jax_src, a.files, "JAX", out_dir)
    if a.flax is not None:
        suites["flax"] = _suite(a, ap, a.flax, a.flax_files, "flax", out_dir)
    probe = "import jax, sys; print(jax.__version__, sys.version.split()[0]); import flax; print(flax.__version__)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (*EXTRA_PATH, os.environ.get("PYTHONPATH", "")) if p))
    version = subprocess.run([a.python, "-c", probe], capture_output=True, text=True, env=env).stdout.split()
    summary = {"jax": version[0] if version else None, "python": version[1] if len(version) > 1 else None,
               "flax": version[2] if len(version) > 2 else None, "note": a.note, "suites": suites,
               "rows": [r for rows in suites.values() for r in rows]}
    with open(os.path.join(out_dir, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    for rows in suites.values():
        print(table(rows))
    if a.doc:
        write_doc(a.doc, doc_blocks(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
