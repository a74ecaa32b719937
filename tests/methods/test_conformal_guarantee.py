"""The guarantee of split conformal prediction, tested on peg's implementation.

1. Over 300 random calibration/test splits of one fixed data set (cached probabilities of a
   miscalibrated model: no model runs), the mean coverage is within a binomial band of
   k/(n + 1) >= 1 − α, and the per-split coverage follows the law of split conformal: the
   coverage given the calibration set is Beta(n + 1 − l, l), l = ⌊(n + 1)α⌋ (Vovk 2012;
   Angelopoulos & Bates 2021 §3.2), so the covered count of m test points is
   BetaBinomial(m, n + 1 − l, l), exactly for random splits of any fixed data set without ties:
   a Kolmogorov–Smirnov test against it (the plain Beta law ignores the test set's own binomial
   spread, 5% of the variance here). Seeds are fixed, so neither test can flake.
2. A property test (hypothesis) of coverage >= 1 − α in expectation for exchangeable data,
   whatever the model (random ones): the expectation over exchangeable orderings of n + 1
   points is computed exactly, by making each point in turn the test point and calibrating on
   the n others; that average is >= 1 − α for every data set, so no draw can fail by chance.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import peg
from peg.methods.conformal._split import class_scores, quantile_rank


class _Cached:
    """A predictor over cached log-probabilities: the inputs are its member logits."""

    def member_logits(self, X: torch.Tensor, batch_size: int = 512, **_) -> torch.Tensor:
        return X.unsqueeze(0)

    def iter_member_logits(self, X: torch.Tensor, batch_size: int = 512, **_) -> Iterator:
        yield X.unsqueeze(0)


def _population(n: int = 10_000, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities `[n, C]` of an over-confident model and labels drawn from the truth."""
    g = torch.Generator().manual_seed(0)
    truth = (1.5 * torch.randn(n, classes, generator=g)).softmax(-1)
    y = torch.multinomial(truth, 1, generator=g)[:, 0]
    model = (3.0 * truth.log() + torch.randn(n, classes, generator=g)).log_softmax(-1)
    return model, y


LOGP, Y = _population()


@pytest.mark.parametrize(
    ("score", "alpha", "seed"), [("lac", 0.1, 1), ("aps", 0.1, 2), ("raps", 0.05, 3)]
)
def test_coverage_over_splits_follows_the_beta_law(score, alpha, seed):
    n, splits = 500, 300
    g = torch.Generator().manual_seed(seed)
    # every point's label score, once: a test point is covered when it is <= q̂ (the sets
    # are checked to be exactly that on the first split, and against references elsewhere)
    labels = class_scores(LOGP.exp().double(), score, 1, 0.01).gather(1, Y[:, None])[:, 0]
    coverages = []
    for j in range(splits):
        perm = torch.randperm(len(Y), generator=g)
        cal, test = perm[:n], perm[n:]
        cp = peg.ConformalClassifier(alpha=alpha, score=score).fit(_Cached(), (LOGP[cal], Y[cal]))
        hit = labels[test] <= cp.quantile_
        if j == 0:
            sets = cp.predict_set(LOGP[test])
            assert torch.equal(sets[torch.arange(len(test)), Y[test]], hit)
        coverages.append(float(hit.double().mean()))
    cov = np.array(coverages)
    k = quantile_rank(n, alpha)
    l_ = math.floor((n + 1) * alpha)
    assert k == n + 1 - l_
    m = len(Y) - n
    law = stats.betabinom(m, n + 1 - l_, l_)  # the covered count of the m test points
    # mean coverage: E = k/(n + 1) >= 1 − α, within 4 standard errors of the per-split spread
    band = 4 * law.std() / m / math.sqrt(splits)
    assert law.mean() / m == pytest.approx(k / (n + 1)) and k / (n + 1) >= 1 - alpha
    assert abs(cov.mean() - k / (n + 1)) <= band
    # the whole distribution: a KS test against the law (fixed seeds: no flaking)
    counts = np.round(cov * m)
    assert stats.kstest(counts, law.cdf).pvalue > 0.01  # 0.40, 0.25, 0.38 as seeded
    # and the test has power: the law of a level 0.6 percentage points off is rejected
    shifted = stats.betabinom(m, n + 1 - l_ - 3, l_ + 3)
    assert stats.kstest(counts, shifted.cdf).pvalue < 1e-3


def _leave_one_out_coverage(make, data: tuple[torch.Tensor, torch.Tensor], cover) -> float:
    """The exact expected coverage over exchangeable orderings of the n + 1 points: each point
    in turn is the test point, the n others the calibration set."""
    x, y = data
    hits = []
    for i in range(len(y)):
        rest = torch.cat([torch.arange(i), torch.arange(i + 1, len(y))])
        fitted = make().fit(_Cached(), (x[rest], y[rest]))
        hits.append(cover(fitted, x[i : i + 1], y[i : i + 1]))
    return float(np.mean(hits))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    alpha=st.sampled_from([0.05, 0.1, 0.2, 0.3, 0.45]),
    extra=st.integers(0, 25),
    classes=st.integers(2, 6),
    score=st.sampled_from(["lac", "aps", "raps"]),
    scale=st.sampled_from([0.0, 0.5, 3.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def test_coverage_holds_in_expectation_whatever_the_model(
    alpha, extra, classes, score, scale, seed
):
    n = math.ceil(1 / alpha - 1) + extra  # the fewest points the quantile exists for, or more
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(n + 1, classes, generator=g)  # a random model (0: uniform)
    y = torch.randint(0, classes, (n + 1,), generator=g)  # labels unrelated to it
    covered = _leave_one_out_coverage(
        lambda: peg.ConformalClassifier(alpha=alpha, score=score, lam=0.1),
        (logits.log_softmax(-1), y),
        lambda cp, x, t: bool(cp.predict_set(x)[0, t[0]]),
    )
    assert covered >= 1 - alpha - 1e-12


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    alpha=st.sampled_from([0.1, 0.2, 0.45]),
    extra=st.integers(0, 15),
    score=st.sampled_from(["absolute", "normalized"]),
    seed=st.integers(0, 2**16),
)
def test_interval_coverage_holds_in_expectation_whatever_the_model(alpha, extra, score, seed):
    n = math.ceil(1 / alpha - 1) + extra
    g = torch.Generator().manual_seed(seed)
    outputs = torch.randn(n + 1, 2, generator=g)  # a random Gaussian head: mean, log-variance
    t = 3 * torch.randn(n + 1, generator=g, dtype=torch.float64)
    covered = _leave_one_out_coverage(
        lambda: peg.ConformalRegressor(alpha=alpha, score=score),
        (outputs, t),
        lambda cr, x, target: peg.metrics.coverage(cr.predict_interval(x), target) == 1.0,
    )
    assert covered >= 1 - alpha - 1e-12
