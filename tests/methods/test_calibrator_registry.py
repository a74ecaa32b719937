"""One calibrator registry (`Calibrator.registry`): a map defined in a test file, and nothing
else, is fitted by `peg.compare` on saved logits, raced by `AutoSelect` by its display name,
saved and given back by `peg.load`, exported by `to_module()`, and named by the bench and the
callbacks; no code outside `methods/calibration/` names a calibrator; `docs/architecture.md`'s
how-to lists the files a new calibrator touches.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import Tensor, nn

import peg
from bad_inputs import raises_test
from peg import loading
from peg.apps import registry  # imported before the toy is defined: nothing it lists holds it
from peg.apps.bench import columns, names
from peg.integrations._common import calibrator_names, new_calibrator
from peg.methods.base import store_arguments
from peg.methods.calibration._calibrator import Calibrator, calibrators, stored, table_name
from peg.methods.calibration._export import CalibrationMap, as_f64

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "peg"
C = 4


class ShiftMap(CalibrationMap):
    """The toy's exported module: s + b."""

    shift: Tensor

    def __init__(self, scores: str, shift: Tensor) -> None:
        super().__init__(scores)
        self.register_buffer("shift", as_f64(shift))

    def log_probs(self, s: Tensor) -> Tensor:
        return s + self.shift


def define_shift() -> type[Calibrator]:
    """A toy map, log p̄ + b with b `[C]` the log of the labels' frequencies over the mean
    predicted probabilities: defining the class is all it takes to register it."""

    class Shift(Calibrator):
        method = "test-shift"
        label = "shift"
        name = "Shift"
        growth = 1
        kinds: ClassVar[tuple[str, ...]] = ("multiclass",)
        on_logits_default = True

        def __init__(self, *, batch_size: int = 512, batch_fn: Any = None) -> None:
            store_arguments(self, locals())

        def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
            counts = torch.bincount(y, minlength=scores.shape[1]).double() + 1
            mean = scores.softmax(-1).mean(0)
            return {"shift_": (counts / counts.sum()).log() - mean.log()}

        def _apply(self, scores: Tensor) -> Tensor:
            return scores + self.shift_

        def _module(self) -> CalibrationMap:
            return ShiftMap(self.scores_, self.shift_)

        def _classes_of(self, state: Mapping[str, Any]) -> int | None:
            return len(state["shift_"])

        def _tensors(self) -> dict[str, Tensor]:
            return {"shift": self.shift_}

        def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict:
            return {"shift_": stored(tensors, "shift")}

    return Shift


@pytest.fixture
def shift() -> Iterator[type[Calibrator]]:
    cls = define_shift()
    try:
        yield cls
    finally:  # other tests never see it
        del Calibrator.registry[cls.method]
        loading.CALIBRATORS.remove(cls.method)


def saved(n: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    return torch.randn(n, C, generator=g) * 2 + 3 * nn.functional.one_hot(y, C), y


def test_a_map_defined_here_is_registered_and_forgotten_after(shift):
    assert Calibrator.registry[shift.method] is shift
    assert shift in calibrators() and shift in calibrators("multiclass")
    assert shift not in calibrators("binary")


def test_compare_fits_the_toy_on_saved_logits(shift):
    (X, y), test = saved(240, 0), saved(200, 1)
    result = peg.compare(X, y, test, say=None)  # the defaults on logits: it declares itself one
    rows = [row["method"] for row in result.table]
    assert rows[-1] == "Shift" and "TS" in rows
    assert result.failed == {}
    named = peg.compare(X, y, test, ["TS", "shift"], say=None)  # by name, any case
    assert [row["method"] for row in named.table] == ["TS", "Shift"]


def test_autoselect_races_the_toy_by_its_display_name(shift):
    chosen = peg.AutoSelect(candidates=["TS", "Shift"], cv=3).fit(nn.Identity(), saved(300, 0))
    assert {r["candidate"] for r in chosen.report_} == {"TS", "Shift"}
    from peg.apps.select import cheap, race, report

    assert cheap.growth()[shift.method] == 1  # priced as the O(C) maps
    assert "Shift" in race.cost_order() and "Shift" in report.simplicity()


def test_peg_load_gives_the_toy_back_and_to_module_exports_it(shift, tmp_path):
    (X, y), (Xt, _) = saved(300, 0), saved(50, 1)
    fitted = shift().fit(X, y)
    loaded = peg.load(fitted.save(tmp_path / "shift.peg"))
    assert type(loaded) is shift
    torch.testing.assert_close(loaded.predict_proba(Xt), fitted.predict_proba(Xt))
    module = fitted.to_module()
    torch.testing.assert_close(module(Xt), fitted.predict_proba(Xt), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="fitted on 4 classes"):
        module(Xt[:, :3])


def test_the_bench_and_the_callbacks_name_the_toy(shift):
    assert names.denoted(table_name(shift)) == (shift.method, "single", {})
    assert shift.method in columns.methods() and shift.method not in columns.METHODS
    assert registry.entry(shift.method).method is shift
    assert type(new_calibrator(shift.method)) is shift
    assert shift.method in calibrator_names()


def _unknown_kind() -> None:
    class Ranked(Calibrator):  # refused as it is defined: never registered
        method = "test-ranked"
        name = "Ranked"
        kinds: ClassVar[tuple[str, ...]] = ("ranking",)


# (area, bad input, call, error type, regex the message must match)
ERROR_CASES = [
    (
        "calibrators",
        "a registered map of an unknown kind of input",
        _unknown_kind,
        TypeError,
        r"Ranked: a registered calibrator needs a `method` key, `kinds` among \('multiclass', ",
    ),
]
test_a_bad_declaration_raises_a_clear_error = raises_test(ERROR_CASES)


def test_a_refused_declaration_registers_nothing():
    with pytest.raises(TypeError):
        _unknown_kind()
    assert "test-ranked" not in Calibrator.registry and "test-ranked" not in loading.CALIBRATORS


# ---------------------------------------------------------------- nothing else names a map
# (file, string) pairs that may stay, and why
ALLOWED = {
    # `peg --help`'s list of compare's names beyond the maps (ensembles and the fixed chains,
    # which name the maps they chain), kept without importing torch; the maps themselves are
    # the registry's (tests/apps/test_cli_start.py)
    "apps/arguments.py": {"TS", "Matrix scaling", "Dirichlet", "Vector scaling"},
    # a field of the demo's results file (the temperature chosen), not a calibrator's key
    "apps/demo.py": {"temperature"},
    # `peg demo`'s help, naming the demo's own columns
    "apps/cli.py": {"Temp-scaled"},
}


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _holds(text: str, allowed: set[str]) -> bool:
    return any(word in text for word in allowed)


def named_maps() -> list[str]:
    """`path:line 'string'` for every string constant of code (not a docstring) outside
    `methods/calibration/` that is a registered map's key, display name or table name, or
    holds one of those that cannot be a word of a sentence ("vector-scaling", "Hist. binning",
    "Ensemble TS")."""
    words = set()
    for cls in calibrators():
        words |= {cls.method, cls.name, table_name(cls)}
    within = {w for w in words if any(mark in w for mark in "- .")}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("methods/calibration/") or rel in ("__init__.py", "methods/__init__.py"):
            continue  # the registry's own package, and the package exports
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        allowed = ALLOWED.get(rel, set())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docs
                and (node.value in words or any(w in node.value for w in within))
                and not (allowed is None or node.value in allowed or _holds(node.value, allowed))
            ):
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    return found


def test_no_code_outside_the_calibration_package_names_a_calibrator():
    import peg.methods  # noqa: F401  (registers every map)

    assert len(calibrators()) >= 9
    assert named_maps() == []


# ---------------------------------------------------------------- the how-to stays true
def howto_files() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- calibrator-files.*?-->(.*?)<!-- end calibrator-files -->", text, re.S)
    assert block is not None, "docs/architecture.md: the calibrator how-to's list is missing"
    return re.findall(r"^\d+\. `([^`]+)`", block[1], re.M)


def test_the_how_to_lists_at_most_four_files_and_each_is_where_it_says():
    files = howto_files()
    assert len(files) <= 4
    assert files[0] == "src/peg/methods/calibration/<map>.py"
    for file in files:  # the placeholders' folders, the named files themselves
        path = ROOT / file.replace("<map>", "temperature").replace("test_<map>", "test_export")
        assert path.exists() or (ROOT / file).parent.exists(), file
    # the export imports every registered map's module (which is what registers it)
    exports = (ROOT / files[1]).read_text(encoding="utf-8")
    for cls in calibrators():
        assert f"from {cls.__module__} import" in exports, cls.__name__
    # and the registered maps are the ones the calibration page documents
    page = (ROOT / files[2]).read_text(encoding="utf-8")
    missing = [cls.__name__ for cls in calibrators() if cls.__name__ not in page]
    assert missing == []
