"""The supported JAX range, measured: the default run and the unit tests on every JAX installed here.

    python scripts/version_matrix.py [--venvs DIR,...] [--no-run] [--no-tests] [--pytest-args ARGS]
                                     [--run-args ARGS] [--log-dir DIR] [--json FILE]

Each virtual environment (default: the ones present of VENVS, oldest JAX first; each has this
project installed editable, `pip install -e '.[test]'` beside its jax pin) runs, one after the other:

* the default run, ``python -m conformance run`` with its defaults (README), whose exit status is its
  verdict (0 AGREE, 1 DISAGREE, 2 bad arguments, 3 INCOMPLETE; docs/reports.md);
* the unit tests, ``python -m pytest -p no:xdist -q tests`` (one process: the runs are long, and the
  machine is shared), whose summary line gives passed / failed / errors / skipped.

Printed: one row per environment (jax and Python versions, run verdict, tests, seconds of each), then
one JSON line with the same records. ``--log-dir`` keeps each command's full output. CI keeps its one
version (.ci/run); this script is for the range (docs/xla_backend.md, "Supported JAX versions").
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The environments of the supported range (pyproject: jax >= 0.9), oldest JAX first.
VENVS = (".venv-jax0.9", ".venv", ".venv-jax0.11", ".venv312")
VERDICTS = {0: "AGREE", 1: "DISAGREE", 2: "BAD-ARGS", 3: "INCOMPLETE"}
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)")
_SUMMARY = re.compile(r"^=*\s*(?:\d+ \w+(?:, )?)+.* in [\d.]+s")


@dataclass
class Row:
    """One environment's measurements (None: not run)."""
    venv: str
    jax: str = "?"
    jaxlib: str = "?"
    python: str = "?"
    run_verdict: str | None = None
    run_seconds: float | None = None
    tests: dict = field(default_factory=dict)      # passed / failed / errors / skipped ...
    tests_seconds: float | None = None
    tests_exit: int | None = None


def pytest_counts(output: str) -> dict:
    """The counts of pytest's last summary line (``== 3 passed, 1 failed, 2 skipped in 4.5s ==``),
    keyed passed / failed / errors / skipped / xfailed / xpassed / deselected ({} when there is none)."""
    lines = [ln for ln in output.splitlines() if _SUMMARY.match(ln.strip())]
    if not lines:
        return {}
    counts = {}
    for n, what in _COUNT.findall(lines[-1]):
        counts["errors" if what.startswith("error") else what] = int(n)
    return counts


def verdict(returncode: int) -> str:
    """The default run's verdict from its exit status (docs/reports.md), or the signal that ended it."""
    if returncode < 0:
        return f"KILLED({-returncode})"
    return VERDICTS.get(returncode, f"EXIT {returncode}")


def _python(venv: str) -> str:
    return os.path.join(ROOT, venv, "bin", "python")


def _versions(venv: str) -> tuple[str, str, str]:
    code = ("import sys; from importlib.metadata import version as v; "
            "print(v('jax'), v('jaxlib'), '%d.%d.%d' % sys.version_info[:3])")
    out = subprocess.run([_python(venv), "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    jax, jaxlib, py = out.stdout.split()
    return jax, jaxlib, py


def _timed(cmd: list[str], log: str | None) -> tuple[int, str, float]:
    """Run `cmd` from the root without inherited JAX/XLA settings; its output goes to `log` as it
    comes (a long run can be watched there) and is returned."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "VIRTUAL_ENV"))}
    with tempfile.TemporaryDirectory() as tmp:
        path = log or os.path.join(tmp, "out.log")
        t0 = time.monotonic()
        with open(path, "w") as fh:
            fh.write(" ".join(map(shlex.quote, cmd)) + "\n")
            fh.flush()
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
        seconds = time.monotonic() - t0
        with open(path) as fh:
            return rc, fh.read(), seconds


def measure(venv: str, *, run: bool, tests: bool, run_args: list[str], pytest_args: list[str],
            log_dir: str | None) -> Row:
    row = Row(venv)
    row.jax, row.jaxlib, row.python = _versions(venv)
    tag = f"{venv.strip('.')}-jax{row.jax}"
    log = (lambda what: os.path.join(log_dir, f"{tag}-{what}.log")) if log_dir else (lambda what: None)
    if run:
        rc, _, row.run_seconds = _timed([_python(venv), "-m", "conformance", "run", "--no-progress", *run_args],
                                        log("run"))
        row.run_verdict = verdict(rc)
    if tests:
        rc, out, row.tests_seconds = _timed([_python(venv), "-m", "pytest", "-p", "no:xdist", "-q", *pytest_args],
                                            log("tests"))
        row.tests, row.tests_exit = pytest_counts(out), rc
    return row


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table (what docs/xla_backend.md shows)."""
    head = "| jax / jaxlib | Python | default run | seconds | tests passed | failed | errors | skipped | seconds |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    fmt = lambda s: "—" if s is None else f"{s:.0f}"
    for r in rows:
        t = r.tests
        cells = [f"{r.jax} / {r.jaxlib}", r.python, r.run_verdict or "—", fmt(r.run_seconds),
                 *(str(t.get(k, 0)) if r.tests_exit is not None else "—"
                   for k in ("passed", "failed", "errors", "skipped")),
                 fmt(r.tests_seconds)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venvs", help="comma-separated environment folders under the root "
                                    f"(default: those present of {', '.join(VENVS)})")
    ap.add_argument("--no-run", action="store_true", help="skip the default run")
    ap.add_argument("--no-tests", action="store_true", help="skip the unit tests")
    ap.add_argument("--run-args", default="", help="extra arguments for `python -m conformance run`")
    ap.add_argument("--pytest-args", default="tests", help="what pytest runs (default: tests)")
    ap.add_argument("--log-dir", help="keep each command's output here")
    ap.add_argument("--json", help="also write the records to this file")
    args = ap.parse_args(argv)
    venvs = args.venvs.split(",") if args.venvs else [v for v in VENVS if os.path.exists(_python(v))]
    missing = [v for v in venvs if not os.path.exists(_python(v))]
    if missing:
        ap.error(f"--venvs: no {', '.join(_python(v) for v in missing)}; create it "
                 "(docs/xla_backend.md, 'Supported JAX versions')")
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    rows = []
    for venv in venvs:
        rows.append(measure(venv, run=not args.no_run, tests=not args.no_tests, run_args=shlex.split(args.run_args),
                            pytest_args=shlex.split(args.pytest_args), log_dir=args.log_dir))
        print(f"{venv}: jax {rows[-1].jax} run {rows[-1].run_verdict} tests {rows[-1].tests}",
              file=sys.stderr, flush=True)
    print(table(rows))
    records = [asdict(r) for r in rows]
    print(json.dumps({"version_matrix": records}))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(records, fh, indent=1)
    bad = any(r.run_verdict not in (None, "AGREE") or r.tests.get("failed") or r.tests.get("errors")
              or (r.tests_exit not in (None, 0)) for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
