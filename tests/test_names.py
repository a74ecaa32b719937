"""Every dotted `peg.…` name written in backticks, in the README, the guides in docs/ and the
docstrings and comments of src/peg, names something that exists (a module, or an attribute of
one), so that a rename or a move cannot leave a name behind."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import peg

SRC = Path(peg.__file__).resolve().parent
ROOT = SRC.parents[1]
NAME = re.compile(r"`(peg(?:\.[A-Za-z_]\w*)+)")


def _texts() -> Iterator[tuple[str, str]]:
    """(where, text) of each README/docs page, docstring and comment."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        yield page.relative_to(ROOT).as_posix(), page.read_text(encoding="utf-8")
    for path in sorted(SRC.rglob("*.py")):
        where, source = path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                yield where, ast.get_docstring(node, clean=False) or ""
        comments = (line[line.index("#") :] for line in source.splitlines() if "#" in line)
        yield where, "\n".join(comments)


def _resolves(name: str) -> bool:
    """The longest importable prefix of `name`, then an attribute per remaining part."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_the_scan_finds_names_and_would_catch_a_missing_one():
    names = {m.group(1) for _, text in _texts() for m in NAME.finditer(text)}
    assert len(names) > 50 and "peg.evaluate" in names
    assert not _resolves("peg.source._source.model_device")
    assert _resolves("peg.source._devices.model_device")


@pytest.mark.parametrize("pages", ["docs", "src"])
def test_every_dotted_peg_name_resolves(pages):
    missing: dict[str, set[str]] = {}
    for where, text in _texts():
        if where.startswith(pages) or (pages == "docs" and where == "README.md"):
            for match in NAME.finditer(text):
                if not _resolves(match.group(1)):
                    missing.setdefault(match.group(1), set()).add(where)
    assert not missing, missing
