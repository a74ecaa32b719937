"""The benchmark scripts import one another without a circle: what two of them share (a base
they both measure, a timer) lives in a module of its own (`benchmarks/_bases.py`,
`benchmarks/_timing.py`) that both import."""

from __future__ import annotations

import ast
from pathlib import Path

from test_structure import _circles

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _benchmark_edges(path: Path, scripts: set[str]) -> set[str]:
    """The benchmark scripts `path` imports, at any depth of its code (a deferred import
    inside a function is an arrow too)."""
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module.split(".")[0]]
        else:
            continue
        edges.update(n for n in names if n in scripts)
    return edges


def test_no_import_circle_between_benchmark_scripts():
    paths = {p.stem: p for p in BENCHMARKS.glob("*.py")}
    assert {"scale_search", "peg_fit_overhead", "_bases"} <= set(paths)
    graph = {name: _benchmark_edges(p, set(paths)) - {name} for name, p in paths.items()}
    assert "_bases" in graph["scale_search"] and "_bases" in graph["peg_fit_overhead"]
    circles = _circles(graph)
    assert not circles, circles[:5]


def test_the_scan_sees_a_deferred_import(tmp_path):
    script = tmp_path / "a.py"
    script.write_text("def f():\n    from b import g\n    import c.d\n")
    assert _benchmark_edges(script, {"b", "c", "e"}) == {"b", "c"}
