"""`TemperatureScaling().fit(model, loader)` on a model's dense outputs (`[B, C, *S]`, a causal
LM's next tokens through `NextToken`): fitted streamed, the forwards run again on every pass,
never gathering the rows `[R, C]`; equal to the gathered fit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import peg
from peg.methods.calibration import _calibrator
from peg.methods.calibration.temperature import fit_temperature


class _Seg(nn.Module):
    """A small conv net: images `[B, 1, 12, 12]` -> logits `[B, 4, 12, 12]`."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 4, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 3 * self.net(x)


def _segmentation(model: nn.Module, n: int = 10):
    """Images and labels drawn from the model's own softmax at T = 2, a band ignored (255)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 1, 12, 12, generator=g)
    with torch.no_grad():
        probs = (model(x) / 2).movedim(1, -1).softmax(-1).reshape(-1, 4)
    y = torch.multinomial(probs, 1, generator=g).reshape(n, 12, 12)
    y[:, :2] = 255
    return x, y


@pytest.fixture
def never_gathered(monkeypatch):
    """Reading every row of the outputs at once fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the dense outputs were gathered")

    monkeypatch.setattr(_calibrator, "logits_and_labels", refuse)


def test_a_models_dense_outputs_are_fitted_streamed_as_the_gathered_fit(never_gathered):
    model = _Seg().eval()
    x, y = _segmentation(model)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=3)
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    ts = peg.TemperatureScaling(ignore_index=255).fit(model, loader)
    with torch.no_grad():
        rows = model(x).movedim(1, -1).reshape(-1, 4)
    keep = y.reshape(-1) != 255
    exact = fit_temperature(rows[keep], y.reshape(-1)[keep])
    assert ts.temperature_ == pytest.approx(exact, abs=1e-6)
    assert ts.temperature_ == pytest.approx(2.0, rel=0.25)  # labels drawn at T = 2
    assert ts.kind_.kind == "dense" and ts.n_classes_ == 4
    assert len(calls) > 2 * 4  # the 4 batches read again on every pass (and probed)
    probs = ts.predict_proba(x[:2])
    torch.testing.assert_close(probs, (model(x[:2]) / ts.temperature_).softmax(1))


def test_a_pair_of_tensors_streams_too(never_gathered):
    model = _Seg().eval()
    x, y = _segmentation(model)
    ts = peg.TemperatureScaling(ignore_index=255, batch_size=4).fit(model, (x, y))
    with torch.no_grad():
        rows = model(x).movedim(1, -1).reshape(-1, 4)
    keep = y.reshape(-1) != 255
    assert ts.temperature_ == pytest.approx(fit_temperature(rows[keep], y.reshape(-1)[keep]))


@pytest.mark.parametrize("loader", [False, True])
def test_multiclass_outputs_keep_the_gathered_path(monkeypatch, loader):
    def refuse(*args, **kwargs):
        raise AssertionError("multiclass outputs were streamed")

    monkeypatch.setattr(_calibrator, "predictor_batches", refuse)
    torch.manual_seed(0)
    model = nn.Linear(5, 3).eval()
    x, y = torch.randn(40, 5), torch.randint(0, 3, (40,))
    pairs = torch.utils.data.TensorDataset(x, y)
    data = torch.utils.data.DataLoader(pairs, batch_size=8) if loader else (x, y)
    ts = peg.TemperatureScaling().fit(model, data)
    with torch.no_grad():
        assert ts.temperature_ == pytest.approx(fit_temperature(model(x), y), rel=1e-9)
    assert ts.kind_.kind == "multiclass"


def test_a_causal_lm_through_next_token_is_fitted_streamed(never_gathered):
    transformers = pytest.importorskip("transformers")
    from peg.integrations.transformers import NextToken
    from tiny_hf import Items

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
        eos_token_id=0, initializer_range=0.5,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 40, (12, 10), generator=g)
    labels = ids.clone()
    labels[:, :3] = -100
    data = {"input_ids": ids, "labels": labels}
    loader = torch.utils.data.DataLoader(Items(data), batch_size=5)
    lm = NextToken(model)
    ts = peg.TemperatureScaling().fit(lm, loader)
    rows = [(z[t != -100], t[t != -100]) for z, t in lm.pairs(data, batch_size=5)]
    exact = fit_temperature(torch.cat([z for z, _ in rows]), torch.cat([t for _, t in rows]))
    assert ts.temperature_ == pytest.approx(exact, abs=1e-6)
    assert ts.temperature_ != pytest.approx(1.0, abs=0.05)
    assert ts.kind_.kind == "dense" and ts.n_classes_ == 40


def test_evaluate_reads_a_models_dense_outputs_per_position():
    model = _Seg().eval()
    x, y = _segmentation(model)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=3)
    out = peg.evaluate(model, loader, ignore_index=255)
    with torch.no_grad():
        logits = model(x)
    own = torch.nn.functional.cross_entropy(logits.double(), y, ignore_index=255)
    assert out["nll"] == pytest.approx(float(own), abs=1e-6)
    keep = y != 255
    error = float((logits.argmax(1)[keep] != y[keep]).double().mean())
    assert out["error"] == pytest.approx(error)


def test_an_ensembles_dense_outputs_are_fitted_on_log_p_bar(never_gathered):
    models = [_Seg().eval(), _Seg().eval()]
    with torch.no_grad():
        models[1].net[2].weight.mul_(0.5)  # another member
    ensemble = peg.Ensemble.from_models(models)
    x, y = _segmentation(models[0])
    ts = peg.TemperatureScaling(ignore_index=255, batch_size=4).fit(ensemble, (x, y))
    with torch.no_grad():
        members = torch.stack([m(x) for m in models]).double()
    log_p = torch.logsumexp(members.log_softmax(2), 0) - torch.log(torch.tensor(2.0))
    rows = log_p.movedim(1, -1).reshape(-1, 4)
    keep = y.reshape(-1) != 255
    exact = fit_temperature(rows[keep], y.reshape(-1)[keep])
    assert ts.temperature_ == pytest.approx(exact, abs=1e-6)
