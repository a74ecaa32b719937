"""Bad input to peg.load: archives that are not what it expects: each case raises the documented
error, before any work. The cases are rendered into docs/errors.md by tests/errors_table.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn

import peg
from bad_inputs import (
    _fitted_peg,
    _mlp,
    _TupleOut,
    _val,
    raises_test,
)
from peg.archive import ArchiveError


def _not_an_archive(tmp: Path) -> None:
    path = tmp / "notes.txt"
    path.write_text("not a peg archive")
    peg.load(path, _mlp())


def _truncated_archive(tmp: Path) -> None:
    path = tmp / "a.peg"
    peg.Ensemble.from_models([_mlp()]).save(str(path))
    path.write_bytes(path.read_bytes()[:-40])
    peg.load(path, _mlp())


def _archive(tmp: Path, model: nn.Module | None = None) -> str:
    return peg.Ensemble.from_models([model if model is not None else _mlp()]).save(
        str(tmp / "members.peg")
    )


def _calibrated(tmp: Path, calibration: dict[str, object]) -> str:
    meta = {"calibration": calibration}
    return peg.Ensemble.from_models([_mlp()], meta=meta).save(str(tmp / "calibrated.peg"))


def _recipe(tmp: Path) -> str:
    return _fitted_peg().save(str(tmp / "recipe.peg"))  # the default: base weights + recipe


# the same, for calls that take a temporary folder
FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[BaseException], str]] = [
    (
        "load",
        "a file that is not a peg archive",
        _not_an_archive,
        ArchiveError,
        "not a peg archive",
    ),
    ("load", "a truncated archive", _truncated_archive, ArchiveError, "archive"),
    (
        "load",
        "no file at the path",
        lambda tmp: peg.load(tmp / "missing.peg", _mlp()),
        FileNotFoundError,
        "no peg archive",
    ),
    ("load", "a folder", lambda tmp: peg.load(tmp, _mlp()), FileNotFoundError, "no peg archive"),
    ("load", "model of the wrong type", lambda tmp: peg.load(tmp, "mlp"), TypeError, "model"),
    (
        "load",
        "Laplace.load of an ensemble archive",
        lambda tmp: peg.Laplace.load(_archive(tmp), _mlp()),
        ArchiveError,
        "an ensemble archive, not a saved peg.Laplace",
    ),
    (
        "load",
        "a model of another architecture",
        lambda tmp: peg.load(_archive(tmp), nn.Linear(2, 3)),
        ArchiveError,
        "does not match the archive's architecture",
    ),
    (
        "load",
        "the bare model for an archive of a wrapped one",
        lambda tmp: peg.load(_archive(tmp, peg.with_output(_TupleOut(), 0)), _TupleOut()),
        ArchiveError,
        r"peg\.with_output",
    ),
    (
        "load",
        "a PEG recipe (PEG/PEP's default save) without val",
        lambda tmp: peg.load(_recipe(tmp), _mlp()),
        ArchiveError,
        r"val: .* is a PEG-2 recipe .*validation points.*materialize=True",
    ),
    (
        "load",
        "a PEG recipe with other validation data",
        lambda tmp: peg.load(_recipe(tmp), _mlp(), val=(_val()[0] + 1, _val()[1])),
        ArchiveError,
        "not the validation data",
    ),
    (
        "load",
        "a calibrated archive of an unknown calibrator",
        lambda tmp: peg.load(_calibrated(tmp, {"method": "platt"}), _mlp()),
        ArchiveError,
        "calibration: unknown kind 'platt'",
    ),
    (
        "load",
        "a temperature-scaled archive without a valid temperature",
        lambda tmp: peg.load(
            _calibrated(tmp, {"method": "temperature", "temperature": -1}), _mlp()
        ),
        ArchiveError,
        "calibration: expected a temperature > 0",
    ),
    (
        "load",
        "a Dirichlet-calibrated archive without its weights",
        lambda tmp: peg.load(_calibrated(tmp, {"method": "dirichlet", "params": {}}), _mlp()),
        ArchiveError,
        "calibration: the archive has no 'bias' tensor",
    ),
    (
        "load",
        "a calibrated archive with arguments the calibrator refuses",
        lambda tmp: peg.load(
            _calibrated(tmp, {"method": "histogram-binning", "params": {"n_bins": 0}}), _mlp()
        ),
        ArchiveError,
        "calibration: the archive's arguments do not fit HistogramBinning: n_bins",
    ),
]


test_bad_files_raise_a_clear_error = raises_test(FILE_ERROR_CASES, files=True)
