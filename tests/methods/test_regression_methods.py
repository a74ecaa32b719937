"""PEG and PEP on regression models (Gaussian heads), and `evaluate` on regression."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import peg
from peg.source import Source
from peg.train import Recipe, train


def _gaussian_mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 2))  # mean, log-variance


def _sine(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    return x, torch.sin(x[:, 0]) + 0.1 * torch.randn(n, generator=g)


def _nll(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * (outputs[:, 1] + (y - outputs[:, 0]) ** 2 / outputs[:, 1].exp()).mean()


@pytest.fixture(scope="module")
def regressor():
    model, _ = train(
        _gaussian_mlp(0),
        _sine(256, 0),
        Recipe(epochs=150, lr=0.01, optimizer="adam", weight_decay=0.0, batch_size=64),
        loss=_nll,
    )
    return model


def test_peg_on_a_regression_model(regressor):
    val = _sine(400, 1)
    p = peg.PEG(n_members=6, grad_batch_size=64, eta="search", seed=0).fit(regressor, val)
    X, y = _sine(300, 2)
    out = p.member_logits(X)
    assert out.shape == (6, 300, 2)
    scores = peg.evaluate(p, X, y)
    base = peg.evaluate(regressor, X, y)
    assert set(scores) == {"rmse", "lpd", "nll", "calibration_error"}
    assert scores["rmse"] < 0.3 and math.isfinite(scores["lpd"])
    assert p.search_[p.eta_] == min(p.search_.values())
    assert base["rmse"] < 0.3


def test_peg_eta_zero_is_the_base_regressor(regressor):
    p = peg.PEG(n_members=3, grad_batch_size=32, eta=0.05, seed=0).fit(regressor, _sine(200, 1))
    X = _sine(50, 3)[0]
    with torch.no_grad():
        torch.testing.assert_close(p.ensemble_at(0.0).member_logits(X)[1], regressor(X))
    assert not torch.equal(p.member_logits(X)[0], p.member_logits(X)[1])


def test_pep_on_a_regression_model(regressor):
    p = peg.PEP(n_members=5, seed=0).fit(regressor, _sine(300, 1))
    assert p.member_logits(_sine(20, 4)[0]).shape == (5, 20, 2)


def test_regression_needs_a_gaussian_head_and_a_regression_criterion(regressor):
    one_output = nn.Sequential(nn.Linear(1, 1))
    with pytest.raises(ValueError, match=r"Gaussian head"):
        peg.PEG(n_members=2, grad_batch_size=16, eta=0.1).fit(one_output, _sine(100, 1))
    with pytest.raises(ValueError, match="criterion"):
        peg.PEG(
            n_members=2, grad_batch_size=16, eta=[0.1, 1], search=peg.ScaleSearch(criterion="ece")
        ).fit(regressor, _sine(100, 1))
    bad = _sine(100, 1)
    bad[1][3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        peg.PEG(n_members=2, grad_batch_size=16, eta=0.1).fit(regressor, bad)


def test_deep_ensemble_and_swag_train_regression_heads_with_a_loss():
    recipe = Recipe(epochs=40, lr=0.01, optimizer="adam", weight_decay=0.0, batch_size=64)
    de = peg.DeepEnsemble(n_members=2, recipe=recipe, loss=_nll).fit(
        lambda: _gaussian_mlp(0), _sine(256, 0)
    )
    X, y = _sine(100, 5)
    assert peg.evaluate(de, X, y)["rmse"] < 0.5
    swa_recipe = recipe.replace(schedule="swa", swa_start=20, swa_lr=0.005)
    swag = peg.SWAG(recipe=swa_recipe, diag=True, n_members=3, loss=_nll).fit(
        lambda: _gaussian_mlp(1), _sine(256, 0)
    )
    assert swag.member_logits(X).shape == (3, 100, 2)


def test_packed_ensembles_on_regression_heads():
    from peg.methods.packed import PackedEnsemble, packed_gaussian_nll
    from peg.models import MLP

    net = MLP(1, 2, hidden=(32,), packed=(2, 4, 1))
    recipe = Recipe(epochs=60, lr=0.01, optimizer="adam", weight_decay=0.0, batch_size=64)
    train(net, _sine(256, 0), recipe, loss=packed_gaussian_nll)
    X, y = _sine(100, 5)
    packed = PackedEnsemble().fit(net)
    assert packed.member_logits(X).shape == (4, 100, 2)
    assert peg.evaluate(packed, X, y)["rmse"] < 0.5
    with pytest.raises(ValueError, match="Gaussian member outputs"):
        packed_gaussian_nll(torch.zeros(4, 8, 3), torch.zeros(8))


def test_a_scale_whose_variance_overflows_scores_worst_instead_of_failing(regressor):
    """η = 1e6 keeps the outputs finite but exp(log-variance) overflows: that η loses."""
    p = peg.PEG(n_members=4, grad_batch_size=64, eta=[0.01, 1e6], seed=0).fit(
        regressor, _sine(400, 1)
    )
    assert p.eta_ == 0.01 and p.search_[1e6] == math.inf


def test_the_regression_search_records_the_mixture_nll(regressor):
    X, y = _sine(400, 1)
    p = peg.PEG(
        n_members=4,
        grad_batch_size=64,
        eta=[0.01, 0.1],
        seed=0,
        search=peg.ScaleSearch(holdout=0.0),
    ).fit(regressor, (X, y))
    # The search scored the points in its own (seeded) order, batch_size rows at a time: the same
    # computation here (rows in other positions of a batch may get other last bits of their
    # outputs from the CPU's kernels, which would move the NLL by ~1e-7 relative).
    _, score = p._split(Source((X, y)).rows())  # the scoring points' indices
    Xs, ys = X[score], y[score]
    assert len(Xs) == len(X)  # holdout=0: every point scores
    for eta, value in p.search_.items():
        out = p.ensemble_at(eta).member_logits(Xs, p.batch_size, progress=False)
        mean, var = peg.metrics.regression.split_gaussian(out)
        expected = -peg.metrics.regression.log_predictive_density(mean, var, ys)
        assert value == pytest.approx(expected, rel=1e-9)
