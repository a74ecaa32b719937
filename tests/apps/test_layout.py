"""The applications sit above the core: `import peg` loads none of them, no module outside
`peg/apps` imports `peg.apps`, and every application source file stays small."""

from __future__ import annotations

import ast
from pathlib import Path

import peg
from fresh_imports import modules_after

SRC = Path(peg.__file__).resolve().parent
APPS = SRC / "apps"
MAX_LINES = 400


def _imports(path: Path) -> set[str]:
    """Every module a source file imports (absolute; `from peg import apps` as peg.apps)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            module = node.module or ""
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def test_import_peg_loads_no_application():
    """In a fresh Python (tests/fresh_imports.py): peg, peg.analysis, peg.data, peg.methods,
    peg.metrics and peg.plots imported, no module of peg.apps is."""
    loaded = modules_after()["import peg.analysis, peg.methods"]
    assert "peg.methods" in loaded and "peg.plots" in loaded
    assert sorted(m for m in loaded if m == "peg.apps" or m.startswith("peg.apps.")) == []


def test_no_core_module_imports_the_applications():
    core = [p for p in SRC.rglob("*.py") if APPS not in p.parents]
    assert len(core) > 30  # the scan sees the core
    offenders = {
        str(p.relative_to(SRC)): sorted(
            m for m in _imports(p) if m.split(".")[:2] == ["peg", "apps"]
        )
        for p in core
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_application_files_stay_small():
    sizes = {str(p.relative_to(APPS)): len(p.read_text().splitlines()) for p in APPS.rglob("*.py")}
    assert {"cli.py", "registry.py", "bench/runner.py", "diversity/study.py"} <= set(sizes)
    assert not {name: n for name, n in sizes.items() if n > MAX_LINES}


def test_the_presets_are_package_data():
    from peg.apps import presets

    assert presets.folder() == APPS / "configs"
    assert {"quick", "fashion-mnist", "cifar10-cpu", "cifar10", "uci", "diversity"} <= set(
        presets.names()
    )
