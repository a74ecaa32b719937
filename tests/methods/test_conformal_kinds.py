"""Conformal prediction for binary scorers, multi-label heads (conformal risk control of the
false-negative rate) and dense predictions: the guarantees on synthetic data, the multi-label
threshold against a brute-force search, the binary sets against the multi-class ones."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch

import peg
from peg.methods.conformal._kinds import (
    dense_label_scores,
    false_negative_rate,
    fnr_threshold,
    two_columns,
)
from peg.methods.conformal._split import class_scores
from peg.methods.conformal.kinds import ConformalBinary, ConformalDense, ConformalMultilabel


def _binary(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    s = 2 * torch.randn(n, generator=g, dtype=torch.float64)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < torch.sigmoid(s)).long()
    return torch.sigmoid(1.7 * s), y  # over-confident


# APS's score of the second class is 1: below the error rate (~20%) its sets are all {0, 1}
@pytest.mark.parametrize(("score", "alpha"), [("lac", 0.1), ("aps", 0.3)])
def test_binary_sets_are_the_multiclass_sets_of_the_two_columns(score, alpha):
    p, y = _binary(600, torch.Generator().manual_seed(0))
    ours = ConformalBinary(alpha=alpha, score=score).fit(p[:400], y[:400])
    columns = torch.stack([(1 - p).log(), p.log()], -1)  # softmax: (1 - p, p)
    theirs = peg.ConformalClassifier(alpha=alpha, score=score).fit(columns[:400], y[:400])
    assert ours.quantile_ == pytest.approx(theirs.quantile_, rel=1e-12)
    sets = ours.predict_set(p[400:])
    assert sets.shape == (200, 2) and sets.dtype == torch.bool
    differ = sets != theirs.predict_set(columns[400:])
    assert float(differ.double().mean()) < 0.02
    at = class_scores(two_columns(p[400:]), score)[differ]  # only rounding at the threshold
    assert ((at - ours.quantile_).abs() < 1e-9).all()
    assert len(sets.sum(1).unique()) > 1  # sets of more than one size: the test can fail


def test_binary_coverage_holds_over_repeats():
    g = torch.Generator().manual_seed(1)
    covered = []
    for _ in range(20):
        p, y = _binary(1500, g)
        sets = ConformalBinary(alpha=0.1).fit(p[:500], y[:500]).predict_set(p[500:])
        covered.append(float(sets[torch.arange(1000), y[500:]].double().mean()))
    assert statistics.mean(covered) >= 0.9 - 0.01
    assert statistics.mean(covered) <= 0.9 + 0.03  # not every set {0, 1}


def _multilabel(n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    z = 2 * torch.randn(n, k, generator=g, dtype=torch.float64) - 1
    y = (torch.rand(n, k, generator=g, dtype=torch.float64) < torch.sigmoid(z)).long()
    return torch.sigmoid(1.5 * z + 0.3), y  # a miscalibrated head


def _brute_force_threshold(p: torch.Tensor, y: torch.Tensor, alpha: float) -> float:
    """The largest candidate t (a probability of the data, or 1) whose sets {p >= t} meet
    (n/(n+1)) R̂ + 1/(n+1) <= alpha, R̂ the mean false-negative rate: t̂ = 1 − λ̂."""
    n = len(p)
    for t in sorted({1.0, *p.flatten().tolist()}, reverse=True):
        risk = float(false_negative_rate(p >= t, y).mean())
        if n / (n + 1) * risk + 1 / (n + 1) <= alpha:
            return t
    raise AssertionError("no threshold")


@pytest.mark.parametrize("alpha", [0.05, 0.2, 0.5])
def test_the_risk_control_threshold_is_the_brute_force_one(alpha):
    g = torch.Generator().manual_seed(2)
    p, y = _multilabel(60, 4, g)
    p = (p * 20).round() / 20  # ties between entries
    y[0] = 0  # a point without labels: loss 0
    t = fnr_threshold(p, y, alpha)
    assert t == _brute_force_threshold(p, y, alpha)
    fitted = ConformalMultilabel(alpha=alpha).fit(p, y)
    assert fitted.threshold_ == t and fitted.lambda_ == pytest.approx(1 - t)


def test_multilabel_recall_is_at_least_one_minus_alpha_over_repeats():
    g = torch.Generator().manual_seed(3)
    alpha, k = 0.1, 10
    recall, size = [], []
    for _ in range(20):
        p, y = _multilabel(3000, k, g)
        sets = ConformalMultilabel(alpha=alpha).fit(p[:1000], y[:1000]).predict_set(p[1000:])
        recall.append(1 - float(false_negative_rate(sets, y[1000:]).mean()))
        size.append(float(sets.sum(1).double().mean()))
    assert statistics.mean(recall) >= 1 - alpha - 0.02
    assert min(recall) >= 1 - alpha - 0.05
    assert statistics.mean(recall) <= 1 - alpha + 0.03  # tight: not every label in every set
    assert statistics.mean(size) < k - 1


def test_multilabel_ignored_entries_are_neither_labels_nor_misses():
    g = torch.Generator().manual_seed(4)
    p, y = _multilabel(200, 5, g)
    hidden = y.clone()
    hidden[:, 4] = -100
    assert fnr_threshold(p, hidden, 0.1) == fnr_threshold(p[:, :4], y[:, :4], 0.1)
    sets = torch.zeros(2, 3, dtype=torch.bool)
    sets[0, 0] = True
    fnr = false_negative_rate(sets, torch.tensor([[1, 1, -100], [0, 0, 0]]))
    assert fnr.tolist() == [0.5, 0.0]


def _dense(b: int, g: torch.Generator, classes: int = 4, size: int = 6):
    z = 2 * torch.randn(b, classes, size, size, generator=g, dtype=torch.float64)
    true = z.softmax(1).movedim(1, -1).reshape(-1, classes)
    y = torch.multinomial(true, 1, generator=g).reshape(b, size, size)
    y[:, 0] = 255  # a row of every image unlabelled
    return (1.5 * z).softmax(1), y


def test_dense_sets_cover_the_positions_not_ignored():
    g = torch.Generator().manual_seed(5)
    covered = []
    for _ in range(10):
        probs, y = _dense(120, g)
        model = ConformalDense(alpha=0.1, ignore_index=255).fit(probs[:40], y[:40])
        sets = model.predict_set(probs[40:])
        assert sets.shape == probs[40:].shape and sets.dtype == torch.bool
        keep = y[40:] != 255
        hit = sets.gather(1, y[40:].clamp(max=3)[:, None])[:, 0]
        covered.append(float(hit[keep].double().mean()))
    assert statistics.mean(covered) >= 0.9 - 0.01
    assert statistics.mean(covered) <= 0.9 + 0.03
    assert model.n_calib_ == 40 * 5 * 6


def test_dense_scores_are_the_lac_scores_of_the_flattened_positions():
    g = torch.Generator().manual_seed(6)
    probs, y = _dense(3, g)
    keep = y != 255
    rows = probs.movedim(1, -1)[keep]
    expected = 1 - rows.gather(1, y[keep][:, None])[:, 0]
    assert torch.equal(dense_label_scores(probs, y, ignore_index=255), expected)


def test_numpy_in_numpy_out():
    g = torch.Generator().manual_seed(7)
    p, y = _multilabel(100, 3, g)
    sets = ConformalMultilabel(alpha=0.2).fit(p.numpy(), y.numpy()).predict_set(p.numpy())
    assert isinstance(sets, np.ndarray) and sets.dtype == bool
