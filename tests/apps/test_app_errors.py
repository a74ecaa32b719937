"""Bad input to peg bench specs, the command line and peg.compare: each case raises the documented
error, before any work. The cases are rendered into docs/errors.md by tests/errors_table.py.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path

import torch

import peg
from bad_inputs import (
    _mlp,
    _val,
    _write,
    raises_test,
)
from peg.apps.bench.runner import check_methods
from peg.apps.bench.spec import SpecError, load_specs, parse_spec
from peg.apps.cli import main as cli
from peg.apps.compare import Comparison


def _cli(*argv: str) -> None:
    """Run `peg ARGV`; an argparse exit becomes SystemExit("exit N: <what it printed>")."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cli(list(argv))
    except SystemExit as e:
        printed = err.getvalue().strip().splitlines()
        raise SystemExit(f"exit {e.code}: {printed[-1] if printed else ''}") from None


def _comparison() -> Comparison:
    """A Comparison of one method, as peg.compare returns it."""
    return Comparison([{"method": "TS", "base": "model", "nll": 0.5}], {}, {}, {},
                      {"test": {"points": 10, "kind": "test"}})  # fmt: skip


def _scores() -> tuple[torch.Tensor, torch.Tensor]:
    """Binary scores `[40]` and their 0/1 labels."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(40, generator=g), torch.arange(40) % 2


def _spec(**change: object) -> dict:
    base = {
        "name": "x",
        "data": "digits",
        "model": {"name": "mlp"},
        "train": {"epochs": 1},
        "methods": ["Single"],
    }
    return {**base, **change}


# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    (
        "peg bench spec",
        "unknown method",
        lambda: parse_spec(_spec(methods=["Bayes-by-backprop"])),
        SpecError,
        r"methods\[0\]",
    ),
    (
        "peg bench spec",
        "negative epochs",
        lambda: parse_spec(_spec(train={"epochs": -3})),
        SpecError,
        r"train\.epochs",
    ),
    (
        "peg bench spec",
        "unknown data set",
        lambda: parse_spec(_spec(data="imagenet")),
        SpecError,
        r"\.data",
    ),
    (
        "peg bench spec",
        "unknown OOD set",
        lambda: parse_spec(_spec(ood=["svhn-extra"])),
        SpecError,
        r"\.ood",
    ),
    # ---------------------------------------------------------------- peg bench specs
    ("peg bench spec", "not a mapping", lambda: parse_spec([1, 2]), SpecError, "mapping"),
    (
        "peg bench spec",
        "unknown field",
        lambda: parse_spec(_spec(lr=0.1)),
        SpecError,
        "unknown field",
    ),
    (
        "peg bench spec",
        "missing required field",
        lambda: parse_spec({k: v for k, v in _spec().items() if k != "model"}),
        SpecError,
        r"\.model: missing",
    ),
    (
        "peg bench spec",
        "name not file-name-safe",
        lambda: parse_spec(_spec(name="a/b")),
        SpecError,
        r"\.name",
    ),
    (
        "peg bench spec",
        "unknown model",
        lambda: parse_spec(_spec(model={"name": "gpt"})),
        SpecError,
        r"\.model\.name",
    ),
    (
        "peg bench spec",
        "unknown model argument",
        lambda: parse_spec(_spec(model={"name": "mlp", "depth": 3})),
        SpecError,
        r"\.model: mlp: unknown argument",
    ),
    (
        "peg bench spec",
        "an unknown metric row",
        lambda: parse_spec(_spec(metrics=["nll", "auroc"])),
        SpecError,
        r"\.metrics: unknown \['auroc'\]",
    ),
    ("peg bench spec", "no methods", lambda: parse_spec(_spec(methods=[])), SpecError, "methods"),
    (
        "peg bench spec",
        "duplicate method names",
        lambda: parse_spec(_spec(methods=["Single", "Single"])),
        SpecError,
        "duplicate",
    ),
    (
        "peg bench spec",
        "method entry of the wrong type",
        lambda: parse_spec(_spec(methods=[3])),
        SpecError,
        r"methods\[0\]",
    ),
    (
        "peg bench spec",
        "impossible method option",
        lambda: check_methods(parse_spec(_spec(methods=[{"name": "PEG-15", "eta": -1}]))),
        ValueError,
        r"methods\[0\] \(PEG-15\): eta",
    ),
    ("peg bench spec", "empty seeds", lambda: parse_spec(_spec(seeds=[])), SpecError, "seeds"),
    (
        "peg bench spec",
        "val_fraction outside (0, 1)",
        lambda: parse_spec(_spec(val_fraction=1.5)),
        SpecError,
        "val_fraction",
    ),
    (
        "peg bench spec",
        "corruption severity outside 1..5",
        lambda: parse_spec(_spec(shift={"severities": [7]})),
        SpecError,
        "severities",
    ),
    (
        "peg bench spec",
        "SWAG without an SWA recipe",
        lambda: parse_spec(_spec(methods=["SWAG"])),
        SpecError,
        r"\.swa",
    ),
    (
        "peg bench spec",
        "unknown train field",
        lambda: parse_spec(_spec(train={"epochs": 1, "learnrate": 3})),
        SpecError,
        r"\.train",
    ),
    (
        "peg bench spec",
        "data_options not a mapping",
        lambda: parse_spec(_spec(data_options=3)),
        SpecError,
        "data_options",
    ),
    # ---------------------------------------------------------------- the peg command
    (
        "peg (CLI)",
        "peg bench with an unknown spec",
        lambda: _cli("bench", "nonexistent.yaml"),
        SystemExit,
        "exit 2: peg bench: error: .*neither a file nor a preset",
    ),
    ("peg (CLI)", "no subcommand", lambda: _cli(), SystemExit, "exit 2"),
    ("peg (CLI)", "peg bench without a spec", lambda: _cli("bench"), SystemExit, "spec"),
    (
        "peg (CLI)",
        "peg bench --seeds not integers",
        lambda: _cli("bench", "quick", "--seeds", "x"),
        SystemExit,
        "--seeds",
    ),
    (
        "peg (CLI)",
        "peg demo with an unknown data set",
        lambda: _cli("demo", "--data", "imagenet"),
        SystemExit,
        "--data",
    ),
    (
        "peg.compare",
        "an unknown method name",
        lambda: peg.compare(_mlp(), _val(), _val(), methods=["PEG-9000"], say=None),
        ValueError,
        r"methods\[0\]: unknown method 'PEG-9000'",
    ),
    (
        "peg.compare",
        "a model that is not a module",
        lambda: peg.compare("model.pt", _val(), _val(), say=None),
        TypeError,
        "model: expected a trained nn.Module",
    ),
    (
        "peg.compare",
        "an unknown metric column",
        lambda: peg.compare(_mlp(), _val(), _val(), metrics=["nll", "auroc"], say=None),
        ValueError,
        "metrics: expected a list of keys among",
    ),
    (
        "peg.compare",
        "float labels that are not class indices",
        lambda: peg.compare(_mlp(), (_val()[0], _val()[1].float() + 0.5), _val(), say=None),
        ValueError,
        "integer class labels",
    ),
    (
        "peg.compare",
        "a table in a format other than md, csv or json",
        lambda: _comparison().to_text("xlsx"),
        ValueError,
        r"format: expected one of \['md', 'csv', 'json'\]",
    ),
    (
        "peg.compare",
        "binary scores [N] for val, a multilabel head for test",
        lambda: peg.compare(
            *_scores(),
            (_scores()[0][:, None].expand(-1, 3), _scores()[1][:, None].expand(-1, 3)),
            say=None,
        ),
        ValueError,
        r"test: multilabel logits \[N, 3\] .*, but val's are binary scores",
    ),
    (
        "peg.AutoSelect",
        "nested=True on binary scores",
        lambda: peg.AutoSelect(nested=True).fit(*_scores()),
        ValueError,
        "nested: scores multiclass selections only; got binary scores",
    ),
    (
        "peg (CLI)",
        "peg select --html without --save",
        lambda: _cli("select", "--logits", "v.npy", "--labels", "y.npy", "--html"),
        SystemExit,
        "exit 2: peg select: error: --html: needs --save DIR",
    ),
]

# the same, for calls that take a temporary folder
FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[BaseException], str]] = [
    (
        "peg bench spec",
        "invalid YAML",
        lambda tmp: load_specs(_write(tmp / "bad.yaml", "name: [unclosed")),
        SpecError,
        "not valid YAML",
    ),
    (
        "peg bench spec",
        "no file",
        lambda tmp: load_specs(tmp / "missing.yaml"),
        FileNotFoundError,
        "spec: no file",
    ),
    (
        "peg (CLI)",
        "peg bench with an invalid spec",
        lambda tmp: _cli("bench", str(_write(tmp / "s.yaml", "name: s\ndata: imagenet\n"))),
        SystemExit,
        "exit 2: peg bench: error: .*missing",
    ),
    (
        "peg.compare",
        "the HTML report written onto a folder",
        lambda tmp: _comparison().to_html(tmp),
        IsADirectoryError,
        "path: .* is a folder",
    ),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
test_bad_files_raise_a_clear_error = raises_test(FILE_ERROR_CASES, files=True)
