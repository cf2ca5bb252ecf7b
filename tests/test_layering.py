"""refsim is the reference engine: it must not depend on what it checks (xla_backend, conformance)."""
import ast
import pathlib

import pytest

REFSIM = pathlib.Path(__file__).resolve().parent.parent / "refsim"
FORBIDDEN = ("xla_backend", "conformance")


def _imports(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


@pytest.mark.parametrize("path", sorted(REFSIM.rglob("*.py")), ids=lambda p: str(p.relative_to(REFSIM.parent)))
def test_refsim_never_imports_xla_backend_or_conformance(path):
    bad = [m for m in _imports(path) if m.split(".")[0] in FORBIDDEN]
    assert not bad, f"{path.relative_to(REFSIM.parent)} imports {bad}; refsim must not depend on them"


def test_the_demo_lives_in_conformance():
    import conformance.demo

    assert callable(conformance.demo.main) and not (REFSIM / "demo.py").exists()
