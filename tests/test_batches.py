"""Batches of any shape (`peg.source.batches`): HuggingFace-style mapping batches and models taking
keyword inputs and returning `{"logits": ...}`, with zero configuration, against the same data
given as tensors through a wrapper; tuple batches with extra items; `batch_fn`; clear errors."""

from __future__ import annotations

import pytest
import torch
from sklearn.base import clone
from torch import nn
from torch.utils.data import DataLoader, Dataset

import peg
from peg.source._devices import move
from peg.source.batches import batch_rows, call_model, split_batch, take_rows

N, L, V, C = 40, 6, 11, 3


class TokenNet(nn.Module):
    """A tiny "language model": `forward(input_ids, attention_mask) -> {"logits": [B, C]}`."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, 8)
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, C)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
        mask = attention_mask.unsqueeze(-1).to(torch.float32)
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return {"logits": self.head(torch.relu(self.fc(pooled))), "pooled": pooled}


class Packed(nn.Module):
    """The same model taking one tensor `[B, 2L]` (ids and mask side by side): the reference."""

    def __init__(self, net: TokenNet) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x[:, :L], x[:, L:])["logits"]


class Dicts(Dataset):
    """Rows as dicts, like a tokenized HuggingFace dataset."""

    def __init__(self, label_key: str = "labels") -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, V, (N, L), generator=g)
        self.mask = (torch.rand(N, L, generator=g) > 0.2).long()
        self.mask[:, 0] = 1
        self.y = torch.randint(0, C, (N,), generator=g)
        self.key = label_key

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], self.key: self.y[i]}

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([self.ids, self.mask], 1), self.y


def _net(seed: int = 0) -> TokenNet:
    torch.manual_seed(seed)
    return TokenNet().eval()


@pytest.fixture(scope="module")
def ds() -> Dicts:
    return Dicts()


def _pair(nets: list[TokenNet]) -> tuple[peg.Ensemble, peg.Ensemble]:
    return peg.Ensemble.from_models(nets), peg.Ensemble.from_models([Packed(n) for n in nets])


# ---------------------------------------------------------------- the conventions
def test_split_batch_conventions():
    x, y = torch.zeros(4, 2), torch.arange(4)
    assert split_batch((x, y, "extra"))[0] is x and split_batch((x, y, "extra"))[1] is y
    assert split_batch([x])[1] is None and split_batch(x)[1] is None
    inputs, labels = split_batch({"a": x, "label": y})
    assert list(inputs) == ["a"] and labels is y
    inputs, labels = split_batch({"a": x, "labels": y, "label": y + 1})
    assert torch.equal(labels, y) and list(inputs) == ["a", "label"]
    assert split_batch({"odd": (x, y)}, lambda b: b["odd"])[1] is y
    assert call_model(lambda a: a.sum(), {"a": x}) == 0 and call_model(lambda t: t.shape, x)[0] == 4
    assert batch_rows({"a": x, "b": [y]}) == 4 and take_rows({"a": x, "b": [y]}, 1, 3)["b"][
        0
    ].shape == (2,)
    moved = move({"a": x.double(), "b": (y,)}, torch.device("cpu"))
    assert moved["a"].dtype == torch.float64 and isinstance(moved["b"], tuple)


def test_errors_name_what_was_expected(ds):
    with pytest.raises(
        ValueError,
        match=r"val: batch 3 is a mapping without 'labels' or 'label' \(keys: \['a'\]\); pass ",
    ):
        split_batch({"a": torch.zeros(2)}, name="val", index=3, need_labels=True)
    with pytest.raises(
        ValueError, match=r"disagree on the number of rows \(\['a'\]: 4, \['b'\]: 3\)"
    ):
        batch_rows({"a": torch.zeros(4), "b": torch.zeros(3)})
    with pytest.raises(
        TypeError, match=r"batch_fn: must return a pair \(inputs, y\), got tuple of 3"
    ):
        split_batch((1, 2, 3), lambda b: b)
    with pytest.raises(TypeError, match="batch_fn: expected None or a callable"):
        peg.MCDropout(batch_fn="labels")
    loader = DataLoader(ds, batch_size=16)
    unlabelled = DataLoader(torch.utils.data.TensorDataset(ds.ids), batch_size=16)
    with pytest.raises(ValueError, match=r"X: batch 0 has no labels"):
        peg.evaluate(_net(), unlabelled)
    no_labels = [{"input_ids": ds.ids[:8], "attention_mask": ds.mask[:8]}]
    with pytest.raises(ValueError, match=r"val: batch 0 is a mapping without 'labels'"):
        peg.TemperatureScaling().fit(_net(), DataLoader(no_labels, batch_size=None))
    # PEG reads mapping items by index (model(**inputs)): nothing to gather
    fitted = peg.PEG(n_members=2, grad_batch_size=8, eta=0.1, progress=False).fit(_net(), loader)
    assert len(fitted) == 2


# ---------------------------------------------------------------- prediction
@pytest.mark.parametrize("strategy", ["loop", "vmap", "auto"])
def test_ensemble_on_dict_batches_equals_tensors(ds, strategy):
    dicts, tensors = _pair([_net(0), _net(1), _net(2)])
    X, _ = ds.tensors()
    got = dicts.member_logits(DataLoader(ds, batch_size=16), strategy=strategy)
    want = tensors.member_logits(X, batch_size=16, strategy=strategy)
    assert got.shape == (3, N, C)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if strategy == "loop":  # the same batches, the same computation: the same bits
        assert torch.equal(got, tensors.member_logits(X, batch_size=16, strategy="loop"))
    # a mapping of tensors is sliced like a tensor, labels left out
    whole = {"input_ids": ds.ids, "attention_mask": ds.mask, "labels": ds.y}
    torch.testing.assert_close(dicts.member_logits(whole, 16, strategy), got)


def test_folded_refuses_mappings_and_auto_avoids_it(ds):
    dicts, _ = _pair([_net(0), _net(1)])
    with pytest.raises(peg.errors.NotFoldable, match="takes tensor inputs"):
        dicts.member_logits(DataLoader(ds, batch_size=16), strategy="folded")


def test_evaluate_and_temperature_on_dict_batches(ds):
    net = _net()
    X, y = ds.tensors()
    loader = DataLoader(ds, batch_size=16)
    got, want = peg.evaluate(net, loader), peg.evaluate(Packed(net), (X, y), batch_size=16)
    assert got.keys() == want.keys()
    for k in got:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-7)
    ts = peg.TemperatureScaling(batch_size=16).fit(net, loader)
    ref = peg.TemperatureScaling(batch_size=16).fit(Packed(net), (X, y))
    assert ts.temperature_ == pytest.approx(ref.temperature_, rel=1e-5)
    torch.testing.assert_close(ts.predict_proba(loader), ref.predict_proba(X), rtol=1e-5, atol=1e-6)
    label = DataLoader(Dicts("label"), batch_size=16)  # the other HuggingFace key
    assert peg.evaluate(net, label) == got


def test_mc_dropout_on_dict_batches(ds):
    X, _ = ds.tensors()
    net = _net()
    mc = peg.MCDropout(n_members=4, insert=0.3, seed=1).fit(net, DataLoader(ds, batch_size=16))
    ref = peg.MCDropout(n_members=4, insert=0.3, seed=1).fit(Packed(_net()), X)
    got = mc.member_logits(DataLoader(ds, batch_size=16))
    torch.testing.assert_close(got, ref.member_logits(X, batch_size=16), rtol=1e-5, atol=1e-6)
    assert got.shape == (4, N, C) and not torch.equal(got[0], got[1])


def test_tuple_batches_with_extra_items_and_batch_fn(ds):
    X, y = ds.tensors()
    ens = peg.Ensemble.from_models([Packed(_net(0)), Packed(_net(1))])
    triples = DataLoader(list(zip(X, y, torch.arange(N), strict=True)), batch_size=16)
    assert torch.equal(ens.member_logits(triples), ens.member_logits(X, 16))
    assert peg.evaluate(ens, triples) == peg.evaluate(ens, (X, y), batch_size=16)
    # an odd batch shape: {"batch": (x, y)} through batch_fn
    odd = DataLoader([{"batch": (X[i], y[i])} for i in range(N)], batch_size=16)

    def fn(b):
        return b["batch"][0], b["batch"][1]

    assert torch.equal(ens.member_logits(odd, batch_fn=fn), ens.member_logits(X, 16))
    assert peg.evaluate(ens, odd, batch_fn=fn) == peg.evaluate(ens, (X, y), batch_size=16)
    ts = peg.TemperatureScaling(batch_size=16, batch_fn=fn).fit(ens, odd)
    assert ts.temperature_ == peg.TemperatureScaling(batch_size=16).fit(ens, (X, y)).temperature_
    mc = peg.MCDropout(n_members=2, insert=0.2, batch_fn=fn).fit(Packed(_net()), odd)
    assert mc.member_logits(odd).shape == (2, N, C)
    with pytest.raises(TypeError, match="batch_fn: must return a pair"):
        ens.member_logits(odd, batch_fn=lambda b: b["batch"][0])


def test_clone_keeps_batch_fn():
    def fn(b):
        return b["x"], b["y"]

    for cls in (peg.TemperatureScaling, peg.MCDropout, peg.MCPatched, peg.PackedEnsemble):
        method = cls(batch_fn=fn)
        assert clone(method).batch_fn is fn and method.get_params()["batch_fn"] is fn


def test_inputs_follow_the_model(ds):
    """No GPU here: data on `meta` (no move can fix it) is refused naming the key."""
    meta = {"input_ids": ds.ids[:4].to("meta"), "attention_mask": ds.mask[:4]}
    with pytest.raises(ValueError, match=r"X\['input_ids'\]: on the meta device"):
        peg.Ensemble.from_models([_net()]).member_logits(meta)
    bad = {"input_ids": ds.ids[:4], "attention_mask": ds.mask[:3]}
    with pytest.raises(ValueError, match="disagree on the number of rows"):
        peg.Ensemble.from_models([_net(), _net(1)]).member_logits(bad)
    wrong = {"input_ids": ds.ids[:4], "mask": ds.mask[:4]}
    with pytest.raises(ValueError, match=r"model cannot run on inputs dict .*model\(\*\*inputs\)"):
        peg.Ensemble.from_models([_net()]).member_logits(wrong, strategy="loop")


def test_fitted_peg_predicts_mapping_batches():
    """PEG fits on tensors (its fit gathers); the fitted ensemble predicts `{"x", "labels"}`
    batches as `model(input=...)` (`nn.Sequential.forward(input)`), equal to the tensors."""
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(64, 2, generator=g), torch.randint(0, 2, (64,), generator=g)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    ens = peg.PEG(n_members=3, grad_batch_size=8, eta=0.1, progress=False).fit(net, (X, y))
    for key in ("labels", "label"):
        loader = DataLoader([{"input": X[i], key: y[i]} for i in range(64)], batch_size=16)
        for strategy in ("loop", "auto"):
            got = ens.member_logits(loader, strategy=strategy)
            torch.testing.assert_close(got, ens.member_logits(X, 16), rtol=1e-5, atol=1e-6)
        assert torch.equal(
            ens.member_logits(loader, strategy="loop"), ens.member_logits(X, 16, strategy="loop")
        )
