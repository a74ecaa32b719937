"""SWA and SWAG / SWAG-Diag: moments, the sampling covariance, BatchNorm refresh, errors."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector
from torch.optim.swa_utils import update_bn

import peg
from peg.train import Recipe

from conftest import BNNet, mlp

RECIPE = Recipe(epochs=8, lr=0.05, schedule="swa", swa_start=3, swa_lr=0.02, batch_size=32)


class _Collect:
    def __init__(self, swa_start: int) -> None:
        self.swa_start, self.weights = swa_start, []

    def __call__(self, epoch: int, model: nn.Module) -> None:
        if epoch > self.swa_start:
            self.weights.append(parameters_to_vector(model.parameters()).detach().clone())


def test_swa_is_the_running_mean_of_the_collected_weights(moons_data):
    collect = _Collect(RECIPE.swa_start)
    swa = peg.SWA(recipe=RECIPE, seed=0).fit(
        lambda: mlp(1), moons_data["train"], callbacks=[collect]
    )
    assert len(collect.weights) == RECIPE.epochs - RECIPE.swa_start == 5
    expected = torch.stack(collect.weights).mean(0)
    torch.testing.assert_close(parameters_to_vector(swa.swa_model_.parameters()), expected)
    logits = swa.member_logits(moons_data["test"][0])
    assert logits.shape == (1, len(moons_data["test"][0]), 2)


def test_swag_moments_and_deviations_match_the_collected_weights(moons_data):
    collect = _Collect(RECIPE.swa_start)
    swag = peg.SWAG(recipe=RECIPE, max_num_models=3, n_members=2, seed=0).fit(
        lambda: mlp(1), moons_data["train"], callbacks=[collect]
    )
    W = torch.stack(collect.weights)  # [5, P]
    torch.testing.assert_close(swag.mean_, W.mean(0))
    torch.testing.assert_close(swag.var_, (W**2).mean(0) - W.mean(0) ** 2, atol=1e-6, rtol=1e-4)
    running_means = W.cumsum(0) / torch.arange(1, 6).unsqueeze(1)
    expected_dev = (W - running_means)[-3:]  # only the last max_num_models deviations kept
    torch.testing.assert_close(swag.deviations_, expected_dev)


@pytest.mark.parametrize("diag", [False, True])
def test_sample_covariance_matches_the_swag_formula(moons_data, diag):
    torch.manual_seed(0)
    swag = peg.SWAG(recipe=RECIPE, diag=diag, n_members=1, seed=0).fit(
        lambda: nn.Linear(2, 2), moons_data["train"]
    )
    n = 20000
    Z = swag.sample_vectors(n)  # [n, P]
    K = len(swag.deviations_)
    expected = torch.diag(swag.var_)
    if not diag:
        assert RECIPE.epochs - RECIPE.swa_start == K  # K actually collected, not max_num_models
        expected = expected + swag.deviations_.T @ swag.deviations_ / (K - 1)
    scale = swag.meta_["scale"]  # the default of scale=None
    expected = scale * expected.double()
    assert swag.scale is None and scale == (1.0 if diag else 0.5)
    Zd = Z.double()
    mean = Zd.mean(0)
    emp = (Zd - mean).T @ (Zd - mean) / (n - 1)
    # standard errors of a Gaussian sample covariance: sqrt((S_ii S_jj + S_ij^2) / n)
    d = torch.diag(expected)
    se = ((d[:, None] * d[None, :] + expected**2) / n).sqrt()
    assert ((emp - expected).abs() / se).max() < 5
    se_mean = (d / n).sqrt()
    assert ((mean - swag.mean_.double()).abs() / se_mean).max() < 5


def test_samples_are_reproducible_and_do_not_depend_on_their_number(moons_data):
    swag = peg.SWAG(recipe=RECIPE, n_members=3, seed=5).fit(lambda: mlp(1), moons_data["train"])
    a = swag.sample_vectors(3)
    b = swag.sample_vectors(5)
    torch.testing.assert_close(a, b[:3], rtol=0, atol=0)
    assert not torch.equal(a, swag.sample_vectors(3, seed=6))
    X = moons_data["test"][0]
    torch.testing.assert_close(swag.member_logits(X), swag.ensemble(n=3).member_logits(X))


def test_swag_ensemble_shapes_and_probabilities(moons_data):
    swag = peg.SWAG(recipe=RECIPE, n_members=4).fit(lambda: mlp(1), moons_data["train"])
    X = moons_data["test"][0]
    logits = swag.member_logits(X)
    assert logits.shape == (4, len(X), 2)
    p = swag.predict_proba(X)
    torch.testing.assert_close(p.sum(-1), torch.ones(len(X)))
    assert len(swag.ensemble(n=7, diag=True, scale=1.0)) == 7
    assert swag.ensemble().meta["method"] == "swag"


def test_batchnorm_statistics_are_refreshed_per_sample(moons_data):
    X = moons_data["train"][0]
    swag = peg.SWAG(recipe=RECIPE, n_members=2, seed=0).fit(BNNet, moons_data["train"])
    ens = swag.ensemble()
    key = "body.1.running_mean"
    assert key in ens.stacked  # differs between samples
    for i in range(2):
        member = ens.member_model(i)
        check = copy.deepcopy(member)
        update_bn(list(X.split(256)), check)
        torch.testing.assert_close(member.state_dict()[key], check.state_dict()[key])
    frozen = peg.SWAG(recipe=RECIPE, n_members=2, seed=0, bn="eval").fit(BNNet, moons_data["train"])
    assert key in frozen.ensemble().shared  # SWA statistics kept for every sample


def test_peg_on_top_of_swag_diag_samples(moons_data):
    swag = peg.SWAG(recipe=RECIPE, diag=True, n_members=3).fit(lambda: mlp(1), moons_data["train"])
    p = peg.PEG(n_members=1, grad_batch_size=32, eta=0.1).fit(swag, moons_data["val"])
    assert len(p) == 3  # S=1 on each of the 3 samples (Algorithm 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scale": 0.0}, "scale"),
        ({"scale": -1}, "scale"),
        ({"max_num_models": 1}, "max_num_models"),
        ({"n_members": 0}, "n_members"),
        ({"bn": "batch"}, "bn"),
        ({"recipe": Recipe(epochs=5, schedule="swa", swa_start=4, swa_lr=0.01)}, "at least 2"),
        ({"recipe": Recipe(epochs=5)}, "swa_start and swa_lr"),
    ],
)
def test_bad_swag_hyperparameters(kwargs, match):
    kwargs = {"recipe": RECIPE, **kwargs}
    with pytest.raises(ValueError, match=match):
        peg.SWAG(**kwargs)


def test_swa_start_past_the_last_epoch_is_refused():
    with pytest.raises(ValueError, match="past the last epoch"):
        Recipe(epochs=5, schedule="swa", swa_start=6, swa_lr=0.01)
    with pytest.raises(ValueError, match="no epoch to collect"):
        peg.SWA(recipe=Recipe(epochs=5, schedule="swa", swa_start=5, swa_lr=0.01))


def test_swag_diag_cannot_give_low_rank_samples(moons_data):
    swag = peg.SWAG(recipe=RECIPE, diag=True, n_members=1).fit(lambda: mlp(1), moons_data["train"])
    with pytest.raises(ValueError, match="diag"):
        swag.sample_vectors(2, diag=False)


def test_swa_from_a_trained_model_with_swa_start_zero(moons_data, overfit_mlp):
    recipe = Recipe(epochs=3, lr=0.01, schedule="swa", swa_start=0, swa_lr=0.01, batch_size=32)
    swa = peg.SWA(recipe=recipe).fit(overfit_mlp, moons_data["train"])
    assert swa.ensemble().meta["collected"] == 3
    assert swa.history_[0]["lr"] == pytest.approx(0.01)
    before = parameters_to_vector(overfit_mlp.parameters())
    assert not torch.equal(before, parameters_to_vector(swa.swa_model_.parameters()))


def test_swa_is_reproducible_with_a_seed(moons_data):
    X = moons_data["test"][0]
    a = peg.SWA(recipe=RECIPE, seed=3).fit(BNNet, moons_data["train"]).member_logits(X)
    b = peg.SWA(recipe=RECIPE, seed=3).fit(BNNet, moons_data["train"]).member_logits(X)
    c = peg.SWA(recipe=RECIPE, seed=4).fit(BNNet, moons_data["train"]).member_logits(X)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
