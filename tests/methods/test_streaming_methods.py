"""Training-time methods read their data batch by batch: a DataLoader or a Dataset gives the
members tensors give (bit-identical where the batches match); BatchNorm refreshes stream."""

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from peg import DeepEnsemble
from peg.methods.trained.swag import SWA, SWAG
from peg.train import Recipe

from conftest import moons

X, y = moons(96, 0)
SWA_RECIPE = Recipe(epochs=3, batch_size=16, schedule="swa", swa_start=1, swa_lr=0.01)


def bn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


class Counting(Dataset):
    def __init__(self, as_dict=False):
        self.reads = 0
        self.as_dict = as_dict

    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        self.reads += 1
        return {"x": X[i], "labels": y[i]} if self.as_dict else (X[i], y[i])


class Keyword(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = bn_net()

    def forward(self, x):
        return self.net(x)


def states(ensemble):
    return [ensemble.member_state(i) for i in range(len(ensemble))]


def same(a, b):
    return all(torch.equal(sa[k], sb[k]) for sa, sb in zip(a, b, strict=True) for k in sa) and len(
        a
    ) == len(b)


def test_deep_ensemble_on_a_loader_equals_tensors():
    kw = dict(n_members=2, recipe=Recipe(epochs=2, batch_size=16), progress=False)
    ref = DeepEnsemble(**kw).fit(bn_net, (X, y))
    loader = DataLoader(TensorDataset(X, y), batch_size=7, shuffle=True)
    other = DeepEnsemble(**kw).fit(bn_net, loader)
    assert same(states(ref.ensemble_), states(other.ensemble_))


def test_swa_on_a_dataset_equals_tensors_and_bn_streams():
    kw = dict(recipe=SWA_RECIPE, batch_size=32, progress=False)
    ref = SWA(**kw).fit(bn_net, (X, y))
    ds = Counting()
    other = SWA(**kw).fit(bn_net, ds)
    # training reads every item once per epoch, the BatchNorm pass once more
    assert ds.reads == len(X) * (SWA_RECIPE.epochs + 1)
    assert same([ref.swa_model_.state_dict()], [other.swa_model_.state_dict()])


def test_swag_refresh_streams_bn_data_and_matches_tensors():
    kw = dict(recipe=SWA_RECIPE, n_members=2, batch_size=32, progress=False)
    ref = SWAG(**kw).fit(bn_net, (X, y))
    bn = Counting()
    other = SWAG(**kw).fit(bn_net, DataLoader(TensorDataset(X, y), batch_size=16), bn_data=bn)
    # once for SWA's statistics, once per sample
    assert bn.reads == len(X) * 3
    assert same(states(ref.ensemble_), states(other.ensemble_))
    bn.reads = 0
    other.ensemble(n=3)
    assert bn.reads == len(X) * 3


def test_swag_on_dict_batches_with_a_keyword_model():
    kw = dict(recipe=SWA_RECIPE, n_members=2, batch_size=32, progress=False)
    fitted = SWAG(**kw).fit(Keyword, Counting(as_dict=True))
    ref = SWAG(**kw).fit(bn_net, (X, y))
    ours = [{k.removeprefix("net."): v for k, v in s.items()} for s in states(fitted.ensemble_)]
    assert same(states(ref.ensemble_), ours)


def test_batch_fn_is_used_for_training_and_bn_data():
    ds = [{"features": X[i], "target": y[i]} for i in range(len(X))]

    def split(b):
        return b["features"], b["target"]

    kw = dict(recipe=SWA_RECIPE, batch_size=32, progress=False)
    ref = SWA(**kw).fit(bn_net, (X, y))
    other = SWA(**kw, batch_fn=split).fit(bn_net, DataLoader(ds, batch_size=32))
    assert same([ref.swa_model_.state_dict()], [other.swa_model_.state_dict()])


def test_subspace_min_accuracy_and_bn_on_loaders_equal_tensors():
    from peg.subspace import RandomSubspace

    net = bn_net().eval()
    kw = dict(n_members=2, min_accuracy=0.3, bn="refresh", progress=False)
    ref = RandomSubspace(**kw).fit(net, (X, y), bn_data=X)
    val = DataLoader(TensorDataset(X, y), batch_size=512)
    bn = Counting()
    other = RandomSubspace(**kw).fit(net, val, bn_data=bn)
    assert same(states(ref.ensemble_), states(other.ensemble_))
    assert bn.reads >= len(X) * 2  # read anew for every sample, never kept
