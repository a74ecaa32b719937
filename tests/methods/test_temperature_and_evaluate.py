"""Temperature scaling and `evaluate`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import peg
from peg import metrics

from conftest import mlp


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
    ts = peg.methods.calibration.temperature.fit_temperature(z * 3.0, y)  # logits 3x too sharp
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


def _deep_ensemble(model, data):
    recipe = peg.train.Recipe(epochs=1, batch_size=64)
    return peg.DeepEnsemble(n_members=2, recipe=recipe, progress=False).fit(lambda: mlp(1), data)


@pytest.mark.parametrize(
    "make",
    [
        lambda model, data: model,  # an nn.Module: a one-member ensemble
        lambda model, data: peg.Ensemble.from_models([model, mlp(1)], meta={"method": "two"}),
        _deep_ensemble,  # a fitted method: its ensemble()
    ],
    ids=["module", "Ensemble", "DeepEnsemble"],
)
def test_temperature_scaling_saves_and_loads(overfit_mlp, moons_data, tmp_path, make):
    X, y = moons_data["val"]
    predictor = make(overfit_mlp, moons_data["train"])
    ts = peg.TemperatureScaling().fit(predictor, (X, y))
    path = ts.save(tmp_path / "calibrated.peg")
    loaded = peg.load(path, mlp())
    assert isinstance(loaded, peg.TemperatureScaling)
    assert loaded.temperature_ == ts.temperature_ and loaded.get_params() == ts.get_params()
    assert torch.equal(loaded.member_logits(X), ts.member_logits(X))
    assert isinstance(loaded.predictor_, peg.Ensemble) and "calibration" not in (
        loaded.predictor_.meta
    )
    assert loaded.meta_["method"] == "temperature"
    assert loaded.meta_["temperature"] == ts.meta_["temperature"] == ts.temperature_
    assert loaded.meta_.get("predictor") == ts.meta_.get("predictor")
    assert peg.archive.read_header(path)["meta"]["calibration"] == {
        "method": "temperature",
        "temperature": ts.temperature_,
        "n_classes": 2,  # refused for logits of another width (issue 46)
    }


def test_loading_knows_no_method():
    """`peg.load` finds calibrators in its registry; peg.loading imports no method module."""
    import ast

    source = Path(peg.loading.__file__).read_text()
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert not [name for name in imported if name and name.startswith("peg.methods")]
    assert peg.loading.CALIBRATORS["temperature"] == peg.TemperatureScaling._from_archive
