"""The bugs docs/found-bugs.md already lists, and whether a finding is one of them.

`load()` reads the page's entries (``## N. slug`` sections): the title, the stage line, the
versions it reproduces on, how it fails (``fails with:`` a class and a /regex/ or wrong values,
``aborts with:`` a /regex/ of XLA's fatal line, per version or for all) and the ops it names (in
backticks on its ``xfails/cpu.txt:`` line, else on its ``found:`` lines), with what that line
requires (a derivative, a partitioner, two ops together).

`match(...)` says whether a finding is a known bug, conservatively, and why:

* an abort whose fatal line an entry's ``aborts with`` regex matches, or an exception of the
  entry's class whose message its ``fails with`` regex matches ("the same message");
* the same with every number in the regex made ``\\d+`` ("the same message, numbers dropped");
* wrong values from a shrunk program whose ops (sharding constraints aside) are all ops the
  entry names, with the derivative and partitioner its xfails line requires.

An entry that says the installed version is correct is not matched there. Nothing else is: a
finding that is none of these is new. `resembles(...)` is the weaker hint a new finding carries:
wrong values from ops of the same families as an entry's (a reshape for an `expand_dims`, one
scatter for another), for the person triaging it to compare, never counted as known.
"""
from __future__ import annotations

import dataclasses
import os
import re

from conformance.strategies.sharded import OPS

__all__ = ["KnownBug", "Match", "PAGE", "generalised", "load", "match", "resembles"]

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                    "found-bugs.md")
SHARDING_OPS = frozenset({"with_sharding_constraint", "reshard"})
# the op names a drawn program's ops carry (`ShardedProgram.op_patterns`): the table's, and the names
# some entries split into (a pad with a negative low edge and interior padding, tile and repeat)
OP_NAMES = frozenset(OPS) | {"pad_neg_interior", "tile", "repeat"}

_ENTRY = re.compile(r"^## (\d+)\. (\S+)\n(.*?)(?=^## |\Z)", re.M | re.S)
_TITLE = re.compile(r"^\*\*(.+?)\*\*$", re.M)
_CLAIM = re.compile(r"^- (reproduces on|correct on): jax (.*)$", re.M)
_FAILURE = re.compile(r"^- (fails with|aborts with)(?: \(jax (\d+(?:\.\d+)+)\))?: (.*)$", re.M)
_RAISES = re.compile(r"^`(\w+)` `/(.+)/`")
_ABORTS = re.compile(r"^`/(.+)/`")
_TICKS = re.compile(r"`([^`]+)`")


@dataclasses.dataclass(frozen=True)
class KnownBug:
    """One entry of docs/found-bugs.md, as `match` uses it."""

    number: int
    slug: str
    title: str
    stage: str
    reproduces: tuple = ()
    correct: tuple = ()
    failures: tuple = ()          # (version or None, kind, class, regex): kind "wrong-values" | "raises" | "aborts"
    ops: frozenset = frozenset()  # the ops it names
    all_ops: bool = False         # its xfails line needs them together ("with `a` and `b`")
    transforms: tuple = ()        # ("grad", "vjp") where its line needs a derivative
    partitioner: str = ""         # "shardy" / "gspmd" where its line needs one

    def failures_on(self, version: str) -> list:
        if version in self.correct:
            return []
        own = [f for f in self.failures if f[0] == version]
        return own or [f for f in self.failures if f[0] is None]


@dataclasses.dataclass(frozen=True)
class Match:
    """A finding is known bug `number`: `why`; `also` lists other entries the same evidence names
    (two entries of one root cause, e.g. a CHECK reached with and without a gradient)."""

    number: int
    title: str
    why: str
    also: tuple = ()

    def text(self) -> str:
        more = f" (also {', '.join(map(str, self.also))})" if self.also else ""
        return f"known: found-bugs {self.number}{more} ({self.title}): {self.why}"


def _ops(text: str) -> set:
    out = set()
    for tok in _TICKS.findall(text):
        for part in re.split(r"[+,\s|]+", tok):
            part = re.sub(r"^(jax\.lax|lax|jnp|jax)\.", "", part.strip("()"))
            if part in OP_NAMES:
                out.add(part)
    return out


def _entry(number: int, slug: str, body: str) -> KnownBug:
    t = _TITLE.search(body)
    title = t.group(1) if t else slug
    stage = re.search(r"^- stage: (\S+)", body, re.M)
    claims = {k: tuple(v.strip() for v in vs.split(",")) for k, vs in _CLAIM.findall(body)}
    failures = []
    for verb, ver, value in _FAILURE.findall(body):
        value = value.strip()
        if verb == "fails with" and value.startswith("`AssertionError` at its final"):
            failures.append((ver or None, "wrong-values", "AssertionError", ""))
        elif verb == "fails with" and _RAISES.match(value):
            m = _RAISES.match(value)
            failures.append((ver or None, "raises", m.group(1), m.group(2)))
        elif verb == "aborts with" and _ABORTS.match(value):
            failures.append((ver or None, "aborts", "", _ABORTS.match(value).group(1)))
    xf = re.search(r"^- xfails/cpu\.txt: (.*)$", body, re.M)
    named = xf.group(1) if xf and "none" not in xf.group(1)[:6] else " ".join(
        re.findall(r"^- found(?: again)?: (.*)$", body, re.M))
    line = xf.group(1) if xf else ""
    part = ("gspmd" if re.search(r"partitioner=gspmd|GSPMD (grad|ids)|under GSPMD", line)
            else "shardy" if re.search(r"partitioner=shardy|Shardy (grad|ids)", line) else "")
    return KnownBug(number, slug, title, stage.group(1) if stage else "", claims.get("reproduces on", ()),
                    claims.get("correct on", ()), tuple(failures), frozenset(_ops(named)),
                    bool(re.search(r"`[a-z_]+` and `[a-z_]+`", line)),
                    ("grad", "vjp") if re.search(r"grad ?[/|] ?vjp", line) else (), part)


def load(path: str | None = None) -> list:
    """The entries of docs/found-bugs.md (`PAGE`, or `path`); [] when the page is not there
    (an installed copy without the docs): every finding is then new."""
    try:
        with open(path or PAGE, encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return []
    return [_entry(int(m.group(1)), m.group(2), m.group(3)) for m in _ENTRY.finditer(text)]


def generalised(regex: str) -> str:
    """`regex` with each number in it made ``\\d+`` (escaped dots and signs kept): the same
    message with other sizes, lines or offsets."""
    return re.sub(r"-?\d+(?:\\\.\d+)*", r"-?\\d+", regex)


def _search(regex: str, text: str) -> bool:
    try:
        return re.search(regex, text) is not None
    except re.error:
        return False


def match(bugs: list, *, version: str, kind: str, text: str = "", cls: str = "", ops=(), transform: str = "",
          partitioner: str = "") -> Match | None:
    """The known bug a finding is, or None. kind: how the finding fails ("aborts" with XLA's fatal
    line `text`, "raises" an exception of class `cls` with message `text`, "wrong-values");
    ops: the shrunk program's ops; transform and partitioner: the program's."""
    exact, loose = [], []
    for bug in bugs:
        for _ver, fkind, fcls, regex in bug.failures_on(version):
            if fkind != kind or kind == "wrong-values":
                continue
            if kind == "raises" and fcls != cls:
                continue
            what = "fatal line" if kind == "aborts" else f"{cls} message"
            verb = "aborts with" if kind == "aborts" else "fails with"
            if text and _search(regex, text):
                exact.append(Match(bug.number, bug.title, f"its {what} matches the entry's `{verb}` /{regex}/"))
            elif text and _search(generalised(regex), text):
                loose.append(Match(bug.number, bug.title, f"its {what} matches the entry's `{verb}` /{regex}/ "
                                                           "with the numbers dropped"))
    if kind == "wrong-values":
        core = {op for op in ops if op not in SHARDING_OPS}
        for bug in bugs:
            if not any(f[1] == "wrong-values" for f in bug.failures_on(version)) or not core or not bug.ops:
                continue
            if not core <= bug.ops or (bug.all_ops and not (bug.ops - SHARDING_OPS) <= core):
                continue
            if bug.transforms and transform not in bug.transforms:
                continue
            if bug.partitioner and partitioner != bug.partitioner:
                continue
            need = " under a derivative" if bug.transforms else ""
            need += f" with {bug.partitioner.upper() if bug.partitioner == 'gspmd' else 'Shardy'}" if bug.partitioner \
                else ""
            exact.append(Match(bug.number, bug.title, f"wrong values from a program of {' + '.join(sorted(core))} "
                                                      f"alone{need}, ops the entry names "
                                                      f"({', '.join(sorted(bug.ops))})"))
    found = exact or loose
    if not found:
        return None
    also = tuple(dict.fromkeys(m.number for m in found[1:] if m.number != found[0].number))
    return dataclasses.replace(found[0], also=also)


# ops that lower to the same HLO op (a family), for `resembles`
_FAMILIES = (("reshape", "expand_dims", "squeeze", "broadcast"),
             ("scatter_set", "scatter_add", "scatter_mul", "scatter_min", "scatter_max"),
             ("gather", "at_get", "take_along_axis"), ("pad", "pad_neg_interior", "jnp_pad"),
             ("dynamic_slice", "dynamic_update_slice"), ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"),
             ("dot_general", "einsum", "matmul"), ("sort", "sort_multi", "argsort", "top_k"))


def _family(op: str) -> str:
    return next((f[0] for f in _FAMILIES if op in f), op)


def resembles(bugs: list, *, version: str, ops=(), transform: str = "") -> Match | None:
    """A wrong-values entry (reproducing on `version`) whose ops, by family, cover the finding's:
    a hint for triage, weaker than `match`."""
    core = {_family(op) for op in ops if op not in SHARDING_OPS}
    for bug in bugs:
        if not core or not any(f[1] == "wrong-values" for f in bug.failures_on(version)):
            continue
        theirs = {_family(op) for op in bug.ops - SHARDING_OPS}
        if not theirs or not core <= theirs or (bug.all_ops and not theirs <= core):
            continue
        if bug.transforms and transform not in bug.transforms:
            continue
        return Match(bug.number, bug.title, f"ops of the same families ({', '.join(sorted(core))}) as the entry's "
                                            f"({', '.join(sorted(bug.ops - SHARDING_OPS))})")
    return None
