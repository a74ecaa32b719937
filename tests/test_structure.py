"""The library's structure holds: no import circle between its modules, and no source file
much over 400 lines (the applications' own bound is in tests/apps/test_layout.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import peg

SRC = Path(peg.__file__).resolve().parent
MAX_LINES = 430  # ~400; methods/_perturb.py (fit's orchestration) is the largest


def _module(path: Path) -> str:
    parts = ["peg", *path.relative_to(SRC).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in SRC.rglob("*.py")}


def _edges(path: Path) -> set[str]:
    """The peg modules a file imports, at any depth of its code (`from peg.x import y` is an
    edge to the module peg.x.y when that is a module, else to peg.x)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                for a in node.names
            ]
        found |= {n for n in names if n in MODULES}
    return found


def test_no_import_circle_between_peg_modules():
    graph = {name: _edges(path) - {name} for name, path in MODULES.items()}
    # a package's __init__ re-exporting its modules is not a circle; a module importing the
    # package __init__ above it would be (it runs the re-exports, which import the module)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, circles[:5]


def test_the_scan_sees_imports():
    assert "peg.ensemble" in _edges(MODULES["peg.loading"])
    assert "peg.recipe" in _edges(MODULES["peg.loading"])


def test_no_source_file_is_much_over_400_lines():
    long = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long
