"""Docs are code: every ```python block of README.md and docs/*.md runs (with Sybil).

A page is one test. Its blocks run in the order they appear and share one namespace, so a
walkthrough may define ``mesh`` in one block and use it in the next. Blocks fenced as
```text, ```bash or anything else are not run. Each page runs in an empty temporary working
directory (a block that writes a report leaves nothing in the checkout) with the 8 virtual CPU
devices that tests/conftest.py configures. A failure names the page, the block's line and the
exception.
"""
import tempfile
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# One Sybil for all pages: ```python fences (and any ``>>>`` doctest inside them) are examples.
_DOCS = Sybil(parsers=[PythonCodeBlockParser()], path=str(ROOT), patterns=["*.md"])


def test_pages_are_found():
    assert (ROOT / "README.md") in PAGES and len(PAGES) > 5, PAGES


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_doc_page_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))     # reproducers' default folders land here
    document = _DOCS.parse(page)
    rel = page.relative_to(ROOT).as_posix()
    for example in document:
        try:
            example.evaluate()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: re-raised with the block's location
            raise AssertionError(
                f"{rel}:{example.line}: the ```python block starting on this line raised "
                f"{type(exc).__name__}: {exc}\nFix the block (blocks of a page run in order and share "
                f"one namespace) or fence output and shell commands as ```text / ```bash."
            ) from exc
