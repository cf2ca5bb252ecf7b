"""A run's plan identity, shards of a plan, and the checks that keep two plans from mixing.

The cases of a run are a deterministic function of its *identity*: the suites, seed,
examples, device count, platform and the versions that shape the draws (JAX, jaxlib, NumPy,
Python, hypothesis). `--resume` continues a folder only with the same identity and shard;
`python -m conformance merge` combines folders only of one identity. `--shard K/N` keeps the
cases at plan positions K-1, K-1+N, K-1+2N, ... so the N shards together are the plan, each
case in exactly one shard, and every shard gets a share of every suite and family.
"""
from __future__ import annotations

import os

__all__ = ["IDENTITY_KEYS", "check_resume", "differences", "identity", "parse_shard", "select_shard",
           "select_shard_chunks"]

IDENTITY_KEYS = ("suite", "seed", "examples", "devices", "platform", "jax", "jaxlib", "numpy", "python",
                 "hypothesis")


def identity(plan: dict) -> dict:
    """The entries of `plan` that decide which cases it draws (absent keys are left out)."""
    return {k: plan[k] for k in IDENTITY_KEYS if k in plan}


def differences(a: dict, b: dict, *, names=("there", "now")) -> list[str]:
    """One text per identity entry where plans `a` and `b` differ, e.g. ``seed: 0 there, 1 now``."""
    ia, ib = identity(a), identity(b)
    out = []
    for k in IDENTITY_KEYS:
        if k in ia and k in ib and ia[k] != ib[k]:
            out.append(f"{k}: {ia[k]!r} {names[0]}, {ib[k]!r} {names[1]}")
    return out


def parse_shard(text) -> tuple[int, int]:
    """``"K/N"`` as (K, N) with 1 <= K <= N; ValueError naming the value otherwise."""
    parts = str(text).split("/")
    try:
        k, n = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"--shard {text!r} is not K/N; write e.g. --shard 1/2 for the first of 2 shards.") from None
    if n < 1 or not 1 <= k <= n:
        raise ValueError(f"--shard {text!r}: K/N needs 1 <= K <= N (shards are numbered from 1), e.g. 1/{max(n, 2)}.")
    return k, n


def select_shard(tasks: list, shard) -> list:
    """The tasks of shard (K, N): plan positions K-1, K-1+N, ... (None: all of them)."""
    if shard is None:
        return list(tasks)
    k, n = shard if isinstance(shard, tuple) else parse_shard(shard)
    return list(tasks[k - 1::n])


def select_shard_chunks(chunks, shard):
    """`select_shard` over a plan drawn in chunks (lists of tasks): yields each chunk's tasks of
    shard (K, N), counting plan positions across chunks, so the concatenation is `select_shard`
    of the whole plan. None: every chunk as it is. A bad `shard` raises here, before any drawing."""
    if shard is None:
        return iter(chunks)
    k, n = shard if isinstance(shard, tuple) else parse_shard(shard)
    return _shard_chunks(chunks, k, n)


def _shard_chunks(chunks, k: int, n: int):
    pos = 0
    for chunk in chunks:
        yield [t for i, t in enumerate(chunk, pos) if i % n == k - 1]
        pos += len(chunk)


def plan_records(path) -> list[dict]:
    """The plan records of a results.jsonl file (one per run that wrote to it), [] when missing."""
    from conformance.report import read_records

    if not os.path.exists(path):
        return []
    return [r for r in read_records(path) if r.get("type") == "plan"]


def check_resume(report_dir, plan: dict) -> None:
    """ValueError when ``report_dir/results.jsonl`` was written by another plan or shard than `plan`."""
    from conformance.report import JSONL_NAME

    path = os.path.join(os.fspath(report_dir), JSONL_NAME)
    for old in plan_records(path)[:1]:  # resumes append plans of the same identity
        diff = differences(old, plan)
        if old.get("shard") != plan.get("shard"):
            diff.append(f"shard: {old.get('shard') or 'none'} there, {plan.get('shard') or 'none'} now")
        if diff:
            raise ValueError(
                f"--resume: {path} was written by another plan ({'; '.join(diff)}); resuming would mix the cases of "
                "two plans. Resume with the arguments of that run, or pass a new --report folder.")
