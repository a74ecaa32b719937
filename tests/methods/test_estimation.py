"""`peg.PerformanceEstimator` (issue 48): each label-free estimator near the truth where its
assumption holds, the streamed summary flat in N, the interval, and its errors."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

import peg
from bad_inputs import raises_test
from peg.methods.estimation import ESTIMATORS
from peg.methods.estimation._stats import Summary, atc_threshold, transport_cost

C = 5
MEANS = 2.0 * np.eye(C)


def _sample(n: int, seed: int, priors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian classes in C dimensions and their exact Bayes logits (equal source priors):
    a calibrated model, so that every estimator's assumption holds without shift."""
    rng = np.random.default_rng(seed)
    y = rng.choice(C, n, p=priors) if priors is not None else rng.integers(0, C, n)
    x = MEANS[y] + rng.standard_normal((n, C))
    return (x @ MEANS.T - 0.5 * (MEANS**2).sum(1)).astype(np.float32), y


@pytest.fixture(scope="module")
def fitted() -> peg.PerformanceEstimator:
    V, y = _sample(1500, 0)
    return peg.PerformanceEstimator(all_methods=True, transport_points=300).fit(V, y)


def _truth(X: np.ndarray, y: np.ndarray) -> float:
    return float((X.argmax(1) == y).mean())


def test_every_method_near_the_truth_without_shift(fitted):
    X, y = _sample(3000, 1)
    e = fitted.estimate(X)
    assert set(e.estimates) == set(ESTIMATORS)
    for key, value in e.estimates.items():
        assert abs(value - _truth(X, y)) < 0.045, key  # sampling: 1500 source, 3000 target
    lo, hi = e.interval
    assert 0 <= lo <= e.accuracy <= hi <= 1 and e.method == "auto (gate)" and e.n == 3000
    assert set(e.to_dict()) >= {"accuracy", "interval", "method", "n", "estimates", "priors"}


def test_label_shift_corrected_where_plain_atc_is_not(fitted):
    priors = np.array([0.7, 0.2, 0.05, 0.03, 0.02])
    X, y = _sample(4000, 2, priors)
    e = fitted.estimate(X).estimates
    truth = _truth(X, y)
    assert abs(e["label-shift"] - truth) < 0.02
    assert abs(e["atc-ls"] - truth) < 0.03
    assert abs(e["auto"] - truth) < 0.03
    assert np.allclose(fitted.estimate(X).priors, priors, atol=0.05)


def test_streamed_summary_is_flat_in_n():
    s = Summary(C, reservoir=200, seed=0)
    for seed in range(10):
        X, _ = _sample(500, seed)
        s.add(torch.from_numpy(X).double().log_softmax(-1))
    assert s.n == 5000 and s.rows().shape == (200, C)  # the reservoir is capped
    assert s.hist["mc"].sum() == 5000 and s.pred_counts.sum() == 5000


def test_estimate_same_in_one_batch_or_many(fitted):
    X, _ = _sample(1200, 3)
    whole = peg.PerformanceEstimator("atc-ne").fit(*_sample(1500, 0))
    one = whole.estimate(X).accuracy
    whole.set_params(batch_size=100)
    assert whole.estimate(X).accuracy == pytest.approx(one, abs=1e-9)


def test_fit_on_a_model_matches_fit_on_its_logits():
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.standard_normal((600, 4)), dtype=torch.float32)
    model = nn.Linear(4, 3).eval()
    with torch.no_grad():
        logits = model(x)
    y = (logits + torch.randn(600, 3)).argmax(1)
    a = peg.PerformanceEstimator("atc-mc").fit(model, (x[:400], y[:400])).estimate(x[400:])
    b = peg.PerformanceEstimator("atc-mc").fit(logits[:400], y[:400]).estimate(logits[400:])
    assert a.accuracy == pytest.approx(b.accuracy, abs=1e-6)


def test_atc_threshold_splits_the_source_at_its_error():
    rng = np.random.default_rng(0)
    scores, correct = rng.random(1000), (rng.random(1000) < 0.8).astype(float)
    t = atc_threshold(scores, correct, None)
    assert (scores >= t).mean() == pytest.approx(correct.mean(), abs=2e-3)


def test_transport_of_one_hot_probabilities_costs_nothing():
    lp = np.log(np.eye(C)[np.repeat(np.arange(C), 20)].clip(1e-12))
    assert transport_cost(lp, np.full(C, 0.2), 1000, 0).max() < 1e-6


@functools.cache
def _small() -> peg.PerformanceEstimator:
    return peg.PerformanceEstimator("ac").fit(*_sample(200, 0))


def _with_nan() -> np.ndarray:
    bad = _sample(50, 4)[0]
    bad[7, 1] = np.nan
    return bad


ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    (
        "PerformanceEstimator",
        "estimate before fit",
        lambda: peg.PerformanceEstimator().estimate(np.zeros((3, C), np.float32)),
        peg.NotFittedError,
        r"not fitted: call fit",
    ),
    (
        "PerformanceEstimator",
        "an unknown method",
        lambda: peg.PerformanceEstimator("bogus"),
        peg.InvalidParameterError,
        "method",
    ),
    (
        "PerformanceEstimator",
        "target logits of another class count",
        lambda: _small().estimate(np.zeros((10, 3), np.float32)),
        ValueError,
        r"X: expected logits \[N, 5\] \(the classes of val\)",
    ),
    (
        "PerformanceEstimator",
        "NaN among the target logits",
        lambda: _small().estimate(_with_nan()),
        ValueError,
        r"X.*(NaN|finite)",
    ),
    (
        "PerformanceEstimator",
        "fewer than 20 labelled source points",
        lambda: peg.PerformanceEstimator().fit(*_sample(10, 5)),
        ValueError,
        "val: 10 labelled points are too few",
    ),
    (
        "PerformanceEstimator",
        "shifted sets (auto's learned mode) of another class count",
        lambda: peg.PerformanceEstimator().fit(
            *_sample(50, 5), shifted=[("fog 1", np.zeros((10, 3), np.float32), np.zeros(10))]
        ),
        ValueError,
        r"shifted: expected \(name, logits \[n, 5\], labels \[n\]\) triples, item 0",
    ),
    (
        "PerformanceEstimator",
        "shift_points > 0 with images outside [0, 1] (the corruptions' range)",
        lambda: peg.PerformanceEstimator(shift_points=10).fit(
            nn.Sequential(nn.Flatten(), nn.Linear(16, C)),
            (torch.full((30, 1, 4, 4), 2.0), torch.arange(30) % C),
        ),
        ValueError,
        r"val: shift_points > 0 corrupts val's images, which must be in \[0, 1\]",
    ),
    (
        "PerformanceEstimator",
        "an empty target",
        lambda: _small().estimate(np.zeros((0, C), np.float32)),
        ValueError,
        "X",
    ),
]

test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)


def test_estimate_reads_a_memory_mapped_file(tmp_path):
    X, _ = _sample(900, 6)
    np.save(tmp_path / "x.npy", X)
    est = peg.PerformanceEstimator("atc-mc", batch_size=128).fit(*_sample(300, 0))
    mapped = est.estimate(np.load(tmp_path / "x.npy", mmap_mode="r"))
    assert mapped.n == 900
    assert mapped.accuracy == pytest.approx(est.estimate(X).accuracy, abs=1e-9)
