"""Last-layer PEG: the named `params` choices, the trunk/head split (`peg.runtime.heads`),
prediction
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


class Deep(nn.Module):
    """A head of three modules after a trunk."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, 16), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


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


# ---------------------------------------------------------------- the split
def test_split_found_for_sequential_and_for_a_head_module():
    from peg.runtime.heads import find_split

    x = torch.randn(4, 2)
    seq = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    state = seq.state_dict()
    split = find_split(seq, {"4.weight", "4.bias"}, [state], x)
    assert split is not None and len(split.trunk) == 4 and split.prefix == ""
    split = find_split(seq, {"2.weight", "4.bias"}, [state], x)  # the longest prefix: 2 children
    assert split is not None and len(split.trunk) == 2 and len(split.head) == 3
    assert find_split(seq, {"0.weight", "4.bias"}, [state], x) is None  # nothing to share
    net = Net()
    split = find_split(net, {"fc.weight", "fc.bias"}, [net.state_dict()], x)
    assert split is not None and split.prefix == "fc." and isinstance(split.trunk.fc, nn.Identity)
    torch.testing.assert_close(split.logits(net.state_dict(), x), net(x))
    assert find_split(net, {"body.2.weight"}, [net.state_dict()], x) is None  # mid-model
    deep = Deep()
    split = find_split(deep, {"head.0.weight"}, [deep.state_dict()], x)  # head.0 fails: head
    assert split is not None and split.prefix == "head."
    split = find_split(deep, {"head.2.weight"}, [deep.state_dict()], x)  # the deepest first
    assert split is not None and split.prefix == "head.2."


def test_split_refused_where_the_forward_is_not_trunk_then_head():
    from peg.runtime.heads import find_split

    net = Skip()
    assert find_split(net, {"fc.weight", "fc.bias"}, [net.state_dict()], torch.randn(4, 2)) is None


def test_a_model_declares_its_head():
    from peg.runtime.heads import find_split

    deep = Deep()
    deep.peg_head = "head"  # tried first
    split = find_split(deep, {"head.2.weight"}, [deep.state_dict()], torch.randn(4, 2))
    assert split is not None and split.prefix == "head."
    deep.peg_head = "body"  # a declared head that is not one: refused by the check
    split = find_split(deep, {"head.2.weight"}, [deep.state_dict()], torch.randn(4, 2))
    assert split is not None and split.prefix == "head.2."


# ---------------------------------------------------------------- prediction
def _count_calls(module):
    calls = []
    module.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("strategy", ["auto", "loop", "vmap", "folded", "chunked"])
@pytest.mark.parametrize("batch", [3, 256])
def test_prediction_runs_the_trunk_once_per_batch(strategy, batch):
    _, _, p = _fitted()
    X = torch.randn(600, 2)
    full = torch.stack([p.ensemble_.member_model(i)(X) for i in range(len(p.ensemble_))]).detach()
    ensemble = p.ensemble_
    got = ensemble.member_logits(X, batch, strategy=strategy, chunk_size=2)
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)  # other kernel shapes
    trunk, heads = ensemble._heads(X[:2])
    calls = _count_calls(trunk.body[0])
    whole = _count_calls(ensemble.skeleton.body[0])
    ensemble.member_logits(X, batch, strategy=strategy, chunk_size=2)
    assert len(calls) == -(-600 // batch)  # once per batch, whatever the members
    assert not whole  # the model as a whole never runs
    assert len(heads) == 5 and set(heads.stacked) == {"weight", "bias"}


def test_prediction_through_the_fitted_method_and_sequential_models(overfit_mlp, moons_data):
    X, _ = moons_data["test"]
    p = peg.PEG(n_members=4, grad_batch_size=32, eta=0.1, params="last_layer", progress=False)
    p.fit(overfit_mlp, moons_data["val"])
    assert p.ensemble_._heads(X) is not None
    full = torch.stack([p.ensemble_.member_model(i)(X) for i in range(4)]).detach()
    for strategy in ("auto", "loop"):
        torch.testing.assert_close(p.member_logits(X, strategy=strategy), full)


def test_no_split_everything_as_before():
    net = Skip()
    torch.manual_seed(0)
    states = []
    for _ in range(3):
        state = {k: v.clone() for k, v in net.state_dict().items()}
        state["fc.weight"] = state["fc.weight"] + 0.1 * torch.randn_like(state["fc.weight"])
        states.append(state)
    ensemble = peg.Ensemble.from_state_dicts(net, states)
    X = torch.randn(50, 2)
    assert ensemble._heads(X) is None
    full = torch.stack([ensemble.member_model(i)(X) for i in range(3)]).detach()
    torch.testing.assert_close(ensemble.member_logits(X), full)


# ---------------------------------------------------------------- the η search
def _without_split(monkeypatch):
    from peg.runtime import heads as _heads

    monkeypatch.setattr(_heads, "candidates", lambda *_: [])
    monkeypatch.setattr(_heads, "_SPLITS", {})


@pytest.mark.parametrize("race", [0.0, 3.0])
def test_the_search_on_the_heads_chooses_the_unshortcut_eta(monkeypatch, race):
    search = peg.ScaleSearch(method="golden", race=race)
    _, _, fast = _fitted(eta="search", search=search)
    _without_split(monkeypatch)
    _, _, slow = _fitted(eta="search", search=search)
    assert fast.eta_ == slow.eta_ and fast.search_.keys() == slow.search_.keys()
    for eta in fast.search_:
        assert fast.search_[eta] == pytest.approx(slow.search_[eta], rel=1e-5)


def test_the_search_runs_the_trunk_once_per_scoring_batch(monkeypatch):
    from peg.methods.perturbation import _members

    grid = [1e-3, 1e-2, 0.1, 1.0, 10.0]
    search = peg.ScaleSearch(race=0.0, early_stop=False, holdout=0.5)
    kwargs = {"eta": grid, "search": search, "batch_size": 50}
    _fitted(**kwargs)  # the split checked once (this process)
    counted = []
    for shortcut in (True, False):
        if not shortcut:  # every η's members on the scoring points (the trunk still shared)
            monkeypatch.setattr(_members, "find_split", lambda *_: None)
        calls = []

        def first_layer(m, *_, calls=calls):
            if isinstance(m, nn.Linear) and (m.in_features, m.out_features) == (2, 16):
                calls.append(1)

        hook = nn.modules.module.register_module_forward_hook(first_layer)
        try:
            _, _, p = _fitted(**kwargs)
        finally:
            hook.remove()
        counted.append(len(calls))
        assert p.meta_["validation_points"]["scoring"] == 200  # 4 batches of 50
    assert counted[1] - counted[0] == (len(grid) - 1) * 4


def test_the_search_computes_the_trunk_features_once():
    _, val, p = _fitted()
    X = val[0][:120]
    target = p.members_.search_target(X, 50)
    build, inputs = target.at, target.inputs
    assert inputs.shape == (120, 16)  # the trunk's features
    heads = build(0.05)
    assert isinstance(heads.skeleton, nn.Linear) and len(heads) == 5
    torch.testing.assert_close(
        heads.member_logits(inputs), p.ensemble_at(0.05).member_logits(X), rtol=1e-5, atol=1e-5
    )


# ---------------------------------------------------------------- the gradient pass
@pytest.mark.parametrize("precondition", [None, "kfac"])
def test_the_gradients_run_the_trunk_once_per_drawn_point(monkeypatch, precondition):
    """15 members' batches of 32 drawn from 100 direction points: the trunk runs on each
    distinct point once (not 15 × 32 times), and the rows are the unshortcut ones."""
    from peg.methods.perturbation import _gradients

    search = peg.ScaleSearch(holdout=0.75)
    kwargs = {"n_members": 15, "eta": "search", "search": search, "precondition": precondition}
    _fitted(**kwargs)  # the split checked once (this process)
    rows, counted = [], []
    for shortcut in (True, False):
        if not shortcut:
            monkeypatch.setattr(_gradients, "find_split", lambda *_: None)
        calls = []

        def first_layer(m, args, _out, calls=calls):
            if isinstance(m, nn.Linear) and (m.in_features, m.out_features) == (2, 16):
                calls.append(len(args[0]))

        hook = nn.modules.module.register_module_forward_hook(first_layer)
        try:
            _, _, p = _fitted(**kwargs)
        finally:
            hook.remove()
        rows.append(dict(p.ensemble_.stacked))
        counted.append(sum(calls))
    assert p.meta_["validation_points"]["directions"] == 100
    # the search's trunk passes are the same both ways; the gradients' differ
    saved = counted[1] - counted[0]
    drawn = 15 * 32 + (10 * 32 if precondition else 0)  # members' (and K-FAC's) batches
    assert drawn - 100 <= saved < drawn
    for a, b in zip(rows[0].values(), rows[1].values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # K-FAC inverts: rounding grows


# ---------------------------------------------------------------- archives and recipes
@pytest.mark.parametrize("params", ["last_layer", ["fc"]])
def test_archive_and_recipe_round_trip(tmp_path, params):
    model, val, p = _fitted(params=params)
    X = val[0]
    expected = p.member_logits(X)
    base = sum(v.numel() * v.element_size() for v in model.state_dict().values())
    head = sum(v.numel() * v.element_size() for v in model.fc.state_dict().values())
    full = p.save(str(tmp_path / "members.peg"), materialize=True)
    recipe = p.save(str(tmp_path / "recipe.peg"))
    size = (tmp_path / "members.peg").stat().st_size
    assert base - head + 5 * head <= size < base - head + 5 * head + 16_384  # + the header
    assert base <= (tmp_path / "recipe.peg").stat().st_size < base + 16_384
    loaded = peg.load(full, Net())
    assert set(loaded.stacked) == {"fc.weight", "fc.bias"}
    torch.testing.assert_close(loaded.member_logits(X), expected)
    rebuilt = peg.load(recipe, Net(), val=val)
    assert rebuilt.meta["params"] == (params if isinstance(params, str) else list(params))
    torch.testing.assert_close(rebuilt.member_logits(X), expected)
