"""`PerformanceEstimator`'s "cot-em" and "auto"'s gate (issue 48): the gate stays on the
label-shift branch when a label shift explains the target and opens when the inputs change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import peg
from peg.methods.estimation._reliability import SPREAD
from peg.methods.estimation._stats import Summary
from peg.methods.estimation.estimators import Auto, SourceFit, Target, synthetic_gap

C = 5
MEANS = 2.0 * np.eye(C)


def _sample(n: int, seed: int, priors=None, spread: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian classes and the Bayes logits of the unshifted problem (equal priors); with
    `spread` < 1 the class means move together: harder inputs, the same model (its p(y | x)
    is now wrong: it stays as confident as on the source while its accuracy falls)."""
    rng = np.random.default_rng(seed)
    y = rng.choice(C, n, p=priors) if priors is not None else rng.integers(0, C, n)
    x = spread * MEANS[y] + rng.standard_normal((n, C))
    return (x @ MEANS.T - 0.5 * (MEANS**2).sum(1)).astype(np.float32), y


@pytest.fixture(scope="module")
def fitted() -> peg.PerformanceEstimator:
    return peg.PerformanceEstimator(all_methods=True, transport_points=400).fit(*_sample(6000, 0))


def _truth(X: np.ndarray, y: np.ndarray) -> float:
    return float((X.argmax(1) == y).mean())


def test_cot_em_near_the_truth_under_label_shift_where_cot_is_not(fitted):
    X, y = _sample(4000, 1, np.array([0.6, 0.25, 0.1, 0.03, 0.02]))
    e = fitted.estimate(X).estimates
    em, cot = abs(e["cot-em"] - _truth(X, y)), abs(e["cot"] - _truth(X, y))
    assert em < 0.06 and cot > 0.1 and cot > 2 * em  # COT charges the label shift as error


def test_auto_keeps_the_label_shift_branch_under_label_shift(fitted):
    X, y = _sample(4000, 2, np.array([0.05, 0.05, 0.1, 0.3, 0.5]))
    e = fitted.estimate(X)
    auto = fitted.estimators_["auto"]
    target = _target(fitted, X)
    assert auto.weight(target) == 0.0
    assert e.accuracy == pytest.approx((e.estimates["ac"] + e.estimates["atc-ls"]) / 2, abs=1e-9)
    assert abs(e.accuracy - _truth(X, y)) < 0.03


def test_auto_opens_the_covariate_branch_when_the_inputs_change(fitted):
    X, y = _sample(4000, 3, spread=0.5)
    e = fitted.estimate(X)
    auto = fitted.estimators_["auto"]
    assert auto.weight(_target(fitted, X)) == 1.0
    assert e.accuracy == pytest.approx(max(e.estimates["cot"], e.estimates["cot-em"]), abs=1e-9)
    # not read as a label shift: EM's reading keeps the source's accuracy, the truth fell
    assert e.estimates["label-shift"] - _truth(X, y) > 0.2
    assert e.accuracy < e.estimates["label-shift"] - 0.05


def test_the_gate_threshold_is_the_noise_of_the_gap_under_label_shift():
    X, y = _sample(6000, 0)
    source = SourceFit(torch.from_numpy(X).double().log_softmax(-1), torch.from_numpy(y), 400, 0)
    gap = synthetic_gap(source)
    assert 0.0 <= gap < 0.03  # sampling noise of 3000 points, no shift of p(y | x)
    assert Auto().fit(source).delta == pytest.approx(max(2 * gap, 1e-3))


def test_one_point_target_gives_a_defined_estimate(fitted):
    e = fitted.estimate(_sample(1, 4)[0])
    assert e.n == 1 and 0.0 <= e.estimates["cot-em"] <= 1.0 and 0.0 <= e.accuracy <= 1.0


def test_cot_em_alone_is_a_method():
    est = peg.PerformanceEstimator("cot-em", transport_points=200).fit(*_sample(500, 0))
    e = est.estimate(_sample(600, 5)[0])
    # the method's own estimate, and those whose disagreement widens the interval
    assert e.method == "cot-em" and set(e.estimates) == {"cot-em", *SPREAD}
    assert e.interval[0] <= e.accuracy <= e.interval[1]


def _target(est: peg.PerformanceEstimator, X: np.ndarray) -> Target:
    summary = est.summary()
    est.add(summary, torch.from_numpy(X))
    assert isinstance(summary, Summary)
    return Target(summary, est.source_)
