"""Temperature scaling and `evaluate`."""

from __future__ import annotations

import pytest
import torch

import peg
from peg import metrics


def test_temperature_scaling_lowers_validation_nll(overfit_mlp, moons_data):
    X, y = moons_data["val"]
    ts = peg.TemperatureScaling().fit(overfit_mlp, (X, y))
    assert ts.temperature_ > 1.0  # an over-fitted model is over-confident
    with torch.no_grad():
        before = metrics.nll(overfit_mlp(X).unsqueeze(0), y)
    after = metrics.nll(ts.member_logits(X), y)
    assert after < before
    torch.testing.assert_close(ts.predict_proba(X).sum(-1), torch.ones(len(X)))


def test_temperature_scaling_on_an_ensemble(overfit_mlp, moons_data):
    X, y = moons_data["val"]
    p = peg.PEG(n_members=5, grad_batch_size=32, eta=0.05).fit(overfit_mlp, (X, y))
    ts = peg.TemperatureScaling().fit(p, (X, y))
    assert metrics.nll(ts.member_logits(X), y) <= metrics.nll(p.member_logits(X), y) + 1e-9
    assert ts.member_logits(X).shape == (1, len(X), 2)


def test_temperature_recovers_a_known_temperature():
    torch.manual_seed(0)
    z = torch.randn(4000, 5) * 2
    y = torch.distributions.Categorical(logits=z).sample()
    ts = peg.methods.temperature.fit_temperature(z * 3.0, y)  # logits 3x too sharp
    assert abs(ts - 3.0) < 0.25


def test_evaluate_keys_and_values(overfit_mlp, moons_data):
    X, y = moons_data["test"]
    single = peg.evaluate(overfit_mlp, X, y)
    assert set(single) == {"nll", "error", "brier", "ece", "mce"}
    p = peg.PEG(n_members=3, grad_batch_size=32, eta=0.05).fit(overfit_mlp, moons_data["val"])
    ens = peg.evaluate(p, X, y)
    assert set(ens) == {"nll", "error", "brier", "ece", "mce", "gibbs_nll"}
    assert ens["gibbs_nll"] >= ens["nll"]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=100)
    # compared with the tensors in the loader's 100-row batches: other batch boundaries can change
    # the logits' last bits on another CPU, and a confidence 1.2e-5 from an ECE bin edge here
    # could then change bins (ECE, MCE)
    assert peg.evaluate(p, loader) == pytest.approx(peg.evaluate(p, X, y, batch_size=100))
