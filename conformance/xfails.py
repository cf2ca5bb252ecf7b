"""Per-platform expected failures: ``xfails/<platform>.txt``, one case id pattern and reason a line.

A line is ``PATTERN [jax<VERSION | jax>=VERSION] REASON``. PATTERN is a case id in which ``*``
matches any run of characters (nothing else is special, so the brackets of a case id are
literal), or ``re:REGEX`` (a Python regular expression searched from the start of the id).
A REASON starting with ``unsupported:`` marks what the platform cannot run at all (no
lowering, no thunk): such a case is reported "unsupported", never a pass. One starting with
``sometimes:`` marks a difference that shows only for some data or parameters under the
case id: such a case passes when it agrees and is "xfail" when it does not. One starting with
``crash:`` marks a case that aborts the XLA process (a fatal CHECK in the compiler): it is not
run at all and reported "xfail" with the reason. Otherwise a
disagreeing or crashing case becomes "xfail", and one that agrees "xpass" (a stale entry).
The optional ``jax<V`` / ``jax>=V`` token limits an entry to the installed JAX versions.
Blank lines and ``#`` comments are ignored.
"""
from __future__ import annotations

import dataclasses
import os
import re

__all__ = ["Entry", "XfailList", "default_path", "load", "parse"]

_VERSION_TOKEN = re.compile(r"^jax(<|<=|>=|>|==)(\d+(?:\.\d+)*)$")


def _version_tuple(text: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


@dataclasses.dataclass(frozen=True)
class Entry:
    """One line: the pattern, why, whether the platform cannot run it at all, and where it came from."""

    pattern: str
    reason: str
    unsupported: bool = False
    sometimes: bool = False
    crash: bool = False
    version: tuple | None = None   # (op, (major, minor, patch)) or None
    line: int = 0

    @property
    def regex(self) -> re.Pattern:
        if self.pattern.startswith("re:"):
            return re.compile(self.pattern[3:])
        return re.compile("^" + ".*".join(re.escape(p) for p in self.pattern.split("*")) + "$")

    def matches(self, case_id: str) -> bool:
        return bool(self.regex.match(case_id))

    def applies_to(self, jax_version: str) -> bool:
        if self.version is None:
            return True
        op, want = self.version
        have = _version_tuple(jax_version)
        return {"<": have < want, "<=": have <= want, ">=": have >= want, ">": have > want,
                "==": have[:len(want)] == want}[op]


def parse(text: str, *, source: str = "<xfails>") -> list[Entry]:
    """The entries of an xfails file; a line without a reason is a ValueError naming it."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        pattern, rest = parts[0], parts[1:]
        version = None
        if rest and _VERSION_TOKEN.match(rest[0]):
            op, v = _VERSION_TOKEN.match(rest[0]).groups()
            version = (op, _version_tuple(v))
            rest = rest[1:]
        reason = " ".join(rest).strip()
        if not reason:
            raise ValueError(f"{source}:{n}: entry {pattern!r} has no reason; write "
                             "'CASE_ID_PATTERN REASON' (prefix the reason with 'unsupported:' for what "
                             "the platform cannot run at all).")
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as e:
                raise ValueError(f"{source}:{n}: pattern {pattern!r} is not a valid regular expression ({e}).") from None
        low = reason.lower()
        out.append(Entry(pattern, reason, low.startswith("unsupported:"), low.startswith("sometimes:"),
                         low.startswith("crash:"), version, n))
    return out


class XfailList:
    """The entries that apply to the installed JAX, with bookkeeping of which ones matched."""

    def __init__(self, entries: list[Entry], *, jax_version: str | None = None, source: str = "<xfails>"):
        if jax_version is None:
            import jax

            jax_version = jax.__version__
        self.source = source
        self.entries = [e for e in entries if e.applies_to(jax_version)]
        self.used: set[int] = set()

    def lookup(self, case_id: str) -> Entry | None:
        """The first entry matching `case_id` (marked used), or None."""
        for i, e in enumerate(self.entries):
            if e.matches(case_id):
                self.used.add(i)
                return e
        return None

    def unused(self) -> list[Entry]:
        """Entries no case of this run matched (perhaps stale; perhaps just not drawn this run)."""
        return [e for i, e in enumerate(self.entries) if i not in self.used]

    def __len__(self):
        return len(self.entries)


def default_path(platform: str) -> str:
    """``xfails/<platform>.txt`` at the project root."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(root, "xfails", f"{platform}.txt")


def load(path_or_platform: str | None, *, platform: str = "cpu", jax_version: str | None = None) -> XfailList:
    """The xfails of a file path, or of `platform`'s default file when None (missing default: empty)."""
    path = path_or_platform or default_path(platform)
    if not os.path.exists(path):
        if path_or_platform:
            raise ValueError(f"xfails file {path!r} does not exist; pass a file of 'CASE_ID_PATTERN REASON' "
                             "lines or leave --xfails out to use xfails/<platform>.txt.")
        return XfailList([], jax_version=jax_version, source=path)
    with open(path, encoding="utf-8") as fh:
        return XfailList(parse(fh.read(), source=path), jax_version=jax_version, source=path)
