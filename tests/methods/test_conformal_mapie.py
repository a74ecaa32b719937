"""peg's split conformal prediction against an independent implementation, MAPIE 1.x (its
`SplitConformalClassifier` / `SplitConformalRegressor` on a prefit estimator that returns the
same probabilities or means peg's predictor gives): the same quantile to the bit and the same
sets where both define them the same way. Where they differ (docs/conformal.md):

- MAPIE takes k = ⌈(n + 1)(1 − α)⌉ from a float product, peg exactly on α as written: for
  n = 99, α = 0.45 MAPIE's k is 56 (100 · 0.55 = 55.00000000000001), peg's 55;
- MAPIE compares scores with q̂ up to 1e-8 (`EPSILON`); peg exactly;
- MAPIE's APS calibration score is always randomised (cumulative mass − u·p̂_y), its sets
  include the label that crosses q̂ (or, with include_last_label=False, at least the top one);
  peg's APS is `{c : score_c ≤ q̂}`, randomised only with `randomized=True`;
- MAPIE's RAPS tunes k_reg and λ on a part of the calibration set; peg takes them as given.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import peg
from peg.methods.conformal._split import class_scores, conformal_quantile

pytest.importorskip("mapie")
from mapie.classification import SplitConformalClassifier
from mapie.conformity_scores import APSConformityScore
from mapie.regression import SplitConformalRegressor
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin

C = 5


class _Table(ClassifierMixin, BaseEstimator):
    """A prefit classifier whose input is a row index into fixed probabilities."""

    def __init__(self, probs: np.ndarray | None = None) -> None:
        self.probs = probs

    def fit(self, X, y):  # prefit: nothing to learn
        return self

    def predict_proba(self, X):
        return self.probs[np.asarray(X)[:, 0].astype(int)]

    def predict(self, X):
        return self.predict_proba(X).argmax(1)


class _Means(RegressorMixin, BaseEstimator):
    def __init__(self, mu: np.ndarray | None = None) -> None:
        self.mu = mu

    def fit(self, X, y):
        return self

    def predict(self, X):
        return self.mu[np.asarray(X)[:, 0].astype(int)]


def _data(
    n: int, seed: int = 0, n_cal: int | None = None
) -> tuple[nn.Module, torch.Tensor, torch.Tensor, np.ndarray]:
    """A model, inputs, labels and the model's probabilities, computed on the calibration rows
    (the first `n_cal`) and the rest apart, as peg's predictor computes them (one batch each):
    the same matrix-product shapes, so the same bits on any CPU."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, C)).eval()
    x = torch.randn(n, 4)
    with torch.no_grad():
        parts = (x,) if n_cal is None else (x[:n_cal], x[n_cal:])
        p = torch.cat([model(part) for part in parts]).softmax(-1)
    y = torch.multinomial(p, 1, generator=torch.Generator().manual_seed(seed))[:, 0]
    return model, x, y, p.double().numpy()  # what peg's scores are computed from


def _mapie_lac(probs: np.ndarray, y: np.ndarray, n_cal: int, alpha: float):
    table = _Table(probs)
    table.classes_, table.n_features_in_ = np.arange(C), 1
    mapie = SplitConformalClassifier(
        table, confidence_level=1 - alpha, conformity_score="lac", prefit=True
    )
    idx = np.arange(len(probs))[:, None]
    mapie.conformalize(idx[:n_cal], y[:n_cal])
    _, sets = mapie.predict_set(idx[n_cal:])
    q = mapie._mapie_classifier.conformity_score_function_.quantiles_[0]
    return float(q), torch.from_numpy(sets[:, :, 0])


@pytest.mark.parametrize(("n_cal", "alpha"), [(300, 0.1), (500, 0.05), (199, 0.2)])
def test_lac_quantile_and_sets_equal_mapie(n_cal, alpha):
    model, x, y, p = _data(n_cal + 400, n_cal=n_cal)
    cp = peg.ConformalClassifier(alpha=alpha, score="lac").fit(model, (x[:n_cal], y[:n_cal]))
    q, sets = _mapie_lac(p, y.numpy(), n_cal, alpha)
    assert cp.quantile_ == q  # to the bit
    ours = cp.predict_set(x[n_cal:])
    near = (torch.from_numpy(1 - p[n_cal:]) - q).abs() <= 1e-8  # MAPIE's tolerance
    assert torch.equal(ours[~near], sets[~near])
    assert ours.sum() > 0 and not torch.equal(ours, torch.ones_like(ours))


def test_where_the_rank_differs_from_mapie():
    """n = 99, α = 0.45: peg's k = 55 (exact), MAPIE's 56 (from the float 100 · 0.55)."""
    model, x, y, p = _data(200, n_cal=99)
    cp = peg.ConformalClassifier(alpha=0.45).fit(model, (x[:99], y[:99]))
    q, _ = _mapie_lac(p, y.numpy(), 99, 0.45)
    scores = np.sort(1 - p[np.arange(99), y[:99].numpy()])
    assert cp.quantile_ == scores[54]
    assert q == scores[55]


def test_aps_scores_and_quantile_equal_mapie():
    """MAPIE's APS calibration scores are randomised (mass up to y − u·p̂_y): peg's randomised
    score with u' = 1 − u gives the same scores, and the same quantile of them."""
    _, _, y, p = _data(400)
    score = APSConformityScore()
    score.classes, score.random_state = np.arange(C), 7
    y_np = y.numpy()
    theirs = score.get_conformity_scores(y_np, p, y_enc=y_np)[:, 0]
    u = np.random.RandomState(7).uniform(size=len(p))  # the draws MAPIE made
    ours = class_scores(torch.from_numpy(p), "aps", u=torch.from_numpy(1 - u))
    ours = ours.gather(1, y[:, None])[:, 0].numpy()
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)
    from mapie.utils import _compute_classification_quantile

    q = _compute_classification_quantile(theirs, np.array([0.1]))[0]
    assert conformal_quantile(torch.from_numpy(theirs), 0.1) == q


def test_absolute_residual_intervals_equal_mapie():
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).eval() for _ in range(3)]
    ens = peg.Ensemble.from_models(models)
    x = torch.randn(700, 3)
    with torch.no_grad():  # the calibration and test rows apart, as `cr` predicts them
        mu = torch.cat([ens.member_logits(part)[..., 0] for part in (x[:300], x[300:])], 1)
        mu = mu.double().mean(0)
    t = mu + 0.5 * torch.randn(700, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cr = peg.ConformalRegressor(score="absolute").fit(ens, (x[:300], t[:300]))
    means = _Means(mu.numpy())
    means.n_features_in_, means.fitted_ = 1, True
    mapie = SplitConformalRegressor(
        means, confidence_level=0.9, conformity_score="absolute", prefit=True
    )
    idx = np.arange(700)[:, None]
    mapie.conformalize(idx[:300], t[:300].numpy())
    _, iv = mapie.predict_interval(idx[300:])
    ours = cr.predict_interval(x[300:]).numpy()
    np.testing.assert_allclose(ours, iv[:, :, 0], rtol=0, atol=1e-12)
    half = (iv[:, 1, 0] - iv[:, 0, 0]) / 2
    assert cr.quantile_ == pytest.approx(float(half[0]), abs=1e-12)
