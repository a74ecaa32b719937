"""Last-layer PEG: the named `params` choices, the trunk/head split (`peg._heads`), prediction
running the trunk once per batch, the η search on the heads alone, archives and recipes."""

from __future__ import annotations

import pytest
import torch
from sklearn.base import clone
from torch import nn

import peg
from peg._params import select_parameters

from conftest import mlp, moons, overfit


class Net(nn.Module):
    """Not a Sequential: a trunk (`body`) then a head (`fc`), the head applied last."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.fc = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))


class Skip(Net):
    """The head's output is not the model's: the forward is not trunk-then-head."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        return self.fc(h) + h[:, :3]


# ---------------------------------------------------------------- the named params choices
def test_named_params_choices():
    model = Net()
    assert select_parameters(model, "last_layer") == ["fc.weight", "fc.bias"]
    assert select_parameters(model, ["body.2"]) == ["body.2.weight", "body.2.bias"]
    assert select_parameters(model, ("body", "fc")) == select_parameters(model, "all")
    assert select_parameters(model, [""]) == select_parameters(model, "all")  # "": the model
    seq = mlp(0)
    assert select_parameters(seq, "last_layer") == ["2.weight", "2.bias"]
    seq[2].requires_grad_(False)  # the last layer *with trainable parameters*
    assert select_parameters(seq, "last_layer") == ["0.weight", "0.bias"]


@pytest.mark.parametrize("bad", ["bias", [], ["fc", 3], 3, None])
def test_bad_params_are_refused_naming_params(bad):
    with pytest.raises(ValueError, match="params: expected"):
        peg.PEG(params=bad)
    with pytest.raises(ValueError, match="params: expected"):
        peg.PEP(params=bad)


def test_unknown_module_and_no_layer_name_params():
    with pytest.raises(ValueError, match="params: no module named 'head'"):
        select_parameters(Net(), ["head"])
    with pytest.raises(ValueError, match="params: 'last_layer' found no Linear or Conv"):
        select_parameters(nn.Sequential(nn.LayerNorm(3)), "last_layer")


@pytest.mark.parametrize("params", ["last_layer", ["fc"], ("body.0", "fc")])
def test_clone_and_get_params_keep_the_named_choices(params):
    method = peg.PEG(params=params, n_members=3)
    assert method.get_params()["params"] is params
    assert clone(method).get_params()["params"] == params


def _fitted(params="last_layer", **kwargs):
    torch.manual_seed(0)
    X, y = moons(300, 0)
    y = y + (X[:, 0] > 1.5).long()  # three classes
    model = overfit(Net(), X, y, steps=300)
    val = moons(400, 1)
    val = (val[0], val[1] + (val[0][:, 0] > 1.5).long())
    kwargs = {"n_members": 5, "grad_batch_size": 32, "eta": 0.05, "progress": False, **kwargs}
    return model, val, peg.PEG(params=params, **kwargs).fit(model, val)


def test_last_layer_peg_perturbs_the_head_only():
    _, _, p = _fitted()
    assert set(p.ensemble_.stacked) == {"fc.weight", "fc.bias"}
    assert p.meta_["params"] == "last_layer"
    _, _, p = _fitted(params=("fc",))
    assert p.meta_["params"] == ["fc"]
