"""The scale search's members run with eval-mode BatchNorm folded into the convolution before it
(issue 49: a fifth of a CNN member's forward on the CPU), only where the structure proves the
convolution feeds the BatchNorm alone; the search's scores and choice as without folding, the
fitted ensemble as the model is."""

from __future__ import annotations

import copy

import torch
from torch import nn

import peg
from peg.ensemble import Ensemble
from peg.methods.perturbation import _members
from peg.methods.perturbation._bn_fold import fold_batch_norm
from peg.models import SmallCNN


def _images(n: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 12, 12, generator=g), torch.randint(0, 3, (n,), generator=g)


def _cnn() -> nn.Module:
    """A SmallCNN whose BatchNorms are not the identity (random statistics, γ and β)."""
    torch.manual_seed(0)
    model = SmallCNN(in_channels=1, num_classes=3, width=4).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
                m.weight.normal_(1.0, 0.3)
                m.bias.normal_()
    return model


def _members_of(model: nn.Module, M: int = 4) -> list[dict[str, torch.Tensor]]:
    """M perturbed state dicts: every parameter and BatchNorm statistic moved per member."""
    g = torch.Generator().manual_seed(1)
    states = []
    for _ in range(M):
        state = {k: v.clone() for k, v in model.state_dict().items()}
        for k, v in state.items():
            if v.is_floating_point():
                v.add_(0.1 * torch.randn(v.shape, generator=g))
                if k.endswith("running_var"):
                    v.abs_().add_(0.1)
        states.append(state)
    return states


def test_folded_members_give_the_members_logits():
    model, (X, _) = _cnn(), _images(16)
    states = _members_of(model)
    want = Ensemble.from_state_dicts(model, states).member_logits(X, 16, progress=False)
    skeleton = copy.deepcopy(model)
    folded = fold_batch_norm(skeleton, model.state_dict(), X[:2])
    assert folded is not None
    assert [(p.conv, p.norm) for p in folded.pairs] == [
        ("stem.0", "stem.1"),
        ("block.0", "block.1"),
    ]
    assert not any(isinstance(m, nn.BatchNorm2d) for m in skeleton.modules())
    stacked, shared = Ensemble.from_state_dicts(model, states).stacked, {}
    stacked, shared = folded.entries(stacked, shared)
    assert "stem.0.bias" in stacked and "stem.1.running_mean" not in stacked
    got = Ensemble._sharing(skeleton, stacked, shared).member_logits(X, 16, progress=False)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # shared statistics (PEG's members): the folded bias is per member through γ and β
    shared_stats = [
        dict(s, **{k: model.state_dict()[k] for k in s if "running" in k}) for s in states
    ]
    want = Ensemble.from_state_dicts(model, shared_stats).member_logits(X, 16, progress=False)
    e = Ensemble.from_state_dicts(model, shared_stats)
    stacked, shared = folded.entries(e.stacked, e.shared)
    got = Ensemble._sharing(skeleton, stacked, shared).member_logits(X, 16, progress=False)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


class _Reused(nn.Module):
    """The convolution's output feeds the BatchNorm and a residual: not foldable."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4))
        self.head = nn.Linear(4 * 12 * 12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x) + self.body[0](x)
        return self.head(y.flatten(1))


class _OwnForward(nn.Sequential):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # the conv's output used twice
        y = self[0](x)
        return self[1](y) + y


def test_no_folding_where_the_convolution_feeds_more_than_the_batch_norm():
    X, _ = _images(4)
    reused = _Reused().eval()
    reused.body[1].running_mean.normal_()
    assert fold_batch_norm(copy.deepcopy(reused), reused.state_dict(), X[:2]) is None
    own = nn.Sequential(_OwnForward(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4))).eval()
    assert fold_batch_norm(copy.deepcopy(own), own.state_dict(), X[:2]) is None
    skeleton = copy.deepcopy(reused)
    fold_batch_norm(skeleton, reused.state_dict(), X[:2])
    assert isinstance(skeleton.body[1], nn.BatchNorm2d)  # left as it was
    # a hook on the convolution could read its output: not folded either
    hooked = _cnn()
    hooked.stem[0].register_forward_hook(lambda *a: None)
    folded = fold_batch_norm(copy.deepcopy(hooked), hooked.state_dict(), X[:2])
    assert folded is not None and [p.conv for p in folded.pairs] == ["block.0"]


def test_the_search_scores_as_without_folding(monkeypatch):
    model, data = _cnn(), _images()
    runs, folded = {}, []

    def spy(*args):
        folded.append(fold_batch_norm(*args))
        return folded[-1]

    monkeypatch.setattr(_members, "fold_batch_norm", spy)
    for flag in (False, True):
        monkeypatch.setattr(_members, "FOLD_BATCH_NORM", flag)
        for make in (peg.PEG, peg.PEP):
            options = {"grad_batch_size": 16} if make is peg.PEG else {}
            fitted = make(n_members=4, seed=0, progress=False, **options).fit(model, data)
            runs[flag, make] = fitted
    assert len(folded) == 2 and all(f is not None for f in folded)  # PEG's search, PEP's
    for make in (peg.PEG, peg.PEP):
        off, on = runs[False, make], runs[True, make]
        name = f"{make.scale_name}_"
        assert getattr(on, name) == getattr(off, name)
        assert set(on.search_) == set(off.search_)
        for k, v in off.search_.items():
            assert abs(on.search_[k] - v) < 1e-5
        # the fitted ensemble is the model's architecture, BatchNorm and all
        assert "stem.1.running_mean" in {**on.ensemble_.stacked, **on.ensemble_.shared}
        torch.testing.assert_close(
            on.ensemble_.member_logits(data[0][:8], 8, progress=False),
            off.ensemble_.member_logits(data[0][:8], 8, progress=False),
        )
