"""Where a worker run's workers wait: a summary of a ``CONFORMANCE_TIMELINE`` file (issue 29).

    CONFORMANCE_TIMELINE=/tmp/tl.jsonl python -m conformance run --examples 20 --seed 0 \\
        --shrink-seconds 0 --compile-cache "$(mktemp -d)"
    python -m bench.timeline /tmp/tl.jsonl

`conformance.engine.workers.mark` appends one JSON line per event (the run's start and end, the
parent's hand-outs of drawn lists, each worker's start-up, tasks and exit). Per worker this prints
its busy seconds (the case records' ``seconds``: what `bench.reruns` counts) and its idle seconds
within the runner's wall time, by cause: start-up (from the run's start to the worker's first
task), gaps between tasks (result sent, next task received), time in a task outside `run_task`,
and the tail (its last result to the run's end).
"""
from __future__ import annotations

import collections
import json
import sys


def summarize(events: list[dict]) -> dict:
    """{"wall": s, "busy": s, "workers": {pid: {cause: seconds}}} of one run's events."""
    t0 = next(e["t"] for e in events if e["event"] == "run_start")
    t1 = next(e["t"] for e in events if e["event"] == "run_end")
    parent = next(e["pid"] for e in events if e["event"] == "run_start")
    by_pid = collections.defaultdict(list)
    for e in events:
        if e["pid"] != parent:
            by_pid[e["pid"]].append(e)
    out = {"wall": t1 - t0, "busy": 0.0, "workers": {}}
    for pid, evs in by_pid.items():
        tasks, start = [], None
        for e in evs:
            if e["event"] == "task":
                start = e["t"]
            elif e["event"] == "done":
                tasks.append((start, e["t"], e["seconds"]))
        if not tasks:
            continue
        busy = sum(s for _, _, s in tasks)
        out["busy"] += busy
        out["workers"][pid] = {
            "tasks": len(tasks), "busy": busy,
            "start-up (run start to first task)": max(0.0, tasks[0][0] - t0),
            "between tasks (result sent, next task received)": sum(b[0] - a[1] for a, b in zip(tasks, tasks[1:])),
            "in a task, outside run_task": sum(b - a - s for a, b, s in tasks),
            "tail (last result to the run's end)": t1 - tasks[-1][1]}
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m bench.timeline FILE (a CONFORMANCE_TIMELINE file)", file=sys.stderr)
        return 2
    with open(argv[0]) as fh:
        s = summarize([json.loads(line) for line in fh if line.strip()])
    n = len(s["workers"])
    print(f"wall {s['wall']:.1f} s, {n} workers, busy {s['busy']:.1f} s = "
          f"{100 * s['busy'] / max(1e-9, n * s['wall']):.1f}% of {n} x wall")
    total = collections.Counter()
    for pid, w in s["workers"].items():
        print(f"worker {pid}: {w['tasks']} tasks, busy {w['busy']:.1f} s, idle {s['wall'] - w['busy']:.1f} s")
        for k, v in w.items():
            if k not in ("tasks", "busy"):
                print(f"    {k:50s} {v:7.2f} s")
                total[k] += v
    print("all workers, idle by cause:")
    for k, v in total.items():
        print(f"    {k:50s} {v:7.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
