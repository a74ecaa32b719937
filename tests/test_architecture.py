"""docs/architecture.md stays a true map: every source folder and top-level module is in it."""

from __future__ import annotations

import re
from pathlib import Path

import peg

SRC = Path(peg.__file__).resolve().parent
DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _named() -> set[str]:
    """Everything the map names in backticks (`methods/`, `_io.py`, ...)."""
    return set(re.findall(r"`([^`\s]+)`", DOC.read_text(encoding="utf-8")))


def test_every_source_folder_is_in_the_map():
    folders = {
        p.relative_to(SRC).as_posix() + "/"
        for p in SRC.rglob("*")
        if p.is_dir() and p.name != "__pycache__"
    }
    assert folders, SRC
    missing = sorted(folders - _named())
    assert not missing, f"docs/architecture.md: add a line for {missing}"


def test_every_top_level_module_is_in_the_map():
    modules = {p.name for p in SRC.glob("*.py")}
    assert "ensemble.py" in modules
    missing = sorted(modules - _named())
    assert not missing, f"docs/architecture.md: add {missing} to a line of the map"


def test_every_method_module_is_in_the_map():
    """`methods/` and its family packages, private modules included: the map says what each
    holds (a package's `__init__.py` by its folder)."""
    modules = {
        p.relative_to(SRC).as_posix()
        for p in (SRC / "methods").rglob("*.py")
        if p.name != "__init__.py" and "subspace" not in p.parts
    }
    missing = sorted(modules - _named())
    assert not missing, f"docs/architecture.md: add {missing} to the methods/ table"


def test_the_map_names_nothing_that_is_gone():
    """A folder or top-level module named in the map's table exists."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    for line in (line for line in lines if line.startswith("| `")):
        first = line.split("|")[1]
        for name in re.findall(r"`([^`\s]+)`", first):
            assert (SRC / name).exists(), f"docs/architecture.md names {name}, not in src/peg"
