"""Shared benchmark plumbing: interleaved timing with medians and spread, peak RSS, machine facts, output.

Every figure is one dict with a ``"bench"`` key; `emit` prints it as one JSON line
(and appends it to a file when asked), `table` prints a group of them with rich.
Things compared with each other are timed in equal, interleaved passes (`interleaved`:
a, b, a, b, ...), so a burst of load from other processes hits both alike, and each is
reported as the median of its passes with their spread (`stats`): the median is what a
user of this machine sees, the spread says how much to trust it.
"""
from __future__ import annotations

import json
import os
import platform as _platform
import resource
import sys
import time
from typing import Callable, Iterable, Sequence

_JSON_SINK: list = []  # open file objects that also receive every JSON line


def interleaved(fns: dict, passes: int, clock: Callable[[], float] = time.perf_counter) -> dict:
    """{name: [seconds of each pass]}: `passes` rounds, each calling every fn once in turn.

    `clock` reads the time (wall clock by default; `time.process_time` counts only this
    process's CPU time, ignoring time spent descheduled on a shared machine).
    """
    if passes < 1:
        raise ValueError(f"passes={passes} must be >= 1; pass how many timed rounds to take medians over.")
    times: dict = {k: [] for k in fns}
    for _ in range(passes):
        for name, fn in fns.items():
            t = clock()
            fn()
            times[name].append(clock() - t)
    return times


def stats(times: Sequence[float]) -> dict:
    """Median, min, max and spread ((max - min) / median) of a list of timings (seconds)."""
    if not times:
        raise ValueError("stats() needs at least one timing.")
    xs = sorted(float(t) for t in times)
    n = len(xs)
    med = xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
    return {"median": med, "min": xs[0], "max": xs[-1], "spread": (xs[-1] - xs[0]) / med if med > 0 else 0.0,
            "passes": n}


def fmt_stat(st: dict | None, rate_of: float | None = None) -> str:
    """``12.3 ms (11.0–15.2)``: the median and, over several passes, the range of the passes;
    with `rate_of`, the rate for that many items (``41.0/s (38.2–44.0)``)."""
    if not st:
        return "-"
    if rate_of is not None:
        med, lo, hi = rate_of / st["median"], rate_of / st["max"], rate_of / st["min"]
        return f"{med:.1f}/s" + (f" ({lo:.1f}–{hi:.1f})" if st.get("passes", 1) > 1 else "")
    if st.get("passes", 1) <= 1:
        return fmt_seconds(st["median"])
    scale, unit = (1e3, "ms") if st["max"] < 1 else (1.0, "s")
    return f"{fmt_seconds(st['median'])} ({st['min'] * scale:.3g}–{st['max'] * scale:.3g} {unit})"


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss() -> int:
    """This process's peak resident set size in bytes (VmHWM, else ru_maxrss)."""
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def current_rss() -> int:
    """This process's resident set size now, in bytes (VmRSS; peak RSS where /proc is absent)."""
    kib = _status_kib("VmRSS")
    return kib * 1024 if kib is not None else peak_rss()


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux /proc/self/clear_refs "5").

    Returns False where that is not possible; `peak_rss` then keeps the process-lifetime peak.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def children_peak_rss() -> int:
    """The largest peak RSS of any waited-for child process (bytes), from RUSAGE_CHILDREN."""
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale


def git_commit(root: str | None = None) -> str:
    """The checkout's commit (short hash, "+dirty" with uncommitted changes), or "unknown"."""
    import subprocess

    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+dirty" if dirty else "")) if head else "unknown"


def machine() -> dict:
    """Facts that make a figure comparable: CPU, cores, memory, load, Python, NumPy, JAX versions, commit."""
    import numpy as np

    cpu = _platform.processor() or _platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    try:
        from importlib.metadata import version

        jax_version = version("jax")
    except Exception:  # pragma: no cover - jax is a project dependency
        jax_version = "unknown"
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        load = None
    import datetime

    return {
        "bench": "machine", "commit": git_commit(), "host": _platform.node(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average": load, "cpu": cpu, "cores": os.cpu_count(),
        "memory_gib": round(mem / 2**30, 1) if mem else None,
        "python": _platform.python_version(), "numpy": np.__version__, "jax": jax_version,
    }


def open_json(path: str | None) -> None:
    """Also append every JSON line to `path` (None: stdout only)."""
    if path:
        _JSON_SINK.append(open(path, "a"))


def close_json() -> None:
    while _JSON_SINK:
        _JSON_SINK.pop().close()
    _RECORD_SINKS.clear()


_RECORD_SINKS: list = []  # lists that also collect every emitted record (until close_json)


def add_sink(records: list) -> None:
    """Also append every emitted record (a dict) to `records`."""
    _RECORD_SINKS.append(records)


def _jsonable(v):
    if isinstance(v, float):
        return round(v, 6)
    if hasattr(v, "item"):  # NumPy scalars
        return v.item()
    return v


def emit(record: dict) -> None:
    """Print one figure as one JSON line (and to the --json file)."""
    line = json.dumps({k: _jsonable(v) for k, v in record.items()})
    print(line, flush=True)
    for sink in _RECORD_SINKS:
        sink.append(json.loads(line))
    for f in _JSON_SINK:
        f.write(line + "\n")
        f.flush()


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def fmt_bytes(b: float | None) -> str:
    if b is None:
        return "-"
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.1f}x"


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Print a table with rich (plain text when stdout is not a terminal)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table()
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*("-" if v is None else str(v) for v in r))
    console = Console(width=max(120, 16 * len(columns)), highlight=False)
    console.print(f"\n[bold]{escape(title)}[/bold]", soft_wrap=True)
    console.print(t)


def conformance_run(root: str, options: Sequence[str], env: dict, timeout: float) -> tuple:
    """One `python -m conformance run --no-progress OPTIONS --report TMP` of the checkout at `root`
    in a fresh process (its `PYTHONPATH` is `root`, `XLA_FLAGS` unset): (the process, its wall
    seconds, the report's summary record, its case records). Raises RuntimeError when the run
    wrote no summary, with the end of its output; the report folder is removed either way."""
    import shutil
    import subprocess
    import tempfile

    report = tempfile.mkdtemp(prefix="bench-conformance-")
    env = dict(env, PYTHONPATH=root)
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, "-m", "conformance", "run", "--no-progress", *options, "--report", report]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        process_s = time.perf_counter() - t0
        summary, cases = None, []
        path = os.path.join(report, "results.jsonl")
        if os.path.exists(path):
            with open(path) as fh:
                for line in fh:
                    rec = json.loads(line)
                    if rec.get("type") == "summary":
                        summary = rec
                    elif rec.get("type") == "case":
                        cases.append(rec)
        if summary is None:
            tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"conformance run in {root} wrote no summary (exit {p.returncode}): {tail}")
    finally:
        shutil.rmtree(report, ignore_errors=True)
    return p, process_s, summary, cases
