"""docs/architecture.md stays a true map: every source folder and top-level module is in it, in
a layer, and no module imports from a layer above its own."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import peg
from test_structure import MODULES, _edges

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


def _layers_text() -> str:
    return DOC.read_text(encoding="utf-8").split("## The layers", 1)[1].split("\n## ", 1)[0]


def _layers() -> dict[str, float]:
    """`{top-level module or folder: rank}` from the map's list of layers: an item's number, a
    tenth more after each "; then" or "; above them" in it. Names in parentheses (a folder's
    inside) and without `.py` or `/` (`errors` in "or `errors` only") are not ranked."""
    ranks: dict[str, float] = {}
    for number, item in re.findall(r"^(\d+)\. (.*?)(?=^\d+\. |\Z)", _layers_text(), re.S | re.M):
        item = re.sub(r"\([^()]*\)", "", item)
        for step, part in enumerate(re.split(r";\s*(?:then|above them)\b", item)):
            for name in re.findall(r"`([^`\s]+(?:\.py|/))`", part):
                ranks[name] = int(number) + step / 10
    return ranks


def _unit(module: str) -> str:
    """The top-level module or folder of `peg.x.y`, as the map names it (`x/` or `x.py`)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    return f"{parts[1]}/" if (SRC / parts[1]).is_dir() else f"{parts[1]}.py"


def _upward(ranks: dict[str, float], rank_of: Callable[[str], str]) -> list[str]:
    """`importer → imported` for every import (at any depth, `TYPE_CHECKING`'s too) of a module
    ranked below the module it imports."""
    return [
        f"{m} → {e}"
        for m, path in sorted(MODULES.items())
        if rank_of(m) in ranks
        for e in sorted(_edges(path))
        if rank_of(e) in ranks and ranks[rank_of(e)] > ranks[rank_of(m)]
    ]


def test_the_layers_are_read_from_the_map():
    ranks = _layers()
    order = ["errors.py", "recipe.py", "source/", "_bn.py", "_params.py", "metrics/"]
    order += ["runtime/", "ensemble.py", "loading.py", "methods/", "evaluate.py", "apps/"]
    assert [ranks[name] for name in order] == sorted(ranks[name] for name in order)
    assert len({ranks[name] for name in order}) == len(order)
    assert ranks["__init__.py"] == ranks["apps/"] == ranks["integrations/"]


def test_every_module_is_in_a_layer():
    missing = sorted({_unit(m) for m in MODULES} - set(_layers()))
    assert not missing, f"docs/architecture.md: put {missing} in a layer of 'The layers'"


def test_no_module_imports_from_a_layer_above_its_own():
    """The map's layers hold: a module imports from its own layer or those below, never above
    (issue 47, item 8: `recipe.py` imported `source/`, one layer up)."""
    upward = _upward(_layers(), _unit)
    assert not upward, f"imports from a layer above (move the shared piece down): {upward}"


def test_inside_source_the_map_s_order_holds():
    """`source/`'s modules, from the bottom as the map lists them: none imports one listed
    above it (`_rows` below `_source`: `Source` makes a `ValSource`, never the reverse)."""
    found = re.search(r"`(\w+)/` \([^()]*inside it, from the bottom,([^()]*)\)", _layers_text())
    assert found, "docs/architecture.md: 'inside it, from the bottom, ...' for source/"
    folder, names = found[1], re.findall(r"`(\w+)`", found[2])
    assert folder == "source" and "_rows" in names and "_source" in names
    ranks = {f"peg.{folder}.{name}": float(i) for i, name in enumerate(names)}
    upward = _upward(ranks, lambda m: m)
    assert not upward, f"imports from above inside {folder}/: {upward}"
