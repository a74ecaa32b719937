"""Members folded into the batch (`peg.runtime.folded`): the same logits as one member at a time."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import peg
from peg.models import RegressionMLP, build
from peg.runtime import auto_strategy as _auto_strategy
from peg.runtime.folded import NotFoldable

from conftest import BNNet


def perturbed(model: nn.Module, n: int, frozen: tuple[str, ...] = ()) -> peg.Ensemble:
    """n copies of `model` with every floating entry perturbed, except the names in `frozen`."""
    states = []
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        states.append(
            {
                k: v + 0.05 * torch.randn(v.shape, generator=g)
                if v.is_floating_point() and k not in frozen
                else v
                for k, v in model.state_dict().items()
            }
        )
    return peg.Ensemble.from_state_dicts(model.eval(), states)


class Norms(nn.Module):
    """LayerNorm over two trailing dimensions, GroupNorm, Conv1d, a Linear without bias."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(3, 8, 3, padding=1)
        self.group = nn.GroupNorm(2, 8)
        self.layer = nn.LayerNorm([8, 6])
        self.head = nn.Linear(48, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.group(self.conv(x)).relu()).flatten(1))


class Grouped(nn.Module):
    """A grouped convolution receiving the shared input, BatchNorm2d, residual sum."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1, groups=2)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.conv(x)).relu()
        return self.fc((h + self.conv2(h)).mean((2, 3)))


def _randomise_bn(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model


CASES = {
    "mlp": (lambda: build("mlp", in_features=5, num_classes=3, hidden=(16, 8)), (5,)),
    "bn-dropout": (BNNet, (2,)),
    "linear": (lambda: nn.Linear(5, 3), (5,)),  # the model is one layer
    "regression": (lambda: RegressionMLP(6, dropout=0.1), (6,)),  # Gaussian head, dropout
    "small-cnn": (lambda: build("small-cnn", in_channels=1, num_classes=4, width=4), (1, 12, 12)),
    "resnet20": (lambda: build("resnet20", in_channels=3, num_classes=5), (3, 16, 16)),
    "preresnet20": (lambda: build("preresnet20", num_classes=5), (3, 16, 16)),
    "norms": (Norms, (3, 6)),
    "grouped": (Grouped, (4, 5, 5)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("rows", [1, 3])
def test_folded_equals_the_loop(name, rows):
    torch.manual_seed(0)
    factory, shape = CASES[name]
    ens = perturbed(_randomise_bn(factory()), 4)
    X = torch.randn(7, *shape)
    ref = ens.member_logits(X, rows, strategy="loop")
    got = ens.member_logits(X, rows, strategy="folded")
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_shared_entries_stay_shared_and_are_not_copied():
    """Frozen entries (a layer whose weight, or BatchNorm statistics, every member shares)."""
    torch.manual_seed(1)
    model = _randomise_bn(Grouped())
    frozen = ("conv.weight", "bn.running_mean", "bn.running_var", "fc.bias")
    ens = perturbed(model, 3, frozen)
    assert set(frozen) <= set(ens.shared)
    X = torch.randn(6, 4, 5, 5)
    ref = ens.member_logits(X, strategy="loop")
    torch.testing.assert_close(ens.member_logits(X, strategy="folded"), ref, rtol=1e-5, atol=1e-5)
    storages = {
        t.untyped_storage().data_ptr() for t in [*ens.stacked.values(), *ens.shared.values()]
    }
    held = [t for m in ens._folded().modules() for t in getattr(m, "tensors", {}).values()]
    assert held and all(t.untyped_storage().data_ptr() in storages for t in held if t is not None)


def test_folding_follows_the_members_to_another_storage():
    torch.manual_seed(2)
    ens = perturbed(build("mlp", in_features=3, num_classes=2, hidden=(6,)), 3)
    X = torch.randn(5, 3)
    first = ens.member_logits(X, strategy="folded")
    ens.stacked = {k: v * 2 for k, v in ens.stacked.items()}  # e.g. what .to(device) does
    torch.testing.assert_close(
        ens.member_logits(X, strategy="folded"), ens.member_logits(X, strategy="loop")
    )
    assert not torch.allclose(first, ens.member_logits(X, strategy="folded"))


class _OwnParameter(nn.Module):
    """A module holding a parameter directly: no folded form."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self.fc = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


class _MixesRows(nn.Module):
    """Centres its activations over the batch: folding would mix members."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h - h.mean(0)


class _ReadsWeight(nn.Module):
    """Reads a layer's weight in its forward (weight tying): the folded layer has none."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.fc(x), self.fc.weight)


class _NoRunningStats(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 3)
        self.bn = nn.BatchNorm1d(3, track_running_stats=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x))


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (_OwnParameter, "_OwnParameter holds per-member tensors"),
        (_ReadsWeight, "the folded model failed"),
        (_NoRunningStats, "without running statistics"),
    ],
)
def test_an_explicit_fold_of_an_unfoldable_model_says_why(cls, message):
    torch.manual_seed(3)
    ens = perturbed(cls(), 3)
    with pytest.raises(NotFoldable, match=message):
        ens.member_logits(torch.randn(4, 2), strategy="folded")


@pytest.mark.parametrize("cls", [_OwnParameter, _MixesRows, _ReadsWeight, _NoRunningStats])
def test_auto_vectorises_with_vmap_where_folding_fails_or_disagrees(cls):
    torch.manual_seed(4)
    ens = perturbed(cls(), 3)
    X = torch.randn(6, 2)
    got = ens.member_logits(X, strategy="auto")
    assert _auto_strategy._FOLDS[ens._fold_key] is False
    assert ens._choose(X, None) == "vmap"
    torch.testing.assert_close(got, ens.member_logits(X, strategy="loop"), rtol=1e-5, atol=1e-5)


def test_a_model_that_mixes_rows_is_caught_by_the_check_not_trusted():
    torch.manual_seed(5)
    ens = perturbed(_MixesRows(), 3)
    X = torch.randn(6, 2)
    folded = ens.member_logits(X, strategy="folded")  # runs, but wrongly: members mixed
    assert not torch.allclose(folded, ens.member_logits(X, strategy="loop"), atol=1e-3)


def test_auto_folds_small_batches_of_a_foldable_model():
    torch.manual_seed(6)
    ens = perturbed(BNNet(), 3)
    X = torch.randn(8, 2)
    assert ens._choose(X, None) == "folded"
    assert _auto_strategy._FOLDS[ens._fold_key] is True
    torch.testing.assert_close(
        ens.member_logits(X), ens.member_logits(X, strategy="loop"), rtol=1e-5, atol=1e-5
    )


def test_bad_inputs_get_the_usual_error_under_folding():
    ens = perturbed(build("mlp", in_features=3, num_classes=2, hidden=(6,)), 2)
    for strategy in ("folded", "auto"):
        with pytest.raises(ValueError, match="X"):
            ens.member_logits(torch.randn(4, 5), strategy=strategy)
