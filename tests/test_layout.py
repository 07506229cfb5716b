"""The house's layout, measured from attnlib's own imports: floors, arrows, circles, local imports.

Core (``losses``, ``model``, ``svm``, ``optim``, ``paths``, ``metrics``, ``fits``, ``datasets``,
``flow``) → ``experiments`` → ``figures`` → ``book``; notebooks on top. The graph's nodes are the
modules of ``attnlib/`` without the package front doors (``__init__.py``: they only re-export);
an import of a name from a front door is an arrow to the module that defines it.

Run as a script to print the numbers: ``python tests/test_layout.py [ROOT]``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FLOORS = 7
MAX_FRONT_DOOR = 40
# The documented lazy imports of heavy optional dependencies inside the package (at most 2).
MAX_LOCAL_IMPORTS = 2
CORE = {"losses", "model", "svm", "optim", "paths", "metrics", "fits", "datasets", "flow"}


def _layer(module: str) -> int:
    """0 core, 1 experiments, 2 figures, 3 book, 4 the command line."""
    head = module.split(".")[0]
    return {"experiments": 1, "figures": 2, "book": 3, "__main__": 4}.get(head, 0)


def _modules(root: Path) -> dict[str, Path]:
    package = root / "attnlib"
    return {".".join(p.relative_to(package).with_suffix("").parts): p for p in sorted(package.rglob("*.py"))}


def _resolve(importer: str, level: int, module: str | None) -> str:
    """The dotted module (relative to attnlib) that ``from <level dots><module> import`` names."""
    parts = importer.split(".")
    is_package = parts[-1] == "__init__"
    base = parts[:-1] if not is_package else parts[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    target = base + (module.split(".") if module else [])
    return ".".join(target)


def import_graph(root: Path = ROOT) -> dict:
    """Nodes, arrows, local (in-function) intra-package imports and line counts of ``attnlib/``."""
    files = _modules(root)
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in files.items()}
    # what each front door re-exports: name -> defining module
    exported: dict[str, dict[str, str]] = {}
    for name, tree in trees.items():
        if name.split(".")[-1] != "__init__":
            continue
        package = name[: -len("__init__")].rstrip(".")
        table = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                target = _resolve(name, node.level, node.module)
                for alias in node.names:
                    sub = f"{target}.{alias.name}" if node.module is None else target
                    table[alias.asname or alias.name] = sub.lstrip(".")
        exported[package] = table

    def targets(importer: str, node: ast.ImportFrom | ast.Import) -> set[str]:
        found = set()
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("attnlib."):
                    found.add(alias.name[len("attnlib.") :])
            return found
        if node.level == 0:
            if not (node.module or "").startswith("attnlib"):
                return found
            target = node.module[len("attnlib") :].lstrip(".")
        else:
            target = _resolve(importer, node.level, node.module)
        for alias in node.names:
            candidates = [f"{target}.{alias.name}".lstrip("."), target]
            for cand in candidates:
                if cand in files:
                    found.add(cand)
                    break
                package = cand
                if package in exported or package == "":
                    sub = exported.get(package, {}).get(alias.name)
                    if sub in files:
                        found.add(sub)
                        break
                    if f"{package}.__init__".lstrip(".") in files and cand == target:
                        found.add(f"{package}.__init__".lstrip("."))
                        break
        return found

    arrows: set[tuple[str, str]] = set()
    local: list[tuple[str, int, str]] = []
    for name, tree in trees.items():
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        inside = {id(sub) for f in functions for sub in ast.walk(f) if sub is not f}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            found = targets(name, node)
            if id(node) in inside and found:
                local.append((name, node.lineno, ", ".join(sorted(found))))
            if name.endswith("__init__"):
                continue
            for t in found:
                if not t.endswith("__init__") and t != name:
                    arrows.add((name, t))
    nodes = sorted(n for n in files if not n.endswith("__init__"))
    lines = {n: len(files[n].read_text(encoding="utf-8").splitlines()) for n in nodes}
    return {"nodes": nodes, "arrows": sorted(arrows), "local_imports": local, "lines": lines}


def cycles(nodes, arrows) -> list[list[str]]:
    """Every elementary circle of the graph (small graphs: a depth-first search from each node)."""
    out = {n: sorted(b for a, b in arrows if a == n) for n in nodes}
    order = {n: i for i, n in enumerate(nodes)}
    found = []

    def walk(start, node, path, seen):
        for nxt in out[node]:
            if nxt == start:
                found.append(path[:])
            elif nxt not in seen and order[nxt] > order[start]:
                seen.add(nxt)
                path.append(nxt)
                walk(start, nxt, path, seen)
                path.pop()
                seen.discard(nxt)

    for n in nodes:
        walk(n, n, [n], {n})
    return found


def floors(nodes, arrows) -> int:
    """Modules on the longest import chain (a circle's modules count once)."""
    out = {n: [b for a, b in arrows if a == n] for n in nodes}
    memo: dict[str, int] = {}

    def depth(n, stack=()):
        if n in memo:
            return memo[n]
        if n in stack:
            return 0
        memo[n] = 1 + max((depth(m, (*stack, n)) for m in out[n]), default=0)
        return memo[n]

    return max(depth(n) for n in nodes)


def front_door(root: Path = ROOT) -> list[str]:
    tree = ast.parse((root / "attnlib" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def summary(root: Path = ROOT) -> dict:
    graph = import_graph(root)
    return {
        "modules": len(graph["nodes"]),
        "arrows": len(graph["arrows"]),
        "floors": floors(graph["nodes"], graph["arrows"]),
        "circles": len(cycles(graph["nodes"], graph["arrows"])),
        "local_imports": len(graph["local_imports"]),
        "front_door": len(front_door(root)),
        "lines_max": max(graph["lines"].values()),
        "lines_median": sorted(graph["lines"].values())[len(graph["lines"]) // 2],
    }


GRAPH = import_graph()


def test_no_circle():
    assert cycles(GRAPH["nodes"], GRAPH["arrows"]) == []


def test_at_most_seven_floors():
    assert floors(GRAPH["nodes"], GRAPH["arrows"]) <= MAX_FLOORS


def test_layers_point_down():
    """core → experiments → figures → book: no module imports a higher layer, an experiment
    module imports only the core, and a figure module no other chapter's figures or experiments."""
    for a, b in GRAPH["arrows"]:
        assert _layer(b) <= _layer(a), f"{a} imports the higher layer {b}"
        if _layer(a) == 1:
            assert _layer(b) == 0, f"the experiment module {a} imports {b}, not the core"
        if _layer(a) == 2 and _layer(b) >= 1:
            chapter = a.split(".")[1]
            assert b.split(".")[1] in (chapter, "common"), f"{a} imports another chapter's {b}"


def test_no_import_inside_a_function_but_the_documented_lazy_ones():
    assert len(GRAPH["local_imports"]) <= MAX_LOCAL_IMPORTS, GRAPH["local_imports"]


def test_short_front_door():
    import attnlib

    names = front_door()
    assert names == list(attnlib.__all__) and len(names) <= MAX_FRONT_DOOR
    assert all(hasattr(attnlib, n) for n in names)
    for room in ("losses", "model", "svm", "optim", "paths", "metrics", "fits", "datasets", "experiments", "figures"):
        assert hasattr(attnlib, room)


def test_the_measure_sees_a_circle_and_a_local_import(tmp_path):
    """The control: the same measures on a made-up package with a circle and a local import."""
    package = tmp_path / "attnlib"
    package.mkdir()
    (package / "__init__.py").write_text("__all__ = ['a']\n")
    (package / "a.py").write_text("from .b import g\n")
    (package / "b.py").write_text("def g():\n    from .a import g\n")
    (package / "c.py").write_text("from . import a\n")
    graph = import_graph(tmp_path)
    assert cycles(graph["nodes"], graph["arrows"]) == [["a", "b"]]
    assert [m for m, _, _ in graph["local_imports"]] == ["b"]
    assert floors(graph["nodes"], graph["arrows"]) == 3


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for key, value in summary(root).items():
        print(f"{key}: {value}")
    graph = import_graph(root)
    for module, line, target in graph["local_imports"]:
        print(f"local import: {module}:{line} -> {target}")
    for circle in cycles(graph["nodes"], graph["arrows"]):
        print("circle:", " -> ".join(circle))
