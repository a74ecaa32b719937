"""`peg.evaluate` streams its classification metrics batch by batch from `iter_member_logits`:
equal (to ~1e-12 relative, error exactly) to the one-shot metrics on `member_logits`, on tensors,
a TensorDataset, a DataLoader and a loader of mappings, for every kind of predictor; never
holding `[M, N, C]`; a lazy PEG falls back to its whole member logits."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import peg
from peg import metrics
from peg.errors import NotStreamable

N, D, C, BATCH = 300, 6, 4, 64


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(N, D, generator=g)
    y = (X[:, 0] > 0).long() + 2 * (X[:, 1] > 0).long()
    return X, y


def _mlp(dropout: float = 0.0, seed: int = 1) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, C)).eval()


def _val() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    X = torch.randn(120, D, generator=g)
    return X, (X[:, 0] > 0).long() + 2 * (X[:, 1] > 0).long()


def _predictors() -> dict[str, object]:
    ensemble = peg.Ensemble.from_models([_mlp(seed=s) for s in (1, 2, 3)])
    fitted = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1, progress=False).fit(_mlp(), _val())
    mc = peg.MCDropout(n_members=3, batch_size=BATCH, progress=False).fit(_mlp(0.3))
    temperature = peg.TemperatureScaling(batch_size=BATCH).fit(ensemble, _val())
    return {
        "ensemble": ensemble,
        "peg": fitted,
        "mc_dropout": mc,
        "temperature": temperature,
        "module": _mlp(),
    }


def _views(X: torch.Tensor, y: torch.Tensor) -> dict[str, tuple]:
    """(args, kwargs) of evaluate for the same data in four forms, batches of BATCH rows."""
    pairs = TensorDataset(X, y)
    dicts = DataLoader([{"x": X[i], "labels": y[i]} for i in range(N)], batch_size=BATCH)
    return {
        "tensors": ((X, y), {}),
        "dataset": ((pairs,), {}),
        "loader": ((DataLoader(pairs, batch_size=BATCH),), {}),
        "dict_loader": ((dicts,), {"batch_fn": lambda b: (b["x"], b["labels"])}),
    }


def _assert_close(got: dict, want: dict, where: str = "") -> None:
    assert set(got) == set(want), where
    assert got["error"] == want["error"], where  # counts: exact
    for key in want:  # sums in another order (batch by batch): equal up to the last bits
        assert math.isclose(got[key], want[key], rel_tol=1e-12, abs_tol=1e-15), (where, key)


@pytest.mark.parametrize("name", ["ensemble", "peg", "mc_dropout", "temperature", "module"])
def test_evaluate_streams_equal_to_one_shot_metrics(name):
    X, y = _data()
    predictor = _predictors()[name]
    if isinstance(predictor, nn.Module):
        logits = peg.Ensemble.from_models([predictor]).member_logits(X, BATCH)
    else:  # MC dropout: the same masks, keyed by batch index
        logits = predictor.member_logits(X, BATCH)
    want = metrics.classification_metrics(logits, y)
    if logits.shape[0] == 1:
        want.pop("gibbs_nll")
    for form, (args, kwargs) in _views(X, y).items():
        got = peg.evaluate(predictor, *args, batch_size=BATCH, **kwargs)
        _assert_close(got, want, form)


class Recording:
    """A predictor wrapper that records the shape of every batch its iterator yields."""

    def __init__(self, inner: object) -> None:
        self.inner, self.shapes = inner, []

    def member_logits(self, X, batch_size=512, **kwargs):
        raise AssertionError("evaluate must stream, not gather member_logits")

    def iter_member_logits(self, X, batch_size=512, **kwargs):
        for logits in self.inner.iter_member_logits(X, batch_size, **kwargs):
            self.shapes.append(tuple(logits.shape))
            yield logits


@pytest.mark.parametrize("name", ["ensemble", "peg", "mc_dropout", "temperature"])
def test_streaming_never_holds_all_member_logits(name, monkeypatch):
    X, y = _data()
    recording = Recording(_predictors()[name])
    cats = []
    real_cat = torch.cat

    def cat(tensors, *args, **kwargs):
        out = real_cat(tensors, *args, **kwargs)
        cats.append(tuple(out.shape))
        return out

    monkeypatch.setattr(torch, "cat", cat)  # everywhere: evaluate's module and the predictors
    for args, kwargs in _views(X, y).values():
        recording.shapes.clear()
        peg.evaluate(recording, *args, batch_size=BATCH, **kwargs)
        assert len(recording.shapes) == math.ceil(N / BATCH)  # consumed batch by batch
        assert max(s[1] for s in recording.shapes) <= BATCH
    # nothing concatenated member logits of more than one batch: no [M, N, C] was made
    assert not [shape for shape in cats if len(shape) == 3 and shape[1] > BATCH]


def test_lazy_peg_falls_back_to_whole_member_logits_with_the_same_values():
    X, y = _data()
    lazy = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1, progress=False, lazy=True)
    lazy.fit(_mlp(), _val())
    with pytest.raises(NotStreamable):
        lazy.iter_member_logits(X, BATCH)
    want = metrics.classification_metrics(lazy.member_logits(X, BATCH), y)
    for args, kwargs in _views(X, y).values():
        _assert_close(peg.evaluate(lazy, *args, batch_size=BATCH, **kwargs), want)
    # temperature scaling of a lazy PEG falls back too
    calibrated = peg.TemperatureScaling(batch_size=BATCH).fit(lazy, _val())
    with pytest.raises(NotStreamable):
        calibrated.iter_member_logits(X)
    want = metrics.classification_metrics(calibrated.member_logits(X, BATCH), y)
    want.pop("gibbs_nll")
    _assert_close(peg.evaluate(calibrated, TensorDataset(X, y), batch_size=BATCH), want)


def test_a_foreign_predictor_with_member_logits_only_is_evaluated_whole():
    X, y = _data()
    ensemble = _predictors()["ensemble"]

    class Foreign:
        def member_logits(self, X, batch_size=512):
            return ensemble.member_logits(X, batch_size)

    want = metrics.classification_metrics(ensemble.member_logits(X, BATCH), y)
    _assert_close(peg.evaluate(Foreign(), DataLoader(TensorDataset(X, y), BATCH)), want)


def test_member_logits_is_the_concatenated_iterator_bit_for_bit():
    X, _ = _data()
    for name in ("ensemble", "peg", "mc_dropout"):
        predictor = _predictors()[name]
        parts = list(predictor.iter_member_logits(X, BATCH))
        assert [p.shape[1] for p in parts] == [64, 64, 64, 64, 44]
        assert torch.equal(torch.cat(parts, 1), predictor.member_logits(X, BATCH)), name


def test_labels_of_the_wrong_length_and_regression_keep_their_path():
    X, y = _data()
    ensemble = _predictors()["ensemble"]
    with pytest.raises(ValueError, match=f"expected {N} labels"):
        peg.evaluate(ensemble, X, y[:10])
    head = peg.Ensemble.from_models([nn.Linear(D, 2)])
    targets = X[:, 0].double()
    got = peg.evaluate(head, DataLoader(TensorDataset(X, targets), BATCH))
    assert got == peg.evaluate(head, X, targets, batch_size=BATCH)
    assert set(got) == {"rmse", "lpd", "nll", "calibration_error"}


def test_metrics_selects_what_evaluate_streams():
    X, y = _data()
    ensemble = _predictors()["ensemble"]
    keys = ["aurc", "classwise_ece", "nll", "augrc", "adaptive_ece"]
    want = metrics.classification_metrics(ensemble.member_logits(X, BATCH), y, metrics=keys)
    for form, (args, kwargs) in _views(X, y).items():
        got = peg.evaluate(ensemble, *args, batch_size=BATCH, metrics=keys, **kwargs)
        assert list(got) == keys, form  # in the order asked
        for key in ("aurc", "augrc", "adaptive_ece"):  # the same ranks: bit-equal
            assert got[key] == want[key], (form, key)
        for key in keys:
            assert math.isclose(got[key], want[key], rel_tol=1e-12, abs_tol=1e-15), (form, key)
    assert list(peg.evaluate(ensemble, X, y, metrics="aurc")) == ["aurc"]
    with pytest.raises(ValueError, match=r"metrics: unknown \['AURC'\]"):
        peg.evaluate(Recording(ensemble), X, y, metrics=["AURC"])  # before any prediction
    head = peg.Ensemble.from_models([nn.Linear(D, 2)])
    with pytest.raises(ValueError, match="metrics: selects classification metrics"):
        peg.evaluate(head, X, X[:, 0].double(), metrics=["nll"])
