"""The library's structure holds: no import circle between its modules (an import inside a
function or under `if TYPE_CHECKING:` is an arrow too), at most ten `# type: ignore`, no source
file over 500 lines and no function over 80 (its docstring not counted; the applications' own
file bound is also in tests/apps/test_layout.py). 400 lines is the guide a module aims at
(docs/architecture.md): a file between the two is one thought that is long, not a reason to
split it."""

from __future__ import annotations

import ast
from pathlib import Path

import peg

SRC = Path(peg.__file__).resolve().parent
MAX_LINES = 500
MAX_FUNCTION_LINES = 80  # without the docstring
MAX_TYPE_IGNORES = 10  # each one a type the code could not state; fix the type before adding one
# Functions allowed to be longer, each for a reason written beside it. Data tables (a literal
# mapping or list a function returns) would go here; none is longer today.
LONG_FUNCTIONS: dict[str, str] = {}


def _module(path: Path) -> str:
    parts = ["peg", *path.relative_to(SRC).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in SRC.rglob("*.py")}


def _edges(path: Path) -> set[str]:
    """The peg modules a file imports, at any depth of its code (`from peg.x import y` is an
    edge to the module peg.x.y when that is a module, else to peg.x): inside functions and under
    `if TYPE_CHECKING:` too, since a deferred import or a type named for the annotations is
    still a dependency (two modules that name each other are one module in two files)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
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


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph` (`{module: modules it imports}`), each as a path back to
    its start, by depth-first search."""
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
    return circles


def test_no_import_circle_between_peg_modules():
    # a package's __init__ re-exporting its modules is not a circle; a module importing the
    # package __init__ above it would be (it runs the re-exports, which import the module)
    graph = {name: _edges(path) - {name} for name, path in MODULES.items()}
    circles = _circles(graph)
    assert not circles, circles[:5]


def test_the_scan_sees_imports(tmp_path):
    assert "peg.ensemble" in _edges(MODULES["peg.loading"])
    assert "peg.recipe" in _edges(MODULES["peg.loading"])
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from peg.ensemble import Ensemble\n"
        "def f():\n    from peg.loading import load\n    import peg.recipe\n"
    )
    assert _edges(path) == {"peg.ensemble", "peg.loading", "peg.recipe"}


def test_the_circle_search_sees_a_deferred_circle():
    """The two circles of issue 47 (item 8) in small: a type named back under TYPE_CHECKING."""
    graph = {"a._perturb": {"a._recipes", "b"}, "a._recipes": {"a._perturb"}, "b": set()}
    assert _circles(graph) == [["a._perturb", "a._recipes", "a._perturb"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def _type_ignores() -> list[str]:
    """`file:line` of every `type: ignore` in the sources."""
    return [
        f"{p.relative_to(SRC).as_posix()}:{i}"
        for p in sorted(SRC.rglob("*.py"))
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "type: ignore" in line
    ]


def test_at_most_ten_type_ignores():
    found = _type_ignores()
    assert len(found) <= MAX_TYPE_IGNORES, f"state these types instead: {found}"


def test_no_source_file_is_over_500_lines():
    long = {
        p.relative_to(SRC).as_posix(): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long


def _function_lengths(path: Path) -> dict[str, int]:
    """`{qualified name: lines}` of every function in a file, its docstring not counted."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = child.end_lineno - child.lineno + 1  # type: ignore[operator]
                first = child.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    docstring = isinstance(first.value.value, str)
                    n -= (first.end_lineno - first.lineno + 1) if docstring else 0  # type: ignore[operator]
                found[prefix + child.name] = n
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), "")
    return found


def test_no_function_is_over_80_lines():
    long = {}
    for p in SRC.rglob("*.py"):
        name = p.relative_to(SRC).as_posix()
        for function, n in _function_lengths(p).items():
            allowed = f"{name}:{function}" in LONG_FUNCTIONS
            if n > MAX_FUNCTION_LINES and not allowed:
                long[f"{name}:{function}"] = n
    assert not long, f"cut these into named steps (or list a data table): {long}"


def test_the_function_count_sees_long_functions(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(81))
    path = tmp_path / "m.py"
    path.write_text('class A:\n    def f(self):\n        """Doc.\n\n        More."""\n' + body)
    assert _function_lengths(path) == {"A.f": 82}  # the def line and 81 statements
