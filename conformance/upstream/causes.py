"""Findings grouped by root cause, not by symptom.

A hunt's signature (stage, op, error class) separates failures a person would file once: the
same CHECK reached from different programs, the same wrong op under two transforms. `cause_key`
names what a failure is, with the numbers dropped:

* an abort: XLA's source file and the CHECK (or RET_CHECK) that failed;
* an exception: its stage, class and message (first two lines);
* wrong values: the stage `explain` names, the op it names (numbers dropped) and the shrunk
  program's ops with their sharding patterns;
* a hang or a refsim defect: the signature itself.

`group(findings)` joins findings with the same cause key, the same shrunk program (its digest)
or the same known bug (docs/found-bugs.md), and says why each group is one.
"""
from __future__ import annotations

import dataclasses
import re

__all__ = ["Cause", "cause_key", "group", "numbers_dropped"]

SHARDING_OPS = ("with_sharding_constraint", "reshard")


def numbers_dropped(text: str, lines: int = 1) -> str:
    """The first `lines` non-empty lines of `text` with numbers, addresses and timestamps dropped."""
    kept = [ln.strip() for ln in str(text or "").splitlines() if ln.strip()][:lines]
    out = " / ".join(kept)
    out = re.sub(r"^F\d{4} [\d:.]+\s+\d+ ", "", out)       # glog's prefix: date, time, thread
    out = re.sub(r"0x[0-9a-fA-F]+", "ADDR", out)
    out = re.sub(r"\d+", "N", out)
    return out[:200]


def cause_key(stage: str, op: str, error: str, *, text: str = "", op_patterns=()) -> str:
    """What a failure is (the module docstring), as one line of text."""
    core = sorted({f"{o}({p})" for o, p in op_patterns if o not in SHARDING_OPS})
    if stage == "crash":
        check = re.search(r"((?:Check failed|RET_CHECK failure)[^\n]*)", text or "")
        return f"abort in {op}: {numbers_dropped(check.group(1) if check else error)}"
    if stage.startswith("mismatch"):
        return (f"wrong values ({error}) at the {stage.split(':', 1)[-1]} stage, "
                f"{numbers_dropped(op)}, from {' + '.join(core) or 'no op'}")
    if stage in ("trace", "lowering", "compile", "runtime", "xla"):
        cls = error.split(":", 1)[0]
        return f"{stage} {cls}: {numbers_dropped(text or error, lines=2)}"
    return f"{stage} {op}: {error}"


@dataclasses.dataclass
class Cause:
    """One root cause: its key, the numbers of its findings, why they are one, and the known bug
    (docs/found-bugs.md number and why) when it is one."""

    key: str
    findings: list
    why: list
    known: int | None = None
    known_why: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def group(findings: list) -> list:
    """`Cause`s of `findings`: records with ``number``, ``cause``, ``digest`` (the shrunk program's)
    and ``known`` (a found-bugs number or None) and ``known_why``; in the order of their first finding."""
    parent = list(range(len(findings)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    joined: list = []   # (finding index, why it joined another)

    def join(i, j, why):
        a, b = root(i), root(j)
        if a != b:
            parent[max(a, b)] = min(a, b)
        joined.append((i, why))

    for i, f in enumerate(findings):
        for j in range(i):
            g = findings[j]
            if f["cause"] == g["cause"]:
                join(j, i, "the same cause: " + f["cause"])
            if f.get("digest") and f["digest"] == g.get("digest"):
                join(j, i, "the same minimal reproducer")
            if f.get("known") is not None and f["known"] == g.get("known"):
                join(j, i, f"the same known bug (found-bugs {f['known']})")
    out: dict = {}
    for i, f in enumerate(findings):
        r = root(i)
        c = out.get(r)
        if c is None:
            c = out[r] = Cause(f["cause"], [], [], f.get("known"), f.get("known_why", ""))
        c.findings.append(f["number"])
        if c.known is None and f.get("known") is not None:
            c.known, c.known_why = f["known"], f.get("known_why", "")
    reasons: dict = {}
    for i, why in joined:
        reasons.setdefault(root(i), set()).add(why)
    for r, c in out.items():
        c.why = sorted(reasons.get(r, ())) or ["one finding"]
    return list(out.values())
