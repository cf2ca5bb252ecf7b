"""Running a finding's plain-JAX script as its reader would: a fresh Python, no project on the path.

`run_script(path, partitioner)` runs the script in a new interpreter (``-I``: no PYTHONPATH, no
user site, the working directory an empty folder) whose imports of this project's packages
(refsim, xla_backend, conformance) and of hypothesis fail, with no ``JAX_*`` / ``XLA_*`` variable
inherited, and says how it ended (`Outcome`): it passed, it raised (an `AssertionError` from its
own check is wrong values), XLA aborted the process (with XLA's fatal line), or it hung.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

__all__ = ["BLOCKED", "Outcome", "run_script"]

#: Packages a plain-JAX script must not import: this project's and its test tools.
BLOCKED = ("refsim", "xla_backend", "conformance", "hypothesis", "bench")

_FATAL = re.compile(r"^F\d{4} [^\]]*\S+\.(?:cc|h):\d+\] .*$", re.M)

# Runs the script as __main__ with the project's packages unimportable, and records the exception
# it ends with (then re-raises it, so the traceback reaches stderr); an abort leaves no record.
_RUNNER = r"""
import json, runpy, sys
script, record, blocked = sys.argv[1], sys.argv[2], sys.argv[3].split(",")

class NoProject:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{name}: a plain-JAX reproducer may not import it")
        return None

sys.meta_path.insert(0, NoProject())
sys.argv = [script] + sys.argv[4:]
try:
    runpy.run_path(script, run_name="__main__")
except BaseException as e:
    if isinstance(e, SystemExit) and e.code in (None, 0):
        raise
    with open(record, "w") as f:
        json.dump({"class": type(e).__name__, "message": str(e)}, f)
    raise
"""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one run of a script ended. kind: "passes" (exit 0), "wrong-values" (its own
    AssertionError), "raises" (another exception: `cls`, `message`), "aborts" (SIGABRT:
    `fatal_line`), "hangs" (killed after the time-out), "exits" (another exit status or signal)."""

    kind: str
    partitioner: str
    returncode: int | None = None
    cls: str = ""
    message: str = ""
    fatal_line: str = ""
    stdout: str = ""
    stderr_tail: str = ""

    @property
    def fails(self) -> bool:
        return self.kind != "passes"

    def describe(self) -> str:
        """One line: what the script did."""
        if self.kind == "passes":
            return "passes (exit 0)"
        if self.kind == "wrong-values":
            return "wrong values: " + _first(re.sub(r"^wrong values under \w+: ", "", self.message))
        if self.kind == "raises":
            return f"raises {self.cls}: {_first(self.message)}"
        if self.kind == "aborts":
            return f"aborts (SIGABRT): {self.fatal_line or 'no fatal line'}"
        if self.kind == "hangs":
            return "hangs (killed after the time-out)"
        last = self.stderr_tail.splitlines()[-1] if self.stderr_tail.strip() else ""
        return f"exits with status {self.returncode}: {_first(last)}"

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["stdout"] = d["stdout"][-2000:]
        return d


def _first(text) -> str:
    return next((ln.strip() for ln in str(text or "").splitlines() if ln.strip()), "")[:300]


def run_script(path: str, partitioner: str | None = None, *, timeout: float = 300.0,
               python: str | None = None) -> Outcome:
    """Run the script at `path` (with `partitioner` as its argument, when given) in a fresh,
    isolated Python (the module docstring) and classify how it ended."""
    path = os.path.abspath(path)
    args = [partitioner] if partitioner else []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "PYTHON", "CONFORMANCE_"))}
    with tempfile.TemporaryDirectory(prefix="upstream-run-") as tmp:
        record = os.path.join(tmp, "raised.json")
        cmd = [python or sys.executable, "-I", "-c", _RUNNER, path, record, ",".join(BLOCKED), *args]
        try:
            p = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            return Outcome("hangs", partitioner or "", None, stdout=out)
        raised = None
        if os.path.exists(record):
            with open(record, encoding="utf-8") as fh:
                raised = json.load(fh)
    tail = "\n".join(p.stderr.splitlines()[-30:])
    common = dict(partitioner=partitioner or "", returncode=p.returncode, stdout=p.stdout, stderr_tail=tail)
    if p.returncode == 0:
        return Outcome("passes", **common)
    if raised is not None:
        kind = "wrong-values" if raised["class"] == "AssertionError" and "wrong values" in raised["message"] \
            else "raises"
        return Outcome(kind, cls=raised["class"], message=raised["message"], **common)
    fatal = _FATAL.findall(p.stderr)
    if p.returncode == -signal.SIGABRT:
        return Outcome("aborts", fatal_line=fatal[-1] if fatal else "", **common)
    return Outcome("exits", fatal_line=fatal[-1] if fatal else "", **common)
