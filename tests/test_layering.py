"""The project's layering, read from the code (`ast`), not from what happens to import.

* refsim is the reference engine: it must not depend on what it checks (xla_backend, conformance).
* Packages talk through public names: no `pkg._private` module or name is imported or read
  from another top-level package (a seam another package needs gets a public, documented name).
* The JAX-version layer, refsim/compat.py, is a leaf: it imports nothing from the project, so
  every package may use it; JAX's internals (`jax._src`) are imported there and nowhere else.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
REFSIM = ROOT / "refsim"
FORBIDDEN = ("xla_backend", "conformance")
PROJECT = ("refsim", "xla_backend", "conformance", "bench", "examples")
COMPAT = REFSIM / "compat.py"


def _imports(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def _sources(*packages):
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def _rel(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


@pytest.mark.parametrize("path", sorted(REFSIM.rglob("*.py")), ids=lambda p: str(p.relative_to(REFSIM.parent)))
def test_refsim_never_imports_xla_backend_or_conformance(path):
    bad = [m for m in _imports(path) if m.split(".")[0] in FORBIDDEN]
    assert not bad, f"{path.relative_to(REFSIM.parent)} imports {bad}; refsim must not depend on them"


def test_the_demo_lives_in_conformance():
    import conformance.demo

    assert callable(conformance.demo.main) and not (REFSIM / "demo.py").exists()


# -- public seams between packages ----------------------------------------------------------

def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def cross_package_private_uses(path: pathlib.Path, package: str) -> list[str]:
    """`file:line: dotted.name` for each private module or name of another project package that
    `path` (a module of `package`) imports, or reads as an attribute of a name it imported
    from that package (`api._run`, `refsim.interpreter.api._run`, `plan._check`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    bound: dict[str, str] = {}  # local name -> the dotted project path it stands for
    found = []

    def foreign(dotted: str) -> bool:
        top = dotted.split(".")[0]
        return top in PROJECT and top != package

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if foreign(a.name):
                    if any(_private(s) for s in a.name.split(".")):
                        found.append((node.lineno, a.name))
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and foreign(node.module):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if any(_private(s) for s in full.split(".")):
                    found.append((node.lineno, full))
                bound[a.asname or a.name] = full
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain, base = [], node
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        chain.reverse()
        # report the attribute that is private, once (not again for `a._b.c`)
        if isinstance(base, ast.Name) and base.id in bound and _private(chain[-1]) \
                and not any(_private(c) for c in chain[:-1]):
            found.append((node.lineno, ".".join([bound[base.id], *chain])))
    return [f"{_rel(path)}:{line}: {name}" for line, name in sorted(set(found))]


@pytest.mark.parametrize("package", PROJECT)
def test_packages_use_only_each_others_public_names(package):
    bad = [hit for path in _sources(package) for hit in cross_package_private_uses(path, package)]
    assert not bad, (f"{package} reaches into other packages' private names (give the seam a public, "
                     "documented name in the package that owns it):\n  " + "\n  ".join(bad))


def test_the_private_access_check_sees_every_form(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from refsim import _compat\nfrom refsim.interpreter import api\nimport refsim.interpreter.api\n"
                   "import refsim.mpmd.plan as plan\nfrom bench import _common\n"
                   "api._place(1)\nrefsim.interpreter.api._info(2)\nplan._check_threshold(3)\n"
                   "api.evaluate(4)\nplan.__name__\n")
    got = [h.split(": ", 1)[1] for h in cross_package_private_uses(src, "conformance")]
    assert got == ["refsim._compat", "bench._common", "refsim.interpreter.api._place",
                   "refsim.interpreter.api._info", "refsim.mpmd.plan._check_threshold"]
    assert [h.split(": ", 1)[1] for h in cross_package_private_uses(src, "bench")] == [
        "refsim._compat", "refsim.interpreter.api._place", "refsim.interpreter.api._info",
        "refsim.mpmd.plan._check_threshold"]


# -- the JAX-version layer --------------------------------------------------------------------

def test_the_compat_layer_is_a_public_leaf():
    assert COMPAT.exists(), "refsim/compat.py, the JAX-version compatibility layer, is missing"
    tree = ast.parse(COMPAT.read_text(encoding="utf-8"), str(COMPAT))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.split(".")[0] in PROJECT]
        elif isinstance(node, ast.ImportFrom):
            if node.level > 0 or (node.module or "").split(".")[0] in PROJECT:
                bad.append("." * node.level + (node.module or ""))
    assert not bad, f"refsim/compat.py imports {bad} from the project; it must be a leaf (move that code to its user)"


@pytest.mark.parametrize("package", PROJECT)
def test_jax_internals_are_imported_only_by_the_compat_layer(package):
    bad = [f"{_rel(p)}: {m}" for p in _sources(package) if p != COMPAT
           for m in _imports(p) if m == "jax._src" or m.startswith("jax._src.")]
    assert not bad, ("JAX internals imported outside refsim/compat.py (add a function there, named for "
                     "what it gives and the JAX versions it covers):\n  " + "\n  ".join(bad))
