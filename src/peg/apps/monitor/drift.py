"""The monitor's tests of one chunk against the source, each a p-value (None where the chunk is
too small to say anything: `MIN_POINTS`).

- `label_shift_test`: EM's target priors q against the source's p, as counts n·q against
  n·p: Pearson's chi-square with C − 1 degrees of freedom (an approximation: the counts are
  estimated, not observed: the statistic is divided by its mean over the source's reference
  chunks / (C − 1), a dispersion factor, plus n / N for the source priors' own sampling error
  on its N points, else it fires too often: 24% of clean 2000-point chunks at p < 0.01 from
  a 2000-point source).
- `covariate_test`: a domain classifier (Fisher's linear discriminant on the log-probabilities,
  ridge-regularised, two-fold cross-fitted, folds stratified: closed form, no iterations)
  telling the chunk from a source sample of the same size; the mean of the two folds'
  out-of-fold AUROCs against 0.5 by the Mann-Whitney normal approximation, its sd the mean of
  the folds' (the two are correlated: a pooled sd made it fire 2-5% of clean chunks at
  p < 0.01); one-sided: only an AUROC above 0.5 is a shift. Cheap: no permutations.
- `ood_test`: the count of points whose energy is below the source's 5% quantile, against
  5% (one-sided, exact: beta-binomial, the threshold's own sampling error counted).
"""

from __future__ import annotations

import math

import numpy as np

from peg.utils.imports import lazy_module

stats = lazy_module("scipy.stats")  # on use: `peg` (the CLI) loads no scipy

MIN_POINTS = 20
TESTS = 3  # the monitor splits its alpha between these three (Bonferroni)


def label_shift_statistic(priors: np.ndarray, source: np.ndarray, n: int) -> float:
    expected = n * np.maximum(source, 1e-12)
    return float(((n * priors - expected) ** 2 / expected).sum())


def label_shift_test(
    priors: np.ndarray, source: np.ndarray, n: int, dispersion: float = 1.0, n_source: int = 0
) -> float | None:
    """Pearson's chi-square p-value, the statistic divided by `dispersion` (≥ 1: its mean over
    reference chunks of the source / (C − 1), EM's estimated counts vary more than observed
    ones would) + n / `n_source` (the source priors are a sample too: q − p's variance is
    dispersion·p/n + p/n_source; 0: ignored)."""
    if n < MIN_POINTS:
        return None
    scale = max(dispersion, 1.0) + (n / n_source if n_source > 0 else 0.0)
    chi2 = label_shift_statistic(priors, source, n) / scale
    return float(stats.chi2.sf(chi2, len(source) - 1))


def covariate_test(
    target: np.ndarray, reference: np.ndarray, seed: int
) -> tuple[float | None, float | None]:
    """(AUROC, p-value) of the domain classifier; target, reference `[n, C]` log-probabilities."""
    from sklearn.metrics import roc_auc_score

    n = min(len(target), len(reference))
    if n < MIN_POINTS:
        return None, None
    rng = np.random.default_rng(seed)
    t = target[rng.choice(len(target), n, False)]
    r = reference[rng.choice(len(reference), n, False)]
    X = np.concatenate([t, r])
    X = np.maximum(X, -50.0)  # log 0 from saturated softmaxes: finite features
    d = np.concatenate([np.ones(n), np.zeros(n)])
    fold = np.concatenate([rng.permutation(n) % 2, rng.permutation(n) % 2])  # stratified
    aucs, se = [], 0.0
    for k in (0, 1):
        train, test = fold != k, fold == k
        score = X[test] @ _discriminant(X[train], d[train])
        a, b = int(d[test].sum()), int(test.sum() - d[test].sum())
        aucs.append(float(roc_auc_score(d[test], score)))
        se += math.sqrt((a + b + 1) / (12.0 * a * b)) / 2  # Mann-Whitney's, one fold
    # Each fold's AUROC is exactly Mann-Whitney's under H0 (its classifier never saw it), but
    # the two are strongly correlated (both ≈ δ₀ᵀΣ⁻¹δ₁, the folds' mean differences): the
    # mean's sd is at most the mean of the two sds, not that over √2 (which fired 2-5% at 1%).
    auc = float(np.mean(aucs))
    return auc, float(stats.norm.sf((auc - 0.5) / se))


def _discriminant(X: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Fisher's direction Σ⁻¹ (μ₁ − μ₀), Σ the pooled covariance + a ridge of 1e-3 · its trace."""
    a, b = X[d == 1], X[d == 0]
    if len(a) < 2 or len(b) < 2:
        return np.zeros(X.shape[1])
    cov = (np.cov(a, rowvar=False) + np.cov(b, rowvar=False)) / 2
    cov = np.atleast_2d(cov)
    cov += np.eye(len(cov)) * (1e-3 * np.trace(cov) / len(cov) + 1e-9)
    return np.linalg.solve(cov, a.mean(0) - b.mean(0))


def ood_test(low: int, n: int, expected: float, n_source: int) -> float | None:
    """One-sided exact test of `low` points of `n` below the threshold, the source's
    `expected` quantile on `n_source` points: the share of the population below the k-th of N
    order statistics is Beta(k, N + 1 − k) (k = expected · N), so the count is beta-binomial,
    the threshold's own sampling error counted. (The normal approximation fired on 3% of
    clean 20-point chunks at p < 0.0033: one expected point, a skewed count.)"""
    if n < MIN_POINTS:
        return None
    N = max(int(n_source), 1)
    k = min(max(1, round(expected * N)), N)
    return float(stats.betabinom.sf(low - 1, n, k, N + 1 - k))
