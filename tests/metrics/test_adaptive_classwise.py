"""Adaptive (equal-mass) and classwise ECE: literal NumPy loops over the definitions,
torchmetrics per class, perfect calibration, ties and bins."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from peg import metrics
from peg.metrics import adaptive_ece, classwise_ece, ece
from peg.metrics._predictive import ranked
from peg.metrics.calibration import adaptive_bin_sums, binned_ece


def probs(n: int, c: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(c, 0.5), size=n)
    y = np.where(rng.random(n) < 0.6, p.argmax(1), rng.integers(0, c, n))
    return torch.from_numpy(p), torch.from_numpy(y)


def literal_adaptive(conf: np.ndarray, correct: np.ndarray, bins: int) -> float:
    """Sort by confidence; bin b = sorted positions ⌊bN/B⌋ .. ⌊(b+1)N/B⌋ - 1."""
    order = np.argsort(conf, kind="stable")
    conf, correct, n = conf[order], correct[order], len(conf)
    total = 0.0
    for b in range(bins):
        lo, hi = b * n // bins, (b + 1) * n // bins
        if hi > lo:
            total += (hi - lo) / n * abs(correct[lo:hi].mean() - conf[lo:hi].mean())
    return total


def literal_classwise(p: np.ndarray, y: np.ndarray, bins: int) -> float:
    """Kull et al. 2019: (1/C) Σ_c Σ_b (n_cb/N) |freq_cb − conf_cb|, equal-width bins of p_c,
    right-closed (lo, hi] with 0 in the first bin."""
    n, c = p.shape
    total = 0.0
    for k in range(c):
        for b in range(bins):
            lo, hi = b / bins, (b + 1) / bins
            inside = (p[:, k] > lo) & (p[:, k] <= hi) if b else p[:, k] <= hi
            if inside.any():
                gap = abs((y[inside] == k).mean() - p[inside, k].mean())
                total += inside.sum() / n * gap
    return total / c


@pytest.mark.parametrize("bins", [1, 7, 15, 600])
def test_adaptive_ece_is_the_literal_equal_mass_one(bins):
    p, y = probs(500, 5, 0)  # continuous confidences: no ties
    conf, correct = p.max(1).values.numpy(), (p.argmax(1) == y).numpy()
    assert adaptive_ece(p, y, bins=bins) == pytest.approx(
        literal_adaptive(conf, correct, bins), rel=1e-12, abs=1e-15
    )
    if bins == 1:
        assert adaptive_ece(p, y, bins=1) == pytest.approx(ece(p, y, bins=1), rel=1e-12)


def test_adaptive_bins_hold_nearly_equal_counts():
    p, y = probs(103, 3, 1)
    count, _, _ = adaptive_bin_sums(metrics.Predictive(p, y).ranked, 10)
    assert count.sum() == 103 and set(count.tolist()) == {10, 11}
    count, _, _ = adaptive_bin_sums(metrics.Predictive(p[:4], y[:4]).ranked, 10)
    assert count.sum() == 4 and count.max() == 1  # more bins than points: empty ones


def test_ties_share_the_bin_statistics_averaged_over_the_orders_of_the_tied_points():
    conf = np.array([0.4, 0.6, 0.6, 0.6, 0.6, 0.8, 0.8, 0.9, 0.9])
    correct = np.array([0, 1, 0, 0, 1, 1, 0, 1, 1], dtype=bool)
    bins = 4  # boundaries at positions 2, 4, 6: they cut the 0.6 and 0.8 groups
    tied = [np.flatnonzero(conf == v) for v in np.unique(conf)]
    sums = []
    for orders in itertools.product(*(itertools.permutations(g) for g in tied)):
        order = np.concatenate(orders)  # one order of the points by confidence
        c, k = conf[order], correct[order].astype(float)
        cuts = np.arange(bins + 1) * len(conf) // bins
        sums.append([(c[a:b].sum(), k[a:b].sum()) for a, b in itertools.pairwise(cuts)])
    mean = np.mean(sums, axis=0)  # [bins, 2]: sum of confidences, number correct
    count = np.diff(np.arange(bins + 1) * len(conf) // bins)
    expected = binned_ece(mean[:, 0] / count, mean[:, 1] / count, count)
    r = ranked(torch.from_numpy(conf), torch.from_numpy(correct))
    got = metrics.calibration.adaptive_ece_of(r, bins)
    assert got == pytest.approx(expected, rel=1e-13)
    # and not the order of the points: every permutation gives the same bits
    shuffled = np.random.default_rng(0).permutation(len(conf))
    again = ranked(torch.from_numpy(conf[shuffled]), torch.from_numpy(correct[shuffled]))
    assert metrics.calibration.adaptive_ece_of(again, bins) == got


def _calibrated(q: list[float], size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two classes; for each q, `size` points with p = (q, 1 − q) of which a fraction q is
    labelled 0: calibrated for both classes and for the top label (q >= 0.5)."""
    rows, labels = [], []
    for v in q:
        hits = round(v * size)
        rows += [[v, 1 - v]] * size
        labels += [0] * hits + [1] * (size - hits)
    return torch.tensor(rows, dtype=torch.float64), torch.tensor(labels)


def test_perfect_calibration_gives_zero():
    p, y = _calibrated([0.5, 0.625, 0.75, 0.875, 1.0], 40)
    for bins in (1, 5, 15):
        assert adaptive_ece(p, y, bins=bins) < 1e-12
        assert classwise_ece(p, y, bins=bins) < 1e-12
    # the classwise ECE sees what the top label hides: class 1 at p = 0.25 is over-confident
    q, labels = _calibrated([0.75], 8)
    assert classwise_ece(q, labels) == 0
    assert classwise_ece(q, torch.tensor([0] * 8)) == pytest.approx(0.25)


@pytest.mark.parametrize("bins", [3, 15])
def test_classwise_ece_is_the_literal_definition(bins):
    p, y = probs(600, 4, 2)
    assert classwise_ece(p, y, bins=bins) == pytest.approx(
        literal_classwise(p.numpy(), y.numpy(), bins), rel=1e-12
    )
    z = 2 * torch.randn(3, 600, 4, generator=torch.Generator().manual_seed(0))
    assert classwise_ece(z, y) == pytest.approx(
        literal_classwise(metrics.ensemble_probs(z).numpy(), y.numpy(), 15), rel=1e-12
    )


def test_classwise_ece_agrees_with_torchmetrics_per_class():
    """torchmetrics' binary calibration error of p_c against 1[y = c] (left-closed bins, which
    differ only on an edge; float32), averaged over the classes."""
    tm = pytest.importorskip("torchmetrics.functional.classification")
    p, y = probs(3000, 6, 3)
    theirs = np.mean(
        [
            float(tm.binary_calibration_error(p[:, c].contiguous(), (y == c).long(), n_bins=15))
            for c in range(6)
        ]
    )
    assert classwise_ece(p, y) == pytest.approx(theirs, abs=1e-6)


def test_bad_bins_name_the_argument():
    p, y = probs(10, 3, 0)
    for f in (adaptive_ece, classwise_ece):
        with pytest.raises(ValueError, match="bins"):
            f(p, y, bins=0)
