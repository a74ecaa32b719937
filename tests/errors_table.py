"""docs/errors.md: every bad-input case of the test suite, with the error it gets.

Any test module under tests/ may define `ERROR_CASES` (tuples `(area, what, call, kind,
regex)`, `call()` takes no arguments) and `FILE_ERROR_CASES` (the same, `call(tmp_path)`),
and binds a test name to `bad_inputs.raises_test(ERROR_CASES)` (and to
`raises_test(FILE_ERROR_CASES, files=True)`), which runs them. This module finds those modules
by scanning `tests/**/test_*.py`, runs every case and renders the table, grouped by area.
`python tests/errors_table.py` rewrites docs/errors.md; tests/test_errors_table.py fails
when it is out of date, so the documentation cannot drift from what the library does.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parent
DOC = TESTS.parent / "docs" / "errors.md"

# The order of the areas in the table (methods first, the command line last); an area not
# listed here follows them, in alphabetical order.
AREA_ORDER = [
    "PEG", "PEP", "SWAG", "SWA", "Recipe", "DeepEnsemble", "MCDropout", "Ensemble", "metrics",
    "ood", "regression", "diversity", "data", "corruptions", "models", "peg bench spec",
    "batches", "with_output", "evaluate", "TemperatureScaling", "Laplace", "calibrators",
    "train", "MCPatched", "PackedEnsemble", "patch()", "Packing", "RandomSubspace",
    "DropoutSubspace", "streaming metrics", "selective", "plots", "streaming OOD", "peg (CLI)",
    "peg.compare", "load", "load (tampered)",
]  # fmt: skip

HEADER = """\
# Errors: what bad input gets

Generated from the `ERROR_CASES` of the test modules (`python tests/errors_table.py`
rewrites this file; the test suite fails if it is out of date). Every error is raised
before any long work starts and names the argument at fault.

- **Devices**: data follows the model. Inputs and labels are moved, batch by batch, to
  the device of the model's weights (labels to the predictions' device in the metrics);
  what no move can fix is refused, naming both devices. Here the `meta` device (shapes
  without values) stands for it, as the tests run on a CPU.
- **A bad argument of a peg class** (constructor, `set_params`, or an argument set directly
  and found at `fit`) is a `peg.InvalidParameterError`, a subclass of both ValueError and
  TypeError; its message is `argument: expected what is accepted, got what was given`.
- **Models returning a tuple or a dict** are wrapped with the `output_fn` hook,
  `peg.with_output(model, output_fn)` (a key, an index or a callable).
- `(RuntimeError: ...)` stands for torch's own account of why the model could not run on
  the inputs (its wording changes between torch versions); `$TMP` for a temporary folder;
  `$SECONDS` for a time measured when the error is raised.
- `peg` on the command line: a `SystemExit` row shows the exit status and what argparse
  printed; other rows are the exception `peg` ends with.

| area | bad input | error | message |
|---|---|---|---|
"""


def _import(path: Path) -> ModuleType:
    """The test module at `path`, under the name pytest gives it (its file name: tests/ has no
    packages), so a module pytest has already imported is not run twice."""
    name = path.stem
    if name in sys.modules and Path(sys.modules[name].__file__ or "").resolve() == path:
        return sys.modules[name]
    for folder in (str(TESTS), str(path.parent)):  # where pytest's rootdir import looks
        if folder not in sys.path:
            sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def case_modules() -> list[ModuleType]:
    """Every tests/**/test_*.py module that defines ERROR_CASES or FILE_ERROR_CASES, by path."""
    found = [
        p.resolve()
        for p in sorted(TESTS.rglob("test_*.py"))
        if re.search(r"^(FILE_)?ERROR_CASES\b", p.read_text(encoding="utf-8"), re.M)
    ]
    return [_import(p) for p in found]


def rows(tmp: Path) -> list[tuple[str, str, Callable[[], object]]]:
    """(area, what, call) of every case, grouped by area; within an area, by module path, then
    the module's ERROR_CASES before its FILE_ERROR_CASES, in the order given."""
    found: list[tuple[str, str, Callable[[], object]]] = []
    for module in case_modules():
        found += [(a, w, c) for a, w, c, _, _ in getattr(module, "ERROR_CASES", [])]
        file_cases = getattr(module, "FILE_ERROR_CASES", [])
        found += [(a, w, lambda c=c: c(tmp)) for a, w, c, _, _ in file_cases]
    rank = {area: i for i, area in enumerate(AREA_ORDER)}
    return sorted(found, key=lambda r: (rank.get(r[0], len(rank)), r[0]))  # stable sort


def _message(call: Callable[[], object]) -> tuple[type[BaseException], str]:
    try:
        call()
    except (Exception, SystemExit) as e:
        return type(e), str(e).splitlines()[0]
    raise AssertionError("no error raised")


def render(tmp: Path) -> str:
    """docs/errors.md: every case with the error type and the first line of its message."""
    lines = [HEADER.rstrip("\n")]
    for area, what, call in rows(tmp):
        kind, message = _message(call)
        message = message.replace(str(tmp), "$TMP")
        # torch's own words for why a forward failed change between versions: not pinned here
        message = re.sub(r"\((\w+): .*\); pass inputs", r"(\1: ...); pass inputs", message)
        # a time measured on this machine: not pinned either
        message = re.sub(r"\b\d[\d.e+-]* s to fit", "$SECONDS s to fit", message)
        message = message.replace("|", "\\|")
        lines.append(f"| {area} | {what} | `{kind.__name__}` | {message} |")
    return "\n".join([*lines, *accepted_arguments()]) + "\n"


def accepted_arguments() -> list[str]:
    """What each argument of each public peg class accepts, from its `parameter_constraints`
    (the lines its docstring gains too): a value outside gets the error above."""
    import peg
    from peg.methods._constraints import accepted

    lines = ["", "## What each argument accepts", "",
             "From each public class's `parameter_constraints` table, as its docstring lists it.",
             "", "| class | argument: accepted |", "|---|---|"]  # fmt: skip
    for name in sorted(peg.__all__):
        table = getattr(getattr(peg, name), "parameter_constraints", None)
        if isinstance(getattr(peg, name), type) and table:
            text = "<br>".join(line.replace("|", "\\|") for line in accepted(table))
            lines.append(f"| `peg.{name}` | {text} |")
    return lines


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        DOC.write_text(render(Path(tmp)))
    print(f"wrote {DOC}", file=sys.stderr)
