"""Docs are code: every ```python block of README.md and docs/*.md runs (with Sybil).

A page is one test. Its blocks run in the order they appear and share one namespace, so a
walkthrough may define ``mesh`` in one block and use it in the next. Blocks fenced as
```text, ```bash or anything else are not run. Each page runs in an empty temporary working
directory (a block that writes a report leaves nothing in the checkout) with the 8 virtual CPU
devices that tests/conftest.py configures, and as a script run from there sees the project: the
installed packages, but not the checkout itself on `sys.path` (pytest puts it there for the tests),
so a page that imports `examples` must say how it finds them. A failure names the page, the
block's line and the exception.
"""
import os
import subprocess
import sys
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


def _as_a_script_from(folder: Path, monkeypatch) -> None:
    """What a script run from `folder` imports: the checkout off `sys.path`, no `examples` imported yet."""
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != ROOT])
    for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_doc_page_runs(page, tmp_path, monkeypatch):
    _as_a_script_from(tmp_path, monkeypatch)
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


def _examples_preamble(page: Path) -> str:
    """The lines of `page`'s first ```python block up to its `from examples import` line."""
    block = next(ex.parsed for ex in _DOCS.parse(page) if "from examples import" in str(ex.parsed))
    lines = str(block).splitlines()
    return "\n".join(lines[:next(i for i, ln in enumerate(lines) if ln.startswith("from examples import")) + 1])


@pytest.mark.parametrize("page", [p for p in PAGES if "from examples import" in p.read_text()],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_pages_import_examples_from_any_folder(page, tmp_path):
    """The preamble a page imports `examples` with works in a fresh interpreter from an empty folder
    and from the checkout's root, with the project importable as installed (or on PYTHONPATH)."""
    found = subprocess.run([sys.executable, "-c", "import conformance"], cwd=tmp_path, capture_output=True,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} if found.returncode == 0 else \
        {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    if found.returncode:
        # not installed: expose the three packages alone, as an installed copy would (not examples/)
        (tmp_path / "site").mkdir()
        for pkg in ("refsim", "xla_backend", "conformance"):
            (tmp_path / "site" / pkg).symlink_to(ROOT / pkg)
    code = "import conformance\n" + _examples_preamble(page) + "\nprint('imported', sys.modules['examples'].__file__)\n"
    for cwd in (tmp_path, ROOT):
        out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, env=env,
                             timeout=300)
        assert out.returncode == 0, f"{page.name} from {cwd}: {out.stderr}"
        assert f"imported {ROOT / 'examples' / '__init__.py'}" in out.stdout, out.stdout
