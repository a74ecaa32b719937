"""PEP: Gaussian perturbations, σ by golden-section search with common random numbers."""

from __future__ import annotations

import pytest
import torch

import peg

from conftest import mlp


def test_same_noise_for_every_sigma(overfit_mlp, moons_data):
    p = peg.PEP(n_members=6, sigma="search", search=peg.ScaleSearch(grid=[1e-3, 1e-2, 1e-1])).fit(
        overfit_mlp, moons_data["val"]
    )
    assert len(p) == 6 and 1e-3 in p.search_ and 1 <= len(p.search_) <= 3
    theta = overfit_mlp.state_dict()["0.weight"]
    a, b = p.ensemble_at(0.01), p.ensemble_at(0.02)
    for i in range(6):
        da = (a.member_state(i)["0.weight"] - theta) / 0.01
        db = (b.member_state(i)["0.weight"] - theta) / 0.02
        torch.testing.assert_close(da, db, rtol=1e-3, atol=1e-4)
    assert p.search_[p.sigma_] == min(p.search_.values())


def test_noise_is_standard_normal_and_seeded(overfit_mlp, moons_data):
    a = peg.PEP(n_members=50, sigma=0.01, seed=1).fit(overfit_mlp, moons_data["val"])
    b = peg.PEP(n_members=50, sigma=0.01, seed=1).fit(overfit_mlp, moons_data["val"])
    eps = a.directions_[0]
    assert torch.equal(eps, b.directions_[0])
    assert abs(float(eps.mean())) < 0.05 and abs(float(eps.std()) - 1) < 0.05


def test_weights_only_filter_leaves_biases(overfit_mlp, moons_data):
    p = peg.PEP(n_members=3, sigma=0.05, params="weights").fit(overfit_mlp, moons_data["val"])
    assert p.param_names_ == ["0.weight", "2.weight"]
    assert torch.equal(p.ensemble_.shared["0.bias"], overfit_mlp.state_dict()["0.bias"])


def test_pep_on_an_ensemble(moons_data):
    p = peg.PEP(n_members=5, sigma=0.01).fit([mlp(0), mlp(1), mlp(2)], moons_data["val"])
    assert p.member_logits(moons_data["test"][0]).shape == (15, 1000, 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_members": 0}, "n_members"),
        ({"sigma": 0}, "sigma"),
        ({"search": "bracket"}, "search"),
        ({"bn": "batch"}, "bn"),
    ],
)
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        peg.PEP(**kwargs)
