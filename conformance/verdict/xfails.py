"""Per-platform expected failures: ``xfails/<platform>.txt``, one entry a line, each with a signature.

A line is ``PATTERN [jax<VERSION | jax>=VERSION] [sometimes] SIGNATURE: REASON``.

PATTERN is a case id in which ``*`` matches any run of characters (nothing else is special,
so the brackets of a case id are literal), or ``re:REGEX`` (a Python regular expression
searched from the start of the id). The optional ``jax<V`` / ``jax>=V`` token limits the entry
to the installed JAX versions. ``sometimes`` marks a difference that shows only for some data
or parameters under the id: such a case passes when it agrees (otherwise an agreeing case is
"xpass", a stale entry). SIGNATURE says *what* is expected, and the entry matches only that:

* ``mismatch(CLASS, ...)`` -- XLA's values differ from refsim's (or from the exact sum), and
  every differing element is of one of the named classes of `conformance.verdict.compare.element_classes`
  (``nan-dropped``, ``nan-introduced``, ``inf``, ``subnormal-flushed``, ``signed-zero``,
  ``1-ulp``, ``value``; ``any`` for every class, which is reported as too broad); a layout
  difference or a value difference with no classified element is not one;
* ``model(NAME)`` -- XLA's values differ from refsim's but equal what the platform model NAME
  of `conformance.verdict.platform_models` predicts (a NumPy model of the platform's own semantics);
* ``raises(ExceptionClass)`` or ``raises(ExceptionClass, /REGEX/)`` -- XLA (never refsim)
  raises that class (by name, or a subclass) with a message REGEX searches (no REGEX: too broad);
  the XLA side's exception and message, never refsim's (JAX's tracer rejecting a program on both
  sides with the same class and message is the XLA side's: `conformance.engine.runner`);
* ``unsupported`` -- the platform cannot run it at all (no lowering, no thunk; the XLA side says so):
  the case is reported "unsupported", never a pass;
* ``crash`` -- the case aborts the XLA process (a fatal CHECK): it is not run, and is "xfail".
  Should such a case run anyway, only what ``aborts()`` accepts (below, any fatal line) is this;
* ``aborts(/REGEX/)`` -- the case may abort the XLA process with a fatal CHECK: a worker process runs
  it (`--processes`), and its death is "xfail" only when the worker was killed by SIGABRT while XLA
  compiled or ran the case (the runner's step marker, `conformance.engine.workers.step`, says "xla") and
  XLA's own fatal line (``F1205 ... file.cc:N] Check failed: ...``: the last one the worker wrote in
  that step; never the rest of stderr) matches REGEX. Any other death is an error naming the entry and
  why: another signal (SIGKILL: the OOM killer; SIGSEGV), an exit with any code, a death in refsim's
  step or the comparison, on the XLA side after refsim had raised, in a check that runs both sides
  together, no fatal line (glibc's own aborts, a Python ``os.abort``) or one REGEX does not match.
  With ``sometimes``, the data or parameters that do not abort it pass. Where no worker runs it (in
  this process, a distributed run) it is not run, as a ``crash``.

Every signature accepts only a failure of the XLA side (a refsim-side exception, refsim outside the
sum bound, a check that cannot say which side failed, a failure record without a side: never). Anything
else about a listed case -- refsim raising, refsim outside the sum bound, a layout difference,
another exception, another class of value difference, a value difference no element class describes,
a death -- is an "error" naming the entry and what did not match: an entry never masks a failure it
does not describe.
Blank lines and ``#`` comments are ignored.
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal

from conformance.verdict import platform_models

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.

__all__ = ["CLASSES", "XLA_STEP", "Entry", "XfailList", "abort_failure", "default_path", "exception_failure",
           "comparison_failure", "load", "parse"]

_VERSION_TOKEN = re.compile(r"^jax(<|<=|>=|>|==)(\d+(?:\.\d+)*)$")
CLASSES = ("nan-dropped", "nan-introduced", "inf", "subnormal-flushed", "signed-zero", "1-ulp", "value")
_SIGNATURE = re.compile(
    r"^(?:(?P<sometimes>sometimes)\s+)?"
    r"(?P<sig>mismatch\((?P<classes>[^)]*)\)|model\((?P<model>[\w.-]+)\)"
    r"|raises\((?P<exc>[\w.]+)(?:\s*,\s*/(?P<msg>.*?)/)?\)|aborts\((?:/(?P<abort>.*?)/)?\)|unsupported|crash)"
    r"\s*:\s*(?P<reason>.*)$")
_VALUE_KINDS = ("values", "bound", "ulp")
# The step of a task in which XLA compiles or runs the case (the runner marks each step in a worker's
# stderr log: `conformance.engine.workers.step`); a death in any other step is never an XLA abort.
XLA_STEP = "xla"
_STEPS = {
    "refsim": "in refsim's step (refsim evaluating the case), which is never an XLA abort",
    "xla-after-refsim": ("on the XLA side after refsim had raised (refsim's failure came first, and a refsim "
                         "failure is never expected)"),
    "compare": "while the results were compared (this project's code, not XLA)",
    "check": "in a check that runs refsim and XLA together (which side aborted cannot be told)",
    "shrink": "while a failure was shrunk (the case had already failed otherwise)",
}
_FORMAT = ("write 'PATTERN [jax<V] [sometimes] SIGNATURE: REASON' with SIGNATURE one of mismatch(CLASS,...), "
           "model(NAME), raises(ExceptionClass, /message regex/), aborts(/fatal line regex/), unsupported, crash")


def _version_tuple(text: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


@dataclasses.dataclass(frozen=True)
class Entry:
    """One line: the pattern, the expected failure (`kind` and its details), why, and where it came from.

    kind: "mismatch" (`classes`), "model" (`model`), "raises" (`exception`, `message`), "aborts"
    (`message`: the fatal line's regex), "unsupported" or "crash".
    """

    pattern: str
    reason: str
    kind: str = "mismatch"
    classes: tuple = ("any",)
    model: str = ""
    exception: str = ""
    message: str = ""
    sometimes: bool = False
    version: tuple | None = None   # (op, (major, minor, patch)) or None
    line: int = 0
    source: str = ""

    @property
    def where(self) -> str:
        """``FILE:LINE`` of the entry (``line N`` when parsed from text without a file name)."""
        return f"{self.source}:{self.line}" if self.source else f"line {self.line}"

    @property
    def unsupported(self) -> bool:
        return self.kind == "unsupported"

    @property
    def crash(self) -> bool:
        return self.kind == "crash"

    @property
    def aborts(self) -> bool:
        """The case may abort the process running it: only a worker process may run it."""
        return self.kind == "aborts"

    @property
    def signature(self) -> str:
        """The signature as written in the file (normalised)."""
        if self.kind == "mismatch":
            return f"mismatch({', '.join(self.classes)})"
        if self.kind == "model":
            return f"model({self.model})"
        if self.kind == "raises":
            return f"raises({self.exception}" + (f", /{self.message}/)" if self.message else ")")
        if self.kind == "aborts":
            return f"aborts(/{self.message}/)" if self.message else "aborts()"
        return self.kind

    def too_broad(self) -> str:
        """Why the signature accepts more than one specific failure ('' when it does not)."""
        if self.kind == "mismatch" and "any" in self.classes:
            return "mismatch(any) accepts every value difference; name the classes that occur"
        if self.kind == "raises" and not self.message:
            return f"raises({self.exception}) accepts any message; add a /message regex/"
        if self.kind == "aborts" and not self.message:
            return "aborts() accepts any abort; add the /fatal line regex/ (e.g. /Check failed: .../)"
        return ""

    @property
    def models(self) -> tuple:
        """The platform models (`conformance.verdict.platform_models`) a failure is checked against."""
        return (self.model,) if self.kind == "model" else ()

    def expecting(self, failure: dict | None) -> "Entry":
        """The entry that speaks for `failure`: this one (`Entries` picks among several)."""
        return self

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

    def expects(self, failure: dict | None) -> tuple[bool, str]:
        """(True, '') when `failure` (from `comparison_failure` / `exception_failure` / `abort_failure`)
        is what this entry describes; else (False, why not)."""
        if not failure:
            return False, "the check reported no failure signature to match"
        kind, side = failure.get("kind"), failure.get("side")
        if kind == "aborts":
            return self._expects_death(failure)
        if side != "xla":
            return False, f"the failure is on the {side or 'unknown'} side (only XLA-side failures can be expected)"
        if kind == "accepted":
            return False, "XLA accepted a program that refsim (following JAX's rules) rejects"
        if kind == "unsupported":
            return (True, "") if self.kind == "unsupported" else (False, "the platform cannot run it (unsupported)")
        if kind == "raises":
            if self.kind != "raises":
                return False, f"XLA raised {failure.get('exception')}: {_first_line(failure.get('message', ''))}"
            names = failure.get("exception_mro") or [failure.get("exception")]
            if self.exception not in names:
                return False, f"XLA raised {failure.get('exception')}, not {self.exception}"
            if self.message and not re.search(self.message, failure.get("message", "")):
                return False, f"XLA's message does not match /{self.message}/: {_first_line(failure.get('message', ''))}"
            return True, ""
        if kind == "mismatch":
            if failure.get("layout"):
                return False, f"the layout differs ({', '.join(failure['layout'])}), not only values"
            if self.kind == "model":
                ok = (failure.get("models") or {}).get(self.model)
                if ok is None:
                    return False, f"model {self.model!r} does not apply to this case"
                return (True, "") if ok else (False, f"XLA's values differ from model {self.model!r} too")
            if self.kind != "mismatch":
                return False, f"XLA's values differ ({', '.join(failure.get('classes', ()))}); expected {self.signature}"
            if not failure.get("classes"):
                return False, "the values differ, but no differing element has a class an entry can name"
            if "any" in self.classes:
                return True, ""
            extra = sorted(set(failure.get("classes", ())) - set(self.classes))
            if extra:
                return False, f"values differ by class {', '.join(extra)}, not only {', '.join(self.classes)}"
            return True, ""
        return False, f"unrecognised failure {failure!r}"

    def _expects_death(self, failure: dict) -> tuple[bool, str]:
        """An `abort_failure`: only ``aborts`` (and ``crash``) accept one, and only a SIGABRT during
        XLA's step with XLA's fatal line (matching the regex)."""
        how = failure.get("how") or "died"
        fatal = (failure.get("fatal_line") or "").strip()
        step = failure.get("step")
        if self.kind not in ("aborts", "crash"):
            said = _first_line(fatal or failure.get("stderr_tail") or "") or "nothing on stderr"
            return False, f"the process running it died ({how}: {said})"
        code = failure.get("exitcode")
        if failure.get("signal") != "SIGABRT":
            why = (f"the worker was killed by {failure['signal']}, not by SIGABRT" if failure.get("signal") else
                   f"the worker exited with code {code}, it was not killed by SIGABRT" if code is not None else
                   "the worker's exit status is unknown, not a death by SIGABRT")
        elif step != XLA_STEP:
            why = (f"the worker was killed by SIGABRT {_STEPS[step]}" if step in _STEPS else
                   f"the worker was killed by SIGABRT in its task's {step!r} step" if step else
                   "the worker was killed by SIGABRT before its task marked a step")
            why += ", not while XLA compiled or ran the case"
        elif not fatal:
            why = "the worker was killed by SIGABRT while XLA ran the case, but XLA wrote no fatal line"
        elif self.message and not re.search(self.message, fatal):
            why = f"XLA's fatal line does not match /{self.message}/: {fatal[:300]}"
        else:
            return True, ""
        wanted = f"a fatal line /{self.message}/ matches" if self.message else "its fatal line"
        return False, (f"{why}; the xfails entry at {self.where} {self.signature} accepts only a worker killed by "
                       f"SIGABRT while XLA compiles or runs the case, with {wanted}")


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0][:200] if (text or "").strip() else ""


# -- failure signatures: what a check saw, in the terms an entry matches ------------------------
def comparison_failure(result, models: dict | None = None) -> dict:
    """The signature of a `conformance.verdict.compare.ComparisonResult` that is not ok: which side,
    which element classes, any layout (non-value) differences, and platform-model verdicts."""
    sides = {m.side for m in result.mismatches}
    layout = sorted({m.kind for m in result.mismatches if m.kind not in _VALUE_KINDS})
    return {"kind": "mismatch", "side": "refsim" if "refsim" in sides else "xla",
            "classes": list(result.classes), "layout": layout, "models": dict(models or {})}


def abort_failure(fatal_line: str | None, stderr_tail: str | None, *, exitcode: int | None = None,
                  step: str | None = None) -> dict:
    """The failure signature of a worker process that died running a case: how (`exitcode` as
    `multiprocessing.Process.exitcode` gives it: -N for a death by signal N; None: unknown), in which
    step of its task (`XLA_STEP` while XLA compiles or runs the case; None: none marked), the last
    fatal-log line written in that step (XLA's "F... file.cc:N] Check failed: ...") and its last
    stderr lines (for the reader only: no entry matches them)."""
    sig = None
    if exitcode is not None and exitcode < 0:
        try:
            sig = signal.Signals(-exitcode).name
        except ValueError:
            sig = f"signal {-exitcode}"
    how = (f"killed by {sig}" if sig else f"exit code {exitcode}" if exitcode is not None
           else "gone (exit status unknown)")
    return {"kind": "aborts", "side": "xla" if step == XLA_STEP else (step or "unknown"), "exitcode": exitcode,
            "signal": sig, "how": how, "step": step, "fatal_line": fatal_line or "", "stderr_tail": stderr_tail or ""}


def exception_failure(side: str, exc: BaseException, *, unsupported: bool = False) -> dict:
    """The signature of an exception `side` ("xla", "refsim" or "unknown") raised."""
    if unsupported:
        return {"kind": "unsupported", "side": side, "message": str(exc)}
    return {"kind": "raises", "side": side, "exception": type(exc).__name__,
            "exception_mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}


def _checked_regex(text: str | None, what: str, where: str) -> str:
    """`text` ('' for None) after checking it compiles; a ValueError naming the line otherwise."""
    text = text or ""
    try:
        re.compile(text)
    except re.error as e:
        raise ValueError(f"{where}: {what} pattern /{text}/ is not a valid regular expression ({e}).") from None
    return text


def parse(text: str, *, source: str = "<xfails>") -> list[Entry]:
    """The entries of an xfails file; a line without a signature and reason is a ValueError naming it."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        pattern, rest = parts[0], (parts[1] if len(parts) > 1 else "").strip()
        version = None
        tok = rest.split(None, 1)
        if tok and _VERSION_TOKEN.match(tok[0]):
            op, v = _VERSION_TOKEN.match(tok[0]).groups()
            version = (op, _version_tuple(v))
            rest = tok[1] if len(tok) > 1 else ""
        m = _SIGNATURE.match(rest)
        if not rest or m is None or not m.group("reason").strip():
            raise ValueError(f"{source}:{n}: entry {pattern!r} has no signature and reason ({rest!r}); {_FORMAT}.")
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as e:
                raise ValueError(f"{source}:{n}: pattern {pattern!r} is not a valid regular expression ({e}).") from None
        sig = m.group("sig")
        kw: dict = {}
        if sig.startswith("mismatch"):
            classes = tuple(c.strip() for c in m.group("classes").split(",") if c.strip())
            bad = [c for c in classes if c not in CLASSES + ("any",)]
            if not classes or bad:
                raise ValueError(f"{source}:{n}: mismatch({m.group('classes')}) names "
                                 f"{'no class' if not classes else 'unknown classes ' + repr(bad)}; "
                                 f"choose from {', '.join(CLASSES)} (or any).")
            kw = dict(kind="mismatch", classes=classes)
        elif sig.startswith("model"):
            if m.group("model") not in platform_models.MODELS:
                raise ValueError(f"{source}:{n}: model({m.group('model')}) is not a platform model; choose from "
                                 f"{', '.join(platform_models.MODELS)}.")
            kw = dict(kind="model", model=m.group("model"))
        elif sig.startswith("raises"):
            kw = dict(kind="raises", exception=m.group("exc"),
                      message=_checked_regex(m.group("msg"), "message", f"{source}:{n}"))
        elif sig.startswith("aborts"):
            kw = dict(kind="aborts", message=_checked_regex(m.group("abort"), "fatal line", f"{source}:{n}"))
        else:
            kw = dict(kind=sig)
        out.append(Entry(pattern, m.group("reason").strip(), sometimes=bool(m.group("sometimes")), version=version,
                         line=n, source=source, **kw))
    return out


class Entries:
    """Every entry matching one case, in file order, when more than one does: a failure is
    expected when any of them expects it (a multi-axis ``axis_index_ppermute`` is listed both for
    XLA:CPU's arithmetic and for jax 0.10's device numbering; the first line alone made the second
    failure an error). A case is not run when any of them says it crashes, and its agreeing is an
    unexpected pass unless every one of them says "sometimes"."""

    def __init__(self, entries):
        self.entries = tuple(entries)

    def _first(self, pred=None) -> Entry:
        return next((e for e in self.entries if pred is None or pred(e)), self.entries[0])

    @property
    def crash(self) -> bool:
        return any(e.crash for e in self.entries)

    @property
    def aborts(self) -> bool:
        return any(e.aborts for e in self.entries)

    @property
    def sometimes(self) -> bool:
        return all(e.sometimes for e in self.entries)

    @property
    def models(self) -> tuple:
        return tuple(dict.fromkeys(m for e in self.entries for m in e.models))

    def expecting(self, failure: dict | None) -> Entry:
        """The first entry that expects `failure`, else the first entry."""
        return self._first(lambda e: e.expects(failure)[0])

    def expects(self, failure: dict | None) -> tuple[bool, str]:
        whys = []
        for e in self.entries:
            ok, why = e.expects(failure)
            if ok:
                return True, ""
            whys.append(f"{e.signature}: {why}")
        return False, "; ".join(whys)

    def __getattr__(self, name):
        # reason, pattern, signature, kind, unsupported, line: of the entry that decides a case that
        # agreed or was not run (the crash entry, else one that does not say "sometimes")
        if name.startswith("__") or name == "entries":
            raise AttributeError(name)
        return getattr(self._first(lambda e: e.crash) if self.crash else self._first(lambda e: not e.sometimes), name)

    def __repr__(self):
        return f"Entries({list(self.entries)!r})"


class XfailList:
    """The entries that apply to the installed JAX, with bookkeeping of what each one matched."""

    def __init__(self, entries: list[Entry], *, jax_version: str | None = None, source: str = "<xfails>"):
        if jax_version is None:
            import jax  # not at the top: the runner reads its xfails file before it configures the platform

            jax_version = jax.__version__
        self.source = source
        self.entries = [e for e in entries if e.applies_to(jax_version)]
        self.used: set[int] = set()

    def lookup(self, case_id: str) -> "Entry | Entries | None":
        """The entry matching `case_id`, `Entries` when several do (each marked used), or None."""
        hits = [(i, e) for i, e in enumerate(self.entries) if e.matches(case_id)]
        self.used.update(i for i, _ in hits)
        if not hits:
            return None
        return hits[0][1] if len(hits) == 1 else Entries(e for _, e in hits)

    def unused(self) -> list[Entry]:
        """Entries no case of this run matched (perhaps stale; perhaps just not drawn this run)."""
        return [e for i, e in enumerate(self.entries) if i not in self.used]

    def where(self, entry: Entry) -> str:
        return f"{self.source}:{entry.line}"

    def __len__(self):
        return len(self.entries)


def audit(xf: XfailList, results: list) -> dict:
    """Per entry of `xf` what this run's `results` did under it, and the entries to fix:
    "stale" (every case it matched agreed, or it matched none), "too_broad" (its signature
    accepts any value difference or message), "mismatched" (cases it matched that failed
    otherwise: they are errors)."""
    rows = []
    for e in xf.entries:
        hit = [r for r in results if e.matches(r.case_id)]
        count = {s: sum(r.status == s for r in hit) for s in ("xfail", "pass", "xpass", "error", "fail",
                                                              "unsupported", "timeout")}
        rows.append(dict(entry=f"{e.pattern} ({xf.where(e)})", signature=e.signature, cases=len(hit), **count))
    stale = [r["entry"] for r, e in zip(rows, xf.entries)
             if r["cases"] and not (r["xfail"] or r["unsupported"]) and not r["error"] and not r["fail"]]
    broad = [f"{e.pattern} ({xf.where(e)}): {e.too_broad()}" for e in xf.entries if e.too_broad()]
    return {"entries": rows, "stale": stale, "too_broad": broad}


def default_path(platform: str) -> str:
    """``xfails/<platform>.txt`` at the project root."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # conformance/verdict/
    return os.path.join(root, "xfails", f"{platform}.txt")


def load(path_or_platform: str | None, *, platform: str = "cpu", jax_version: str | None = None) -> XfailList:
    """The xfails of a file path, or of `platform`'s default file when None (missing default: empty)."""
    path = path_or_platform or default_path(platform)
    if not os.path.exists(path):
        if path_or_platform:
            raise ValueError(f"xfails file {path!r} does not exist; pass a file of 'PATTERN SIGNATURE: REASON' "
                             "lines (an empty file expects nothing) or leave --xfails out to use "
                             "xfails/<platform>.txt.")
        return XfailList([], jax_version=jax_version, source=path)
    with open(path, encoding="utf-8") as fh:
        return XfailList(parse(fh.read(), source=path), jax_version=jax_version, source=path)
