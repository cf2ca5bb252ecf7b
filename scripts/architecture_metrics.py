"""Measures of a package's shape, for the renovation's before/after (docs/architecture.md).

    python scripts/architecture_metrics.py [PACKAGE_DIR ...]     # default: conformance

Per package: modules and subpackages ("rooms": the package's top-level modules and subpackages),
floors (levels of the rooms' import graph after merging cycles) and back-arrows (room-to-room
imports inside a cycle), import cycles between modules (strongly connected components of the
module import graph, function-level imports included), the share of imports written inside
functions, and the longest function. Reads source with `ast`; imports nothing it measures.
"""
from __future__ import annotations

import ast
import pathlib
import sys


def _modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    base = root.parent
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(base).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(mod: str, path: pathlib.Path, modules: dict):
    """(target module, at function level) for every project import of `mod`."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for a in child.names:
                    found.append((a.name, in_function))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (child.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                for a in child.names:
                    found.append((f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base, in_function))
            visit(child, inner)

    visit(tree, False)
    total = len(found)
    inside = sum(1 for _, f in found if f)
    targets = [(t, f) for t, f in ((_resolve(n, modules), f) for n, f in found) if t and t != mod]
    return targets, total, inside


def _sccs(graph: dict[str, set]) -> list[list[str]]:
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    for v in graph:
        if v not in index:
            strong(v)
    return out


def _longest_function(paths) -> tuple[int, str]:
    best = (0, "")
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > best[0]:
                    best = (n, f"{path}:{node.lineno} {node.name}")
    return best


def measure(root: pathlib.Path) -> dict:
    modules = _modules(root)
    pkg = root.name
    graph, total, inside = {}, 0, 0
    for mod, path in modules.items():
        targets, t, i = _imports(mod, path, modules)
        total, inside = total + t, inside + i
        graph[mod] = {tgt for tgt, _ in targets if tgt.startswith(pkg + ".") or tgt == pkg}
    cycles = [c for c in _sccs(graph) if len(c) > 1]

    def room(m):
        parts = m.split(".")
        return parts[1] if len(parts) > 1 else "__init__"

    rooms = {room(m) for m in modules}
    room_graph = {r: set() for r in rooms}
    for m, ts in graph.items():
        for t in ts:
            if room(t) != room(m) and room(m) != "__init__" and room(t) != "__init__":
                room_graph[room(m)].add(room(t))
    comps = _sccs(room_graph)
    comp_of = {r: i for i, c in enumerate(comps) for r in c}
    back = sum(1 for r, ts in room_graph.items() for t in ts if comp_of[r] == comp_of[t])
    level: dict[int, int] = {}
    for i, comp in enumerate(comps):  # Tarjan emits components in reverse topological order
        deps = {comp_of[t] for r in comp for t in room_graph[r]} - {i}
        level[i] = 1 + max((level[d] for d in deps), default=0)
    arrows = sum(len(ts) for ts in room_graph.values())
    loose = sorted(r for r in rooms if (root / f"{r}.py").exists())
    longest = _longest_function(modules.values())
    return {"package": pkg, "modules": len(modules), "rooms": len(rooms), "loose_modules": len(loose),
            "subpackages": len(rooms) - len(loose) - ("__init__" in rooms), "floors": max(level.values(), default=0),
            "arrows": arrows, "back_arrows": back, "module_import_cycles": len(cycles),
            "modules_in_cycles": sum(len(c) for c in cycles), "imports": total,
            "function_level_imports": inside, "function_level_share": round(inside / max(total, 1), 3),
            "longest_function_lines": longest[0], "longest_function": longest[1]}


def main(argv=None) -> int:
    import json

    for d in (argv if argv is not None else sys.argv[1:]) or ["conformance"]:
        print(json.dumps(measure(pathlib.Path(d))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
