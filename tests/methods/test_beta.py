"""Beta calibration: scikit-learn's logistic regression on [ln q, -ln(1 - q)] on a real
problem, the constraint a, b >= 0 (a negative coefficient's feature dropped, as the paper),
Platt scaling as its special case, two-column rows only, save/load and `to_module`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.naive_bayes import GaussianNB

import peg
from bad_inputs import raises_test
from peg.methods.calibration.beta import beta_features


def naive_bayes_scores() -> tuple[np.ndarray, np.ndarray]:
    """Log-odds of a Gaussian naive Bayes (the paper's over-confident example) fitted on a
    third of the breast-cancer set, and the labels."""
    data = load_breast_cancer()
    order = np.random.default_rng(0).permutation(len(data.target))
    X, y = data.data[order], data.target[order]
    log_p = GaussianNB().fit(X[:190], y[:190]).predict_log_proba(X)
    return log_p[:, 1] - log_p[:, 0], y


def rows(s: np.ndarray | torch.Tensor) -> torch.Tensor:
    s = torch.as_tensor(s, dtype=torch.float64)
    return torch.stack([torch.zeros_like(s), s], 1)


def reference(features: np.ndarray, y: np.ndarray) -> LogisticRegression:
    return LogisticRegression(C=1e12, tol=1e-12, max_iter=100_000).fit(features, y)


def nll(p: torch.Tensor, y: np.ndarray) -> float:
    return float(torch.nn.functional.nll_loss(p.double().log(), torch.as_tensor(y)))


def test_beta_is_the_logistic_regression_on_the_log_features():
    s, y = naive_bayes_scores()
    beta = peg.BetaCalibration().fit(rows(s[190:380]), torch.as_tensor(y[190:380]))
    features = beta_features(torch.as_tensor(s)).numpy()
    lr = reference(features[190:380], y[190:380])
    assert (lr.coef_ >= 0).all()  # the free fit is feasible here: the same fit
    p = beta.predict_proba(rows(s[380:]))[:, 1].double().numpy()
    assert np.abs(p - lr.predict_proba(features[380:])[:, 1]).max() < 1e-4
    assert beta.a_ == pytest.approx(lr.coef_[0, 0], rel=1e-4)


def test_a_negative_coefficient_is_dropped_and_the_rest_refitted():
    g = torch.Generator().manual_seed(1)
    s = 12 * torch.rand(3000, generator=g, dtype=torch.float64) - 6
    f = beta_features(s)
    truth = -1.0 * f[:, 0] + 1.5 * f[:, 1] - 1.0  # a < 0: not monotone in q
    y = torch.bernoulli(torch.sigmoid(truth), generator=g).long()
    free = reference(f.numpy(), y.numpy())
    assert free.coef_[0, 0] < 0  # the free fit is infeasible
    beta = peg.BetaCalibration().fit(rows(s), y)
    assert beta.a_ == 0 and beta.b_ > 0
    refit = reference(f[:, 1:].numpy(), y.numpy())  # the paper's refit without ln q
    assert beta.b_ == pytest.approx(refit.coef_[0, 0], rel=1e-4)
    assert beta.c_ == pytest.approx(refit.intercept_[0], rel=1e-4, abs=1e-5)


def test_its_validation_nll_is_at_most_platt_s_which_it_contains():
    s, y = naive_bayes_scores()
    val, labels = rows(s[190:380]), torch.as_tensor(y[190:380])
    beta = peg.BetaCalibration().fit(val, labels)
    platt = peg.PlattScaling(smoothed_targets=False).fit(val, labels)
    assert nll(beta.predict_proba(val), y[190:380]) <= nll(platt.predict_proba(val), y[190:380])
    assert beta.a_ != pytest.approx(beta.b_, rel=1e-3)  # a bent map, not Platt's


def test_save_load_and_the_exported_module_give_the_same_probabilities(tmp_path):
    s, y = naive_bayes_scores()
    beta = peg.BetaCalibration().fit(rows(s[190:380]), torch.as_tensor(y[190:380]))
    loaded = peg.load(beta.save(tmp_path / "beta.peg"))
    assert type(loaded) is peg.BetaCalibration and (loaded.a_, loaded.c_) == (beta.a_, beta.c_)
    test = rows(s[380:])
    torch.testing.assert_close(loaded.predict_proba(test), beta.predict_proba(test))
    module = beta.to_module()
    torch.testing.assert_close(module(test).float(), beta.predict_proba(test), atol=1e-6, rtol=0)


def _three_columns() -> None:
    g = torch.Generator().manual_seed(0)
    peg.BetaCalibration().fit(torch.randn(30, 3, generator=g), torch.arange(30) % 3)


ERROR_CASES = [
    ("calibrators", "beta calibration on three-class logits", _three_columns, ValueError,
     r"val: beta calibration maps two-column rows .*got 3 columns"),
]  # fmt: skip
test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
