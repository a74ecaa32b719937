"""Beta calibration: scikit-learn's logistic regression on [ln q, -ln(1 - q)] on a real
problem, the constraint a, b >= 0 (a negative coefficient's feature dropped, as the paper),
Platt scaling as its special case, a multilabel head, multiclass refused, save/load and
`to_module`."""

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


def scores(s: np.ndarray | torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(s, dtype=torch.float64)


def reference(features: np.ndarray, y: np.ndarray) -> LogisticRegression:
    return LogisticRegression(C=1e12, tol=1e-12, max_iter=100_000).fit(features, y)


def nll(p: torch.Tensor, y: np.ndarray) -> float:
    """The mean binary NLL of P(y = 1) `p` `[N]`."""
    return float(torch.nn.functional.binary_cross_entropy(p.double(), torch.as_tensor(y).double()))


def test_beta_is_the_logistic_regression_on_the_log_features():
    s, y = naive_bayes_scores()
    beta = peg.BetaCalibration().fit(scores(s[190:380]), torch.as_tensor(y[190:380]))
    features = beta_features(torch.as_tensor(s)).numpy()
    lr = reference(features[190:380], y[190:380])
    assert (lr.coef_ >= 0).all()  # the free fit is feasible here: the same fit
    p = beta.predict_proba(scores(s[380:])).double().numpy()
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
    beta = peg.BetaCalibration().fit(scores(s), y)
    assert beta.a_ == 0 and beta.b_ > 0
    refit = reference(f[:, 1:].numpy(), y.numpy())  # the paper's refit without ln q
    assert beta.b_ == pytest.approx(refit.coef_[0, 0], rel=1e-4)
    assert beta.c_ == pytest.approx(refit.intercept_[0], rel=1e-4, abs=1e-5)


def test_its_validation_nll_is_at_most_platt_s_which_it_contains():
    s, y = naive_bayes_scores()
    val, labels = scores(s[190:380]), torch.as_tensor(y[190:380])
    beta = peg.BetaCalibration().fit(val, labels)
    platt = peg.PlattScaling(smoothed_targets=False).fit(val, labels)
    assert nll(beta.predict_proba(val), y[190:380]) <= nll(platt.predict_proba(val), y[190:380])
    assert beta.a_ != pytest.approx(beta.b_, rel=1e-3)  # a bent map, not Platt's


def test_save_load_and_the_exported_module_give_the_same_probabilities(tmp_path):
    s, y = naive_bayes_scores()
    beta = peg.BetaCalibration().fit(scores(s[190:380]), torch.as_tensor(y[190:380]))
    loaded = peg.load(beta.save(tmp_path / "beta.peg"))
    assert type(loaded) is peg.BetaCalibration and (loaded.a_, loaded.c_) == (beta.a_, beta.c_)
    test = scores(s[380:])
    torch.testing.assert_close(loaded.predict_proba(test), beta.predict_proba(test))
    module = beta.to_module()
    torch.testing.assert_close(module(test).float(), beta.predict_proba(test), atol=1e-6, rtol=0)


def test_a_multilabel_head_shares_one_map_or_gets_one_per_label():
    s, y = naive_bayes_scores()
    logits = torch.as_tensor(np.stack([s[:380], s[:380] / 10], 1))  # [N, 2]: two labels
    labels = torch.as_tensor(np.stack([y[:380], y[:380]], 1))
    shared = peg.BetaCalibration(task="multilabel").fit(logits, labels)
    flat = peg.BetaCalibration().fit(logits.reshape(-1), labels.reshape(-1))
    assert (shared.a_, shared.b_) == pytest.approx((flat.a_, flat.b_), rel=1e-8)
    own = peg.BetaCalibration(task="multilabel", per_label=True).fit(logits, labels)
    p = own.predict_proba(logits)
    for k in range(2):  # label k's map is the one fitted on its column alone
        alone = peg.BetaCalibration().fit(logits[:, k], labels[:, k])
        assert (own.label_maps_[k].a_, own.label_maps_[k].b_) == (alone.a_, alone.b_)
        torch.testing.assert_close(p[:, k], alone.predict_proba(logits[:, k]))
    assert own.label_maps_[0].a_ != pytest.approx(own.label_maps_[1].a_, rel=1e-2)


def _multiclass() -> None:
    g = torch.Generator().manual_seed(0)
    peg.BetaCalibration().fit(torch.randn(30, 3, generator=g), torch.arange(30) % 3)


ERROR_CASES = [
    ("calibrators", "beta calibration on three-class logits", _multiclass, ValueError,
     r"val: BetaCalibration does not take multiclass input .*it takes binary, multilabel"),
]  # fmt: skip
test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
