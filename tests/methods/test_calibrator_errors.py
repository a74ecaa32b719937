"""Bad input to temperature scaling and the other calibrators: each case raises the documented
error, before any work. The cases are rendered into docs/errors.md by tests/errors_table.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import peg
from bad_inputs import (
    _mlp,
    _val,
    raises_test,
)


class _Refusing(nn.Module):
    """A model that fails if it runs: the error must come before any forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the model ran before the bad input was reported")


# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    # ---------------------------------------------------------------- TemperatureScaling
    (
        "TemperatureScaling",
        "max_iter < 1",
        lambda: peg.TemperatureScaling(max_iter=0),
        ValueError,
        "max_iter",
    ),
    (
        "TemperatureScaling",
        "batch_size < 1",
        lambda: peg.TemperatureScaling(batch_size=0),
        ValueError,
        "batch_size",
    ),
    (
        "TemperatureScaling",
        "labels out of range",
        lambda: peg.TemperatureScaling().fit(_mlp(), (_val()[0], _val()[1] + 3)),
        ValueError,
        r"val labels: expected labels in \[0, 3\)",
    ),
    (
        "TemperatureScaling",
        "non-integer labels",
        lambda: peg.TemperatureScaling().fit(_mlp(), (_val()[0], _val()[1] + 0.5)),
        ValueError,
        "val labels: expected integer labels",
    ),
    (
        "TemperatureScaling",
        "predictor of the wrong type",
        lambda: peg.TemperatureScaling().fit(42, _val()),
        TypeError,
        "predictor",
    ),
    (
        "TemperatureScaling",
        "fit without validation data",
        lambda: peg.TemperatureScaling().fit(_mlp()),
        ValueError,
        "val: temperature scaling needs labelled validation data",
    ),
    (
        "TemperatureScaling",
        "predict before fit",
        lambda: peg.TemperatureScaling().predict_proba(torch.zeros(2, 2)),
        peg.NotFittedError,
        "fit",
    ),
    (
        "TemperatureScaling",
        "val on another device (meta)",
        lambda: peg.TemperatureScaling().fit(_mlp(), (_val()[0].to("meta"), _val()[1])),
        ValueError,
        "val: on the meta device .* cpu",
    ),
    (
        "calibrators",
        "vector scaling on unknown scores",
        lambda: peg.VectorScaling(scores="probs"),
        ValueError,
        r"scores: expected one of \['auto', 'log_probs'\], got 'probs'",
    ),
    (
        "calibrators",
        "a negative ODIR weight",
        lambda: peg.MatrixScaling(reg_lambda=-1.0),
        ValueError,
        "reg_lambda: expected a finite number >= 0, got -1.0",
    ),
    (
        "calibrators",
        "a non-finite L2 weight",
        lambda: peg.DirichletCalibration(l2=float("nan")),
        ValueError,
        "l2: expected a finite number >= 0, got nan",
    ),
    (
        "calibrators",
        "no bins",
        lambda: peg.HistogramBinning(n_bins=0),
        ValueError,
        "n_bins: expected an integer >= 1, got 0",
    ),
    (
        "calibrators",
        "an unknown binning strategy",
        lambda: peg.HistogramBinning(strategy="kmeans"),
        ValueError,
        "strategy: expected one of",
    ),
    (
        "calibrators",
        "a probability floor of 1",
        lambda: peg.IsotonicCalibration(floor=1.0),
        ValueError,
        r"floor: expected a number in \(0, 1\), got 1.0",
    ),
    (
        "calibrators",
        "fit without validation data",
        lambda: peg.DirichletCalibration().fit(_mlp()),
        ValueError,
        "val: Dirichlet calibration needs labelled validation data",
    ),
    (
        "calibrators",
        "one label fewer than inputs",
        lambda: peg.IsotonicCalibration().fit(_mlp(), (_val()[0], _val()[1][:-1])),
        ValueError,
        "val: 200 inputs but 199 labels",
    ),
    (
        "calibrators",
        "labels beyond the model's classes",
        lambda: peg.HistogramBinning().fit(_mlp(), (_val()[0], _val()[1] + 3)),
        ValueError,
        r"val labels: expected labels in \[0, 3\)",
    ),
    (
        "calibrators",
        "binning a one-output model (a binary scorer) on labels of one class",
        lambda: peg.HistogramBinning().fit(nn.Linear(2, 1), (_val()[0], _val()[1] * 0)),
        ValueError,
        "val labels: every label is 0 \\(one class only\\): histogram binning cannot learn",
    ),
    (
        "calibrators",
        "logits with another number of columns than the fitted map's",
        lambda: peg.VectorScaling().fit(_mlp(), _val()).scale(torch.randn(1, 5, 4)),
        ValueError,
        r"logits: this VectorScaling was fitted on 3 classes, got logits with 4 columns",
    ),
    (
        "calibrators",
        "labels as a matrix (one-hot: read as multi-hot, which Dirichlet does not take)",
        lambda: peg.DirichletCalibration().fit(_mlp(), (_val()[0], torch.eye(3)[_val()[1]])),
        ValueError,
        r"val: DirichletCalibration does not take multilabel input \(multilabel logits \[N, 3\]"
        r".* one-hot class labels are read as multi-hot: pass labels.argmax\(1\)",
    ),
]


def _saved(tmp: Path, name: str, array: np.ndarray) -> np.ndarray:
    """`array` saved as `.npy` and opened memory-mapped, as saved logits or labels are."""
    np.save(tmp / name, array)
    return np.load(tmp / name, mmap_mode="r")


# the same, for calls that take a temporary folder
FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[BaseException], str]] = [
    (
        "calibrators",
        "a memory-mapped .npy of float labels that are not integers",
        lambda tmp: peg.MatrixScaling().fit(
            _Refusing(),
            (_val()[0], _saved(tmp, "y.npy", _val()[1].numpy().astype(np.float32) + 0.5)),
        ),
        ValueError,
        "val labels: expected integer labels, got non-integer float values",
    ),
    (
        "calibrators",
        "a memory-mapped .npy of labels of the wrong shape",
        lambda tmp: peg.TemperatureScaling().fit(
            _mlp(), (_val()[0], _saved(tmp, "y.npy", _val()[1].numpy()[:, None]))
        ),
        ValueError,
        r"val: logits \(200, 3\) need labels \[N\] \(class indices: multiclass\) or \[N, K\] "
        r"\(multi-hot: multilabel\), got shape \(200, 1\)",
    ),
    (
        "TemperatureScaling",
        "save of a predictor without stacked weights (MC dropout)",
        lambda tmp: (
            peg.TemperatureScaling()
            .fit(peg.MCDropout(insert=0.2).fit(_mlp()), _val())
            .save(tmp / "ts.peg")
        ),
        TypeError,
        "predictor: save writes an ensemble archive",
    ),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
test_bad_files_raise_a_clear_error = raises_test(FILE_ERROR_CASES, files=True)


@pytest.mark.parametrize(
    "make", [lambda: peg.TemperatureScaling(), lambda: peg.ConformalClassifier(score="aps")]
)
def test_probabilities_passed_as_logits_warn(make: Callable[[], object]) -> None:
    probs = nn.Sequential(_mlp(), nn.Softmax(-1))
    with pytest.warns(UserWarning, match="model: its outputs look like probabilities"):
        make().fit(probs, _val())  # type: ignore[attr-defined]
