"""Platt scaling: scikit-learn's sigmoid calibration to 1e-4 on a real problem, the plain
logistic fit without Platt's targets, binary scores and multilabel heads (shared and per
label), multiclass refused, save/load and `to_module`."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.calibration import CalibratedClassifierCV
from sklearn.datasets import load_breast_cancer
from sklearn.frozen import FrozenEstimator
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

import peg
from bad_inputs import raises_test


def breast_cancer() -> tuple[LogisticRegression, np.ndarray, np.ndarray]:
    """An over-confident logistic scorer fitted on a third of the breast-cancer set (real
    measurements, 569 rows), the features scaled, and the labels."""
    data = load_breast_cancer()
    X = StandardScaler().fit_transform(data.data)
    order = np.random.default_rng(0).permutation(len(X))
    X, y = X[order], data.target[order]
    clf = LogisticRegression(C=1e4, max_iter=10_000).fit(X[:190], y[:190])
    return clf, X, y


def scores(s: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A binary scorer's scores `[N]` as a float64 tensor."""
    return torch.as_tensor(s, dtype=torch.float64)


def test_platt_agrees_with_scikit_learn_sigmoid_calibration():
    clf, X, y = breast_cancer()
    val, test = slice(190, 380), slice(380, None)
    reference = CalibratedClassifierCV(FrozenEstimator(clf), method="sigmoid")
    reference.fit(X[val], y[val])
    s = clf.decision_function(X)
    platt = peg.PlattScaling().fit(scores(s[val]), torch.as_tensor(y[val]))
    p = platt.predict_proba(scores(s[test])).double().numpy()
    assert np.abs(p - reference.predict_proba(X[test])[:, 1]).max() < 1e-4
    assert 0 < platt.slope_ < 1  # C = 1e4 over-confident: the slope softens it


def test_without_platt_targets_it_is_the_logistic_regression_on_the_score():
    clf, X, y = breast_cancer()
    s = clf.decision_function(X[190:]) / 4  # not separable at this scale either way
    reference = LogisticRegression(C=1e12, tol=1e-12, max_iter=100_000)
    reference.fit(s[:, None], y[190:])
    platt = peg.PlattScaling(smoothed_targets=False).fit(scores(s), torch.as_tensor(y[190:]))
    assert platt.slope_ == pytest.approx(reference.coef_[0, 0], rel=1e-4)
    assert platt.intercept_ == pytest.approx(reference.intercept_[0], rel=1e-4, abs=1e-4)


def test_a_multilabel_head_gets_one_shared_map_or_one_per_label():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 2, (400, 3), generator=g)
    scale = torch.tensor([1.0, 3.0, 6.0])  # each label over-confident by its own factor
    logits = scale * ((2 * y - 1) + 1.5 * torch.randn(400, 3, generator=g))
    shared = peg.PlattScaling().fit(logits, y)
    flat = peg.PlattScaling().fit(logits.reshape(-1), y.reshape(-1))  # the same rows
    assert shared.slope_ == pytest.approx(flat.slope_, rel=1e-9)
    assert shared.predict_proba(logits).shape == (400, 3)
    own = peg.PlattScaling(per_label=True).fit(logits, y)
    p = own.predict_proba(logits)
    for k in range(3):  # label k's map is the one fitted on its column alone
        alone = peg.PlattScaling().fit(logits[:, k], y[:, k])
        torch.testing.assert_close(p[:, k], alone.predict_proba(logits[:, k]))
    slopes = [m.slope_ for m in own.label_maps_]
    assert slopes[0] > slopes[1] > slopes[2]  # the sharper label, the smaller slope


def test_separable_scores_warn_without_targets_and_stay_finite_with_them():
    y = torch.tensor([0, 0, 0, 1, 1, 1])
    s = torch.tensor([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    with pytest.warns(UserWarning, match="did not converge"):
        peg.PlattScaling(smoothed_targets=False, max_iter=20).fit(scores(s), y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        platt = peg.PlattScaling().fit(scores(s), y)
    assert 0 < platt.slope_ < 10


def test_save_load_and_the_exported_module_give_the_same_probabilities(tmp_path):
    clf, X, y = breast_cancer()
    s = clf.decision_function(X)
    platt = peg.PlattScaling().fit(scores(s[190:380]), torch.as_tensor(y[190:380]))
    loaded = peg.load(platt.save(tmp_path / "platt.peg"))
    assert type(loaded) is peg.PlattScaling and loaded.slope_ == platt.slope_
    test = scores(s[380:]).float()
    torch.testing.assert_close(loaded.predict_proba(test), platt.predict_proba(test))
    assert loaded.kind_.kind == "binary"
    module = platt.to_module()
    torch.testing.assert_close(module(test), platt.predict_proba(test), atol=1e-6, rtol=0)


def _multiclass() -> None:
    g = torch.Generator().manual_seed(0)
    peg.PlattScaling().fit(torch.randn(30, 3, generator=g), torch.arange(30) % 3)


ERROR_CASES = [
    ("calibrators", "Platt scaling on three-class logits", _multiclass, ValueError,
     r"val: PlattScaling does not take multiclass input .*it takes binary, multilabel"),
]  # fmt: skip
test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
