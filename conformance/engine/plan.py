"""A run's plan identity, shards of a plan, and the checks that keep two plans from mixing.

The cases of a run are a deterministic function of its *identity*: the suites, seed,
examples, device count, platform and the versions that shape the draws (JAX, jaxlib, NumPy,
Python, hypothesis). `--resume` continues a folder only with the same identity and shard;
`python -m conformance merge` combines folders only of one identity. `--shard K/N` keeps the
cases at plan positions K-1, K-1+N, K-1+2N, ... so the N shards together are the plan, each
case in exactly one shard, and every shard gets a share of every suite and family.

The plan record also lists its case ids (``case_ids``; of the shard, with ``plan_cases`` the
whole plan's count), so a report can say which cases it lacks and `--resume` and `merge` can
refuse a case line that is not in the plan, and the digest of the xfails entries it judged
with (``xfails_digest``): `--resume` refuses another xfails file, since the kept verdicts were
judged with the old one.
"""
from __future__ import annotations

import os

__all__ = ["IDENTITY_KEYS", "check_resume", "differences", "identity", "parse_shard", "select_shard",
           "select_shard_chunks", "shard_size", "xfails_digest"]

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


def shard_size(k: int, n: int, plan_cases: int) -> int:
    """How many of a plan's `plan_cases` cases shard (k, n) holds."""
    return len(range(k - 1, plan_cases, n))


def xfails_digest(xf) -> str:
    """``sha256:<hex>`` of the entries of an `XfailList` that apply (pattern, signature, reason, ...;
    not comments, blank lines or line numbers): two runs with equal digests judge every case alike."""
    import hashlib
    import json

    rows = [[e.pattern, e.reason, e.kind, list(e.classes), e.model, e.exception, e.message, e.sometimes,
             e.version] for e in xf.entries]
    return "sha256:" + hashlib.sha256(json.dumps(rows, default=str).encode("utf-8")).hexdigest()


def check_resume(report_dir, plan: dict, finished=None) -> None:
    """ValueError naming ``report_dir/results.jsonl`` when resuming it with `plan` would mix what must not mix:

    * case records but no plan line (nothing says which plan they belong to);
    * another plan or shard (`differences`);
    * another xfails file (``xfails_digest``): the kept verdicts were judged with the old entries;
    * a case record (`finished`: the loaded {case_id: CaseResult}) whose id is not in `plan`'s
      ``case_ids`` (a foreign line, copied or edited in).
    """
    from conformance.report import JSONL_NAME

    path = os.path.join(os.fspath(report_dir), JSONL_NAME)
    plans = plan_records(path)
    if not plans:
        if finished:
            raise ValueError(
                f"--resume: {path} has case records but no plan line, so nothing says which plan (suites, seed, "
                "examples, devices, platform, versions) they belong to; it was not written by `python -m conformance "
                "run`. Pass a new --report folder, or remove the file to start afresh.")
        return
    old = plans[0]  # resumes append plans of the same identity
    diff = differences(old, plan)
    if old.get("shard") != plan.get("shard"):
        diff.append(f"shard: {old.get('shard') or 'none'} there, {plan.get('shard') or 'none'} now")
    if diff:
        raise ValueError(
            f"--resume: {path} was written by another plan ({'; '.join(diff)}); resuming would mix the cases of "
            "two plans. Resume with the arguments of that run, or pass a new --report folder.")
    if "xfails_digest" in plan and old.get("xfails_digest") != plan["xfails_digest"]:
        was = (f"{old.get('xfails')} ({old['xfails_digest'][:19]}...)" if old.get("xfails_digest")
               else "an xfails file it did not record")
        raise ValueError(
            f"--resume: {path} was judged with other xfails entries ({was}) than now ({plan.get('xfails')} "
            f"({plan['xfails_digest'][:19]}...)); its kept verdicts would not match the new file. Resume with the "
            "xfails file of that run, or pass a new --report folder to judge every case with the new one.")
    if finished and plan.get("case_ids") is not None:
        planned = set(plan["case_ids"])
        foreign = [c for c in finished if c not in planned]
        if foreign:
            raise ValueError(
                f"--resume: {path} holds {len(foreign)} case record(s) that are not in this plan, e.g. {foreign[0]!r}; "
                "a record copied in from another run or edited would count as this plan's result. Remove those "
                "lines, or pass a new --report folder.")
