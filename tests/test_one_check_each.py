"""One home for each check the methods share: the label checker (the data layer's), the test of a
pair, the predictor tests, `scores_of` and `WrapsCalibrator`; and finiteness checked once on
the label-free estimator's way."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import peg
import peg.metrics._inputs as metric_inputs
from peg.methods import _predictors
from peg.source import _values

SRC = Path(peg.__file__).parent


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(SRC)), ast.parse(p.read_text())) for p in SRC.rglob("*.py")]


def _defined(name: str) -> list[str]:
    return [
        where
        for where, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == name
    ]


def test_one_label_checker_in_the_data_layer() -> None:
    assert _defined("check_labels") == ["source/_values.py"]
    assert _defined("checked_labels") == []
    assert peg.metrics.check_labels is metric_inputs.check_labels is _values.check_labels


@pytest.mark.parametrize(
    ("call", "message"),
    [
        # as the data layer reads labelled data: class labels or regression targets
        (
            lambda: _values.check_labels(torch.ones(2), 3, None, "val", targets=True),
            "val: 3 inputs but 2 labels",
        ),
        (
            lambda: _values.check_labels(torch.tensor([0.5, np.nan]), 2, None, "val", targets=True),
            r"val: the labels contain NaN or inf \(1 values\)",
        ),
        (
            lambda: _values.check_labels(torch.tensor(1), None, None, "val", targets=True),
            "val: expected labels \\[N\\], got a scalar",
        ),
        # against predictions [n, c]: class indices
        (
            lambda: _values.check_labels([0.5, 1.0], 2, 3, "y"),
            "y: expected integer labels, got non-integer float values",
        ),
        (lambda: _values.check_labels([0, 3], 2, 3, "y"), r"y: expected labels in \[0, 3\)"),
        (lambda: _values.check_labels([0, 1], 3, 3, "y"), r"y: expected 3 labels \(N of pred\)"),
        (lambda: _values.check_labels([True, False], 2, 3, "y"), "bool labels"),
    ],
)
def test_the_checker_keeps_both_readings_messages(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_the_data_layer_reading_keeps_targets_and_makes_indices_int64() -> None:
    targets = torch.tensor([0.25, 1.5])
    assert _values.check_labels(targets, 2, None, "val", targets=True) is not None
    # exact: targets are passed through unchanged (no arithmetic runs on them, any CPU)
    assert torch.equal(_values.check_labels(targets, 2, None, "val", targets=True), targets)
    indices = _values.check_labels(
        torch.tensor([0, 2], dtype=torch.int32), 2, None, "val", targets=True
    )
    assert indices.dtype == torch.int64


PAIR_INLINE = re.compile(
    r"isinstance\([^()]*,\s*\(?tuple(?:, list)?\)?\)\s+and\s+len\([^()]*\)\s*[=!]= 2"
)


def test_one_test_of_a_pair() -> None:
    inline = {
        str(p.relative_to(SRC)): len(PAIR_INLINE.findall(p.read_text())) for p in SRC.rglob("*.py")
    }
    # is_pair's own body; a bracket of temperatures (lowest, highest) is no data pair
    allowed = {"source/batches.py": 1, "methods/calibration/temperature.py": 1}
    assert {k: v for k, v in inline.items() if v} == allowed
    assert peg.source.is_pair((np.zeros(2), [0, 1]))
    assert not peg.source.is_pair(({"x": np.zeros(2)}, [0, 1]))
    assert peg.source.is_pair(({"x": np.zeros(2)}, [0, 1]), arrays=False)
    assert not peg.source.is_pair((1, 2, 3), arrays=False)


def test_the_predictor_tests_and_scores_of_live_in_predictors() -> None:
    assert inspect.getmodule(_predictors.scores_of) is _predictors
    from peg.methods.calibration import label_shift
    from peg.methods.estimation import estimator

    assert estimator.scores_of is label_shift.scores_of is _predictors.scores_of
    spelled = re.compile(
        r"isinstance\((\w+), nn\.Module\) (?:and not|or) hasattr\(\1, \"member_logits\"\)"
    )
    where = {
        str(p.relative_to(SRC)): len(spelled.findall(p.read_text()))
        for p in (SRC / "methods").rglob("*.py")
    }
    assert {k: v for k, v in where.items() if v} == {"methods/_predictors.py": 2}  # the two tests
    assert _predictors.is_predictor(torch.nn.Linear(2, 2))
    assert _predictors.is_model(torch.nn.Linear(2, 2))
    assert not _predictors.is_model(peg.Ensemble.from_models([torch.nn.Linear(2, 2)]))
    assert not _predictors.is_predictor(np.zeros((2, 2)))


def test_wraps_calibrator_lives_with_the_calibrators() -> None:
    from peg.methods.calibration._wraps import WrapsCalibrator

    assert issubclass(peg.LabelShift, WrapsCalibrator)
    assert issubclass(peg.ConformalClassifier, WrapsCalibrator)
    calibration = SRC / "methods" / "calibration"
    upward = [
        f"{p.name}: {node.module}"
        for p in calibration.glob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith("peg.methods.conformal")
    ]
    assert upward == []


def test_estimate_checks_finiteness_once(monkeypatch) -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 60)
    logits = (3.0 * np.eye(3)[y] + rng.standard_normal((60, 3))).astype(np.float32)
    estimator = peg.PerformanceEstimator("ac").fit(logits, y)
    seen = []
    checked = metric_inputs.checked_pred
    monkeypatch.setattr(metric_inputs, "checked_pred", lambda *a: seen.append(a) or checked(*a))
    assert 0 <= estimator.estimate(logits[:30]).accuracy <= 1
    assert seen == []  # the logits' one check is scores_of's (check_finite_logits)
    bad = logits[:30].copy()
    bad[4, 1] = np.nan
    with pytest.raises(ValueError, match=r"X: the logits hold NaN or ±inf in 1 of 30 rows"):
        estimator.estimate(bad)
