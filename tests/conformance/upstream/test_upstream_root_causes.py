"""docs/found-bugs.md's "Root causes" table: every entry once, and the entries the hunt's grouper would
join (failure lines equal with the numbers dropped) in one group."""
import re
from itertools import combinations
from pathlib import Path

from conformance.upstream import known

PAGE = Path(__file__).resolve().parents[3] / "docs" / "found-bugs.md"


def _groups():
    text = PAGE.read_text()
    section = re.search(r"^## Root causes\n(.*?)(?=^## )", text, re.M | re.S)
    assert section, "docs/found-bugs.md has no '## Root causes' section"
    rows = [ln for ln in section.group(1).splitlines() if ln.startswith("| ") and not ln.startswith("| cause")]
    return [[int(n) for n in row.split(" | ")[1].split(", ")] for row in rows]


def test_every_entry_is_in_exactly_one_group():
    groups = _groups()
    numbers = [n for g in groups for n in g]
    assert sorted(numbers) == [b.number for b in known.load()], numbers
    # the page's own sentence ("The N entries are M causes.") holds of its table
    claim = re.search(r"The (\d+) entries are (\d+) causes\.", PAGE.read_text())
    assert claim, "docs/found-bugs.md has no 'The N entries are M causes.' sentence"
    assert (int(claim.group(1)), int(claim.group(2))) == (len(numbers), len(groups))


def test_entries_with_the_same_failure_line_numbers_dropped_share_a_group():
    where = {n: i for i, g in enumerate(_groups()) for n in g}
    keys = {}
    for bug in known.load():
        keys[bug.number] = {(kind, cls, known.generalised(regex)) for _v, kind, cls, regex in bug.failures
                            if kind != "wrong-values"}
    pairs = [(a, b) for a, b in combinations(sorted(keys), 2) if keys[a] & keys[b]]
    assert (10, 23) in pairs and (8, 14) in pairs
    assert all(where[a] == where[b] for a, b in pairs), [(a, b) for a, b in pairs if where[a] != where[b]]


def test_the_entries_are_still_read_by_the_claims_test():
    # the section sits between the index and the first entry: no entry's body holds it
    assert all("Root causes" not in b.title for b in known.load())
    text = PAGE.read_text()
    assert text.index("## Root causes") < text.index("## 1. ")
