"""`PerformanceEstimator` on a model: the model is copied once, at `fit`, not on every
`estimate` (a one-member ensemble built per call deep-copied it twice), and the user's model
is never touched: not mutated, its training / eval mode and its parameters as they were."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import peg
from peg.methods._predictors import member_logits_of


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


@pytest.fixture
def fitted() -> tuple[nn.Module, peg.PerformanceEstimator]:
    model = _cnn()  # in training mode, as a user may leave it
    return model, peg.PerformanceEstimator(seed=0).fit(model, _data(200, 0))


def test_estimate_copies_the_model_at_fit_not_per_call(fitted, monkeypatch):
    _, est = fitted
    X, _ = _data(48, 1)
    calls: list[object] = []
    deepcopy = copy.deepcopy

    def counted(x, memo=None, _nil=[]):  # noqa: B006 (copy.deepcopy's own signature)
        if isinstance(x, nn.Module):
            calls.append(x)
        return deepcopy(x, memo, _nil)

    monkeypatch.setattr(copy, "deepcopy", counted)
    for _ in range(3):
        est.estimate(X)
    assert calls == []  # was 2 a call: the ensemble's skeleton and its member module


def test_estimate_leaves_the_users_model_untouched(fitted):
    model, est = fitted
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = [(p, p.requires_grad) for p in model.parameters()]
    modes = [m.training for m in model.modules()]
    assert all(modes)
    X, _ = _data(48, 1)
    est.estimate(X)
    est.estimate(X)
    assert [m.training for m in model.modules()] == modes  # still in training mode
    assert [(p, p.requires_grad) for p in model.parameters()] == params  # the same tensors
    assert all(p.grad is None for p in model.parameters())
    after = model.state_dict()
    assert set(after) == set(before)
    # exact: each tensor is compared with its own clone, no kernel recomputes it (any CPU)
    for k, v in before.items():  # BatchNorm's running statistics and counter included
        assert torch.equal(after[k], v), k


def test_estimate_reads_the_model_as_it_was_at_fit(fitted):
    """The temperature and widths were fitted on the model as it was: a later edit of the
    user's model does not leak into `estimate`."""
    model, est = fitted
    X, _ = _data(48, 1)
    expected = member_logits_of(copy.deepcopy(model), X)  # read as before: a fresh ensemble
    first = est.estimate(X)
    torch.testing.assert_close(torch.cat(list(est.batches(X)), 1), expected)
    with torch.no_grad():
        model[-1].bias += torch.tensor([3.0, 0.0, -3.0, 0.0])
    assert est.estimate(X).accuracy == pytest.approx(first.accuracy, abs=1e-12)
    torch.testing.assert_close(torch.cat(list(est.batches(X)), 1), expected)
