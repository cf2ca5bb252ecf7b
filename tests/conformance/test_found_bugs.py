"""docs/found-bugs.md holds to its claims on the installed JAX.

Each entry says on which versions its reproducer shows the bug (`reproduces on: jax …`), on which it
prints its result and exits 0 (`correct on: jax …`), and how it fails where it reproduces: its own
final `assert` (wrong values), an exception class with a message regex, or an abort with XLA's fatal
line. Every block runs in a fresh Python (it sets its own device count before JAX starts); the test
fails when the outcome is not the one the entry claims for the installed version, and skips a
version the page makes no claim about. The checker (`parse_entries`, `run_block`, `judge`) is tested
on synthetic entries below, so a false claim is known to fail.
"""
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "found-bugs.md"
# The page's versions are jax/jaxlib pairs: a mixed install matches no column.
INSTALLED = version("jax") if version("jax") == version("jaxlib") else None
#: The jax/jaxlib pairs the page claims about, oldest first (the supported range, docs/xla_backend.md).
PAGE_VERSIONS = ("0.9.2", "0.10.2", "0.11.2", "0.12.0.1")

CORRECT = "correct"
_VERSIONS = re.compile(r"^jax (\d+(?:\.\d+)+(?:, \d+(?:\.\d+)+)*)$")
_CLAIM = re.compile(r"^- (reproduces on|correct on): (.*)$", re.M)
_FAILURE = re.compile(r"^- (fails with|aborts with)(?: \(jax (\d+(?:\.\d+)+)\))?: (.*)$", re.M)
_WRONG_VALUES = re.compile(r"^`AssertionError` at its final `assert` \(wrong values\)$")
_RAISES = re.compile(r"^`(\w+)` `/(.+)/`(?: \([^`]*\))?$")
_ABORTS = re.compile(r"^`/(.+)/`(?: \([^`]*\))?$")
_FATAL = re.compile(r"^F\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\] .*$", re.M)


@dataclass(frozen=True)
class Failure:
    """How a reproducer fails where it reproduces."""
    kind: str            # "wrong-values" | "raises" | "aborts"
    cls: str = ""        # the exception's class name, for "raises"
    regex: str = ""      # searched in the message ("raises") or in the fatal line ("aborts")

    def __str__(self):
        return {"wrong-values": "AssertionError at its final assert (wrong values)",
                "raises": f"{self.cls} /{self.regex}/", "aborts": f"abort /{self.regex}/"}[self.kind]


@dataclass
class Entry:
    number: int
    slug: str
    reproduces: tuple = ()
    correct: tuple = ()
    failures: dict = field(default_factory=dict)   # version (None: every version) -> Failure
    blocks: list = field(default_factory=list)     # [(name, code)]
    errors: list = field(default_factory=list)     # what the page got wrong, for the format test

    def expect(self, ver):
        """CORRECT, the Failure claimed on `ver`, or None where the page makes no claim."""
        if ver in self.correct:
            return CORRECT
        if ver in self.reproduces:
            return self.failures.get(ver, self.failures.get(None))
        return None


def _failure(verb, text):
    if verb == "fails with" and _WRONG_VALUES.match(text):
        return Failure("wrong-values")
    m = (_RAISES if verb == "fails with" else _ABORTS).match(text)
    if not m:
        return None
    if verb == "aborts with":
        return Failure("aborts", regex=m.group(1))
    return Failure("raises", cls=m.group(1), regex=m.group(2))


def parse_entries(text):
    """The page's entries (`## N. slug` sections) with their claim lines and reproducer blocks."""
    entries = []
    for m in re.finditer(r"^## (\d+)\. (\S+)\n(.*?)(?=^## |\Z)", text, re.M | re.S):
        e, body = Entry(int(m.group(1)), m.group(2)), m.group(3)
        e.blocks = re.findall(r"<!-- reproducer: (\w+) -->\n```text\n(.*?)\n```", body, re.S)
        for kind, value in _CLAIM.findall(body):
            v = _VERSIONS.match(value.strip())
            if not v:
                e.errors.append(f"`{kind}: {value}` is not `jax X, Y`")
                continue
            setattr(e, kind.split()[0], tuple(v.group(1).split(", ")))
        for verb, ver, value in _FAILURE.findall(body):
            f = _failure(verb, value.strip())
            if f is None:
                e.errors.append(f"cannot read `{verb}: {value}`")
            elif (ver or None) in e.failures:
                e.errors.append(f"two failures named for {ver or 'every version'}")
            else:
                e.failures[ver or None] = f
        if set(e.reproduces) & set(e.correct):
            e.errors.append(f"claimed both ways on {sorted(set(e.reproduces) & set(e.correct))}")
        for ver in e.reproduces:
            if e.expect(ver) is None:
                e.errors.append(f"reproduces on {ver} but names no failure for it")
        for ver in e.failures:
            if ver is not None and ver not in e.reproduces:
                e.errors.append(f"names a failure for {ver}, where it does not claim to reproduce")
        if not e.blocks:
            e.errors.append("has no reproducer block")
        entries.append(e)
    return entries


@dataclass(frozen=True)
class Outcome:
    """How one run of a block ended."""
    returncode: int
    stdout: str
    stderr: str
    exc_class: str = ""          # set when Python raised
    exc_message: str = ""
    at_final_assert: bool = False

    def describe(self):
        if self.exc_class:
            where = " at its final assert" if self.at_final_assert else ""
            return f"raised {self.exc_class}{where}: {self.exc_message[:400]}"
        if self.returncode == 0:
            return f"exited 0 printing {self.stdout.strip()[:300]!r}"
        if self.returncode < 0:
            fatal = _FATAL.search(self.stderr)
            sig = signal.Signals(-self.returncode).name
            return f"died by {sig}" + (f" with fatal line {fatal.group(0)!r}" if fatal else " with no fatal line")
        return f"exited {self.returncode} without a Python exception"


# Runs the block as __main__ and records the exception it ends with (then re-raises it, so the
# traceback still reaches stderr); an abort leaves no record, and its signal is the outcome.
_RUNNER = r"""
import json, runpy, sys, traceback
block, record = sys.argv[1], sys.argv[2]
try:
    runpy.run_path(block, run_name="__main__")
except BaseException as e:
    last = (traceback.extract_tb(e.__traceback__) or [None])[-1]
    with open(record, "w") as f:
        json.dump({"class": type(e).__name__, "message": str(e),
                   "file": last.filename if last else "", "line": last.lineno if last else 0}, f)
    raise
"""


def run_block(code, workdir, timeout=300):
    """Run one block in a fresh Python on the installed JAX (CPU, no inherited JAX/XLA settings)."""
    workdir = Path(workdir)
    block, record = workdir / "block.py", workdir / "raised.json"
    block.write_text(code + "\n")
    record.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env["JAX_PLATFORMS"] = "cpu"
    r = subprocess.run([sys.executable, "-c", _RUNNER, str(block), str(record)], cwd=workdir, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if not record.exists():
        return Outcome(r.returncode, r.stdout, r.stderr)
    raised = json.loads(record.read_text())
    asserts = [i for i, line in enumerate(code.splitlines(), 1) if line.startswith("assert ")]
    final = bool(asserts) and raised["file"] == str(block) and raised["line"] == asserts[-1]
    return Outcome(r.returncode, r.stdout, r.stderr, raised["class"], raised["message"], final)


def judge(expect, out, ver):
    """None when `out` is what the claim `expect` (CORRECT or a Failure) says for jax `ver`, else why not."""
    if expect == CORRECT:
        if out.returncode == 0 and not out.exc_class and re.search(rf"^{re.escape(ver)}\b", out.stdout, re.M):
            return None
        return f"claimed correct on jax {ver} (exit 0 printing the version first), but it {out.describe()}"
    if expect.kind == "wrong-values":
        ok = out.exc_class == "AssertionError" and out.at_final_assert
    elif expect.kind == "raises":
        ok = out.exc_class == expect.cls and re.search(expect.regex, out.exc_message) is not None
    else:
        fatal = _FATAL.search(out.stderr)
        ok = (out.returncode == -signal.SIGABRT and not out.exc_class and fatal is not None
              and re.search(expect.regex, fatal.group(0)) is not None)
    if ok:
        return None
    return f"claimed to reproduce on jax {ver} with {expect}, but it {out.describe()}"


ENTRIES = parse_entries(PAGE.read_text())
CASES = [(e, name, code) for e in ENTRIES for name, code in e.blocks]


def test_page_claims_are_readable_and_complete():
    assert len(ENTRIES) >= 25 and len(CASES) >= len(ENTRIES), [e.number for e in ENTRIES]
    assert [e.number for e in ENTRIES] == list(range(1, len(ENTRIES) + 1))
    bad = {e.number: e.errors for e in ENTRIES if e.errors}
    assert not bad, f"entries whose claims cannot be read: {bad}"
    unclaimed = {e.number: [v for v in PAGE_VERSIONS if e.expect(v) is None] for e in ENTRIES}
    assert not any(unclaimed.values()), f"entries silent about a page version: {unclaimed}"


def test_summary_table_agrees_with_entries():
    text = PAGE.read_text()
    cells = r" \| ".join([r"(yes|no[^|]*?)"] * len(PAGE_VERSIONS))
    rows = re.findall(rf"^\| (\d+) \| .*? \| [^|]* \| {cells} \|$", text, re.M)
    assert len(rows) == len(ENTRIES), "the summary table has a row per entry"
    for (num, *cells), e in zip(rows, ENTRIES):
        assert int(num) == e.number
        for cell, ver in zip(cells, PAGE_VERSIONS):
            said = "reproduces" if cell == "yes" else "correct"
            claim = "reproduces" if ver in e.reproduces else "correct"
            assert said == claim, f"entry {e.number}: the table says {said} on {ver}, the entry {claim}"


def test_rediscovered_table_lists_the_bugs_fixed_upstream():
    """"Rediscovered (fixed upstream)": one row per entry that reproduces on an older page version and is
    correct on the newest (a bug JAX or XLA fixed), naming a version where it reproduces, the first page
    version after its last reproducing one (where it is correct), and the fix."""
    section = re.search(r"^## Rediscovered \(fixed upstream\)\n(.*?)(?=^## )", PAGE.read_text(), re.M | re.S)
    assert section, "docs/found-bugs.md has no '## Rediscovered (fixed upstream)' section"
    rows = re.findall(r"^\| \[(\d+)\]\(#[^)]+\) \| jax ([\d.]+) \| jax ([\d.]+) \| (.+) \|$", section.group(1), re.M)
    by_number = {e.number: e for e in ENTRIES}
    fixed = {e.number for e in ENTRIES if e.reproduces and PAGE_VERSIONS[-1] in e.correct}
    assert sorted(int(r[0]) for r in rows) == sorted(fixed), "the table lists exactly the entries fixed upstream"
    for number, found, first_fixed, fix in rows:
        e = by_number[int(number)]
        last = max(PAGE_VERSIONS.index(v) for v in e.reproduces)
        assert found in e.reproduces, f"entry {number}: found on jax {found}, but it claims {e.reproduces}"
        assert first_fixed == PAGE_VERSIONS[last + 1], f"entry {number}: first fixed on jax {PAGE_VERSIONS[last + 1]}"
        assert all(v in e.correct for v in PAGE_VERSIONS[last + 1:]), f"entry {number} comes back after its fix"
        assert fix.strip() and fix.strip() != "?", f"entry {number}: name the fix (a change or the release)"


@pytest.mark.parametrize("entry, name, code", CASES, ids=[name for _, name, _ in CASES])
def test_reproducer_holds_to_its_claim(entry, name, code, tmp_path):
    lines = code.splitlines()
    assert len(lines) <= 15, f"{name}: {len(lines)} lines"
    assert not re.search(r"^\s*(import|from)\s+(refsim|conformance|xla_backend)", code, re.M), name
    assert "np." in code and "want" in code, f"{name}: the correct answer must be computed with NumPy"
    assert lines[-1].startswith("assert "), f"{name}: the block ends in its assert on the values"
    if INSTALLED is None:
        pytest.skip(f"jax {version('jax')} with jaxlib {version('jaxlib')}: the page's claims are for pairs")
    expect = entry.expect(INSTALLED)
    if expect is None:
        pytest.skip(f"found-bugs {entry.number} makes no claim about jax {INSTALLED} "
                    f"(reproduces on {entry.reproduces}, correct on {entry.correct})")
    out = run_block(code, tmp_path)
    problem = judge(expect, out, INSTALLED)
    assert problem is None, f"found-bugs {entry.number} ({name}): {problem}\n--- stderr:\n{out.stderr[-2500:]}"


# The checker itself, on synthetic entries whose claims are true or false.
_OK = 'import numpy as np\ngot = want = np.ones(2)\nprint("9.9", got, want)\nassert np.array_equal(got, want)'
_WRONG = ('import numpy as np\ngot, want = np.ones(2), np.zeros(2)\nprint("9.9", got, want)\n'
          'assert np.array_equal(got, want)')
_EARLY_ASSERT = 'import numpy as np\nassert False, "not the values"\nwant = 1\nassert np.all(want)'
_VALUE_ERROR = 'import numpy as np\nwant = 1\nraise ValueError("unrelated: bad reshape")\nassert np.all(want)'
_FATAL_LINE = ('import os, sys\nsys.stderr.write("F0101 00:00:00.000000   12 x.cc:34] Check failed: a == b\\n")\n'
               'sys.stderr.flush()\n')
_ABORT = _FATAL_LINE + "os.abort()"
_KILL = _FATAL_LINE + "import signal\nos.kill(os.getpid(), signal.SIGKILL)"
_EXIT = _FATAL_LINE + "os._exit(3)"
_WV = Failure("wrong-values")

CHECKER_CASES = [   # (id, block, claim, does the claim hold)
    ("correct-claimed-correct", _OK, CORRECT, True),
    ("correct-claimed-reproduces", _OK, _WV, False),
    ("correct-claimed-to-raise", _OK, Failure("raises", "ValueError", "bad"), False),
    ("wrong-values-claimed", _WRONG, _WV, True),
    ("wrong-values-claimed-correct", _WRONG, CORRECT, False),
    ("wrong-values-claimed-as-exception", _WRONG, Failure("raises", "AssertionError", ".*"), True),
    ("earlier-assert-claimed-wrong-values", _EARLY_ASSERT, _WV, False),
    ("valueerror-claimed-its-message", _VALUE_ERROR, Failure("raises", "ValueError", "^unrelated"), True),
    ("valueerror-claimed-another-message", _VALUE_ERROR, Failure("raises", "ValueError", "Length of sharding"), False),
    ("valueerror-claimed-another-class", _VALUE_ERROR, Failure("raises", "TypeError", "unrelated"), False),
    ("valueerror-claimed-wrong-values", _VALUE_ERROR, _WV, False),
    ("valueerror-claimed-abort", _VALUE_ERROR, Failure("aborts", regex="Check failed"), False),
    ("abort-claimed", _ABORT, Failure("aborts", regex=r"x\.cc:\d+\] Check failed: a == b"), True),
    ("abort-claimed-another-fatal-line", _ABORT, Failure("aborts", regex="Check failed: sliced"), False),
    ("abort-claimed-as-exception", _ABORT, Failure("raises", "AssertionError", "Check failed"), False),
    ("sigkill-claimed-abort", _KILL, Failure("aborts", regex="Check failed: a == b"), False),
    ("exit-3-claimed-abort", _EXIT, Failure("aborts", regex="Check failed: a == b"), False),
]


@pytest.mark.parametrize("block, claim, holds", [c[1:] for c in CHECKER_CASES], ids=[c[0] for c in CHECKER_CASES])
def test_checker_judges_synthetic_claims(block, claim, holds, tmp_path):
    problem = judge(claim, run_block(block, tmp_path, timeout=60), "9.9")
    assert (problem is None) == holds, problem or f"{claim} should not have held"


_SYNTHETIC_PAGE = """
## 1. ok
- reproduces on: jax 9.9
- correct on: jax 9.8
- fails with: `ValueError` `/^bad/`
<!-- reproducer: one -->
```text
want = 1
```

## 2. no-failure
- reproduces on: jax 9.9
<!-- reproducer: two -->
```text
want = 2
```

## 3. both-ways
- reproduces on: jax 9.9, 9.8
- correct on: jax 9.8
- aborts with: `/Check failed/`
- fails with (jax 9.7): `ValueError` `/x/`
<!-- reproducer: three -->
```text
want = 3
```

## 4. unreadable
- reproduces on: 0.12
- fails with: ValueError: something
"""


def test_parser_reads_claims_and_reports_what_it_cannot():
    ok, no_failure, both, unreadable = parse_entries(_SYNTHETIC_PAGE)
    assert not ok.errors and ok.expect("9.8") == CORRECT and ok.expect("9.7") is None
    assert ok.expect("9.9") == Failure("raises", "ValueError", "^bad") and ok.blocks == [("one", "want = 1")]
    assert any("names no failure" in m for m in no_failure.errors)
    assert any("both ways" in m for m in both.errors)
    assert any("does not claim to reproduce" in m for m in both.errors)
    assert any("is not `jax X, Y`" in m for m in unreadable.errors)
    assert any("cannot read" in m for m in unreadable.errors)
    assert any("no reproducer" in m for m in unreadable.errors)


def _page(number, claim_lines, code):
    return f"## {number}. synthetic\n{claim_lines}\n<!-- reproducer: b{number} -->\n```text\n{code}\n```\n\n"


def test_false_version_claims_on_a_page_fail(tmp_path):
    """Through the parser: a correct reproducer claimed to reproduce, and an unrelated ValueError
    claimed as failing with another message, are both reported; their true claims are not."""
    wrong_values = "- fails with: `AssertionError` at its final `assert` (wrong values)"
    page = (_page(1, f"- reproduces on: jax 9.9\n{wrong_values}", _OK)
            + _page(2, "- reproduces on: jax 9.9\n- fails with: `ValueError` `/Length of sharding/`", _VALUE_ERROR)
            + _page(3, "- correct on: jax 9.9", _OK)
            + _page(4, "- reproduces on: jax 9.9\n- fails with: `ValueError` `/^unrelated/`", _VALUE_ERROR))
    entries = parse_entries(page)
    assert not any(e.errors for e in entries), [e.errors for e in entries]
    problems = []
    for e in entries:
        (name, code), = e.blocks
        (tmp_path / name).mkdir()
        problems.append(judge(e.expect("9.9"), run_block(code, tmp_path / name, timeout=60), "9.9"))
    assert "claimed to reproduce" in problems[0] and "exited 0" in problems[0]
    assert "ValueError /Length of sharding" in problems[1] and "unrelated: bad reshape" in problems[1]
    assert problems[2:] == [None, None]
