"""PEG and PEP fitted on streamed validation data: a tensor pair, a Dataset, a DataLoader, an
IterableDataset (PEP). Nothing gathers the whole set; a tensor pair and the equivalent
`TensorDataset` / `DataLoader` give bit-identical members."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

import peg

from conftest import mlp, moons

X, Y = moons(300, 0)


def _fit(cls, val, **kw):
    options = {"n_members": 4, "seed": 3, "progress": False}
    if cls is peg.PEG:
        options["grad_batch_size"] = 16
    return cls(**{**options, **kw}).fit(mlp(0, hidden=8).eval(), val)


def _same(a, b):
    assert a.meta_ == b.meta_
    for Da, Db in zip(a.directions_, b.directions_, strict=True):
        assert torch.equal(Da, Db)
    assert torch.equal(a.member_logits(X), b.member_logits(X))


KINDS = {
    "dataset": lambda: TensorDataset(X, Y),
    "loader-7": lambda: DataLoader(TensorDataset(X, Y), batch_size=7),
    "loader-512": lambda: DataLoader(TensorDataset(X, Y), batch_size=512),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(
    ("cls", "scale"),
    [(peg.PEG, {"eta": 0.1}), (peg.PEG, {"eta": "search"}), (peg.PEP, {"sigma": [0.01, 0.1]})],
)
def test_a_pair_a_dataset_and_a_loader_give_bit_identical_members(kind, cls, scale):
    pair = _fit(cls, (X, Y), **scale)
    other = _fit(cls, KINDS[kind](), **scale)
    _same(pair, other)
    assert pair._data_fingerprint == other._data_fingerprint  # recipes load from either


class Counting(Dataset):
    """Items made on the fly (a seeded function of the index), counting every read."""

    def __init__(self, n: int, as_dict: bool = False) -> None:
        self.n, self.as_dict, self.reads = n, as_dict, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.reads += 1
        g = torch.Generator().manual_seed(int(i))
        x = torch.randn(2, generator=g)
        y = int(x.sum() > 0)
        return {"x": x, "labels": y} if self.as_dict else (x, y)


def test_peg_reads_only_the_drawn_points_the_scoring_points_and_one_pass():
    ds = Counting(2000)
    fitted = _fit(peg.PEG, ds, eta=0.1, n_members=3)
    K, S = 16, 3
    first = 512  # the first batch, checked against the model
    assert ds.reads <= first + len(ds) + K * S
    assert len(fitted) == 3


class Keywords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = mlp(0, hidden=8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@pytest.mark.parametrize(("cls", "scale"), [(peg.PEG, {"eta": "search"}), (peg.PEP, {})])
def test_dict_items_call_the_model_with_keywords(cls, scale):
    ds = Counting(300, as_dict=True)
    options = {"n_members": 3, "progress": False, **scale}
    if cls is peg.PEG:
        options["grad_batch_size"] = 16
    fitted = cls(**options).fit(Keywords().eval(), DataLoader(ds, batch_size=50))
    probs = fitted.predict_proba(DataLoader(ds, batch_size=64))
    assert probs.shape == (300, 2) and torch.isfinite(probs).all()


class Stream(IterableDataset):
    def __iter__(self):
        return iter(zip(X, Y, strict=True))


def test_an_iterable_dataset_is_refused_by_peg_and_scored_on_its_head_by_pep():
    with pytest.raises(TypeError, match="cannot be indexed"):
        _fit(peg.PEG, Stream(), eta=0.1)
    pep = _fit(
        peg.PEP,
        DataLoader(Stream(), batch_size=32),
        sigma=[0.01, 0.1],
        search=peg.ScaleSearch(max_points=100),
    )
    assert pep.meta_["validation_points"] == {"total": 300, "directions": 300, "scoring": 100}
    every = peg.ScaleSearch(max_points=None, holdout=0)  # an indexable set: every point
    pair = _fit(peg.PEP, (X[:100], Y[:100]), sigma=[0.01, 0.1], search=every)
    # the first 100 points, in order, as σ's scoring set: the same scores up to rounding (the
    # stream is predicted in batches of 32, the pair in one of 100: other kernel shapes)
    assert pep.search_ == pytest.approx(pair.search_)


def test_the_scoring_cap():
    assert peg.ScaleSearch().max_points == 10_000
    capped = _fit(
        peg.PEG, TensorDataset(X, Y), eta=[0.01, 0.1], search=peg.ScaleSearch(max_points=40)
    )
    assert capped.meta_["validation_points"]["scoring"] == 40
    whole = _fit(
        peg.PEG, TensorDataset(X, Y), eta=[0.01, 0.1], search=peg.ScaleSearch(max_points=None)
    )
    assert whole.meta_["validation_points"]["scoring"] == 150
    for a, b in zip(capped.directions_, whole.directions_, strict=True):
        assert torch.equal(a, b)  # the cap changes the scoring, never the gradient steps


def test_bad_labels_in_a_later_batch_are_named_before_any_result():
    y = Y.clone()
    y[3 * 20 + 5] = 9
    method = peg.PEG(n_members=2, grad_batch_size=8, eta=0.1, progress=False)
    with pytest.raises(ValueError, match=r"val: batch 3 \(points 60–79\): labels must lie"):
        method.fit(mlp(0, hidden=8).eval(), DataLoader(TensorDataset(X, y), batch_size=20))
    assert "members_" not in method.__dict__


def test_recipes_from_a_loader(tmp_path):
    loader = DataLoader(TensorDataset(X, Y), batch_size=32)
    fitted = _fit(peg.PEG, loader, eta="search")
    path = fitted.save(str(tmp_path / "r"))
    back = peg.load(path, mlp(0, hidden=8), val=loader)
    assert torch.equal(back.member_logits(X), fitted.member_logits(X))
    again = peg.load(path, mlp(0, hidden=8), val=(X, Y))  # the same fingerprint
    assert torch.equal(again.member_logits(X), fitted.member_logits(X))


def test_lazy_prediction_streams_a_loader():
    lazy = _fit(peg.PEG, (X, Y), eta=0.1, lazy=True)
    eager = _fit(peg.PEG, (X, Y), eta=0.1)
    got = lazy.member_logits(DataLoader(TensorDataset(X, Y), batch_size=512), chunk_size=2)
    assert torch.equal(got, lazy.member_logits(X, chunk_size=2))  # the same batch boundaries
    close = lazy.member_logits(DataLoader(TensorDataset(X, Y), batch_size=37), chunk_size=3)
    assert torch.allclose(close, got, atol=1e-6)
    assert torch.allclose(got, eager.member_logits(X), atol=1e-6)
    shuffled = DataLoader(TensorDataset(X, Y), batch_size=37, shuffle=True)
    assert lazy.member_logits(shuffled).shape == got.shape  # same rows (any order) each pass


def test_bn_data_is_streamed():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).eval()
    options = {"n_members": 2, "grad_batch_size": 16, "eta": 0.1, "bn": "refresh"}
    pair = peg.PEG(progress=False, **options).fit(model, (X, Y), bn_data=(X, Y))
    loader = DataLoader(TensorDataset(X, Y), batch_size=512)
    streamed = peg.PEG(progress=False, **options).fit(model, (X, Y), bn_data=loader)
    assert torch.equal(pair.member_logits(X), streamed.member_logits(X))


def test_a_recipe_made_with_a_batch_fn_loads_with_it(tmp_path):
    X, y = moons(200, 0)
    odd = DataLoader([{"pair": (X[i], y[i])} for i in range(200)], batch_size=50)
    unpack = lambda batch: batch["pair"]  # noqa: E731  (batch -> (inputs, y))
    model = mlp(0).eval()
    fitted = peg.PEG(n_members=3, grad_batch_size=16, eta=0.1, batch_fn=unpack).fit(model, odd)
    path = fitted.save(str(tmp_path / "recipe"))
    loaded = peg.load(path, mlp(1), val=odd, batch_fn=unpack)
    assert torch.equal(loaded.member_logits(X), fitted.member_logits(X))
    with pytest.raises(ValueError, match="batch_fn"):
        peg.load(path, mlp(1), val=odd)  # its batches need the hook
