"""A real transformers model end to end, offline, on dict-batch loaders.

The model: `BertForSequenceClassification` built from a small `BertConfig` (2 layers, width 32,
19k parameters; no weights from a hub), trained for a few epochs in this file. The task, made
here without a network: sequences of 6 to 12 tokens over a vocabulary of 13 (token 1 is [CLS],
0 pads), labelled 1 when token 5 occurs more often than token 6. Batches follow HuggingFace's
convention, `{"input_ids", "attention_mask", "labels"}`, and the model returns a `ModelOutput`:
peg needs neither a `with_output` nor a `batch_fn`. PEG and PEP fit on the dict-batch loader
itself.
"""

from __future__ import annotations

import pytest
import torch
import transformers  # peg[hf], installed by scripts/setup.sh: CI runs these tests, never skips
from torch.utils.data import DataLoader

import peg
import tiny_hf  # sets HF_HUB_OFFLINE: nothing may be fetched
from tiny_hf import Items

LENGTH, VOCAB = 12, 16


def sequences(n: int, seed: int) -> dict[str, torch.Tensor]:
    """The token-count task: `input_ids`, `attention_mask` `[n, 12]` and `labels` `[n]`."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (n, LENGTH), generator=g)
    lengths = torch.randint(6, LENGTH + 1, (n,), generator=g)
    mask = (torch.arange(LENGTH)[None] < lengths[:, None]).long()
    ids = ids * mask
    ids[:, 0] = 1
    fives, sixes = ((ids == 5) & mask.bool()).sum(1), ((ids == 6) & mask.bool()).sum(1)
    return {"input_ids": ids, "attention_mask": mask, "labels": (fives > sixes).long()}


def bert(seed: int) -> torch.nn.Module:
    """A larger BERT than `tiny_hf`'s: two layers of width 32, two classes."""
    torch.manual_seed(seed)
    return tiny_hf.bert(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        max_position_embeddings=LENGTH + 4,
        num_labels=2,
    )


def trained(seed: int) -> torch.nn.Module:
    """A few epochs of Adam on 600 sequences (a second or two on a CPU)."""
    model = bert(seed)
    data = sequences(600, 0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for epoch in range(6):
        order = torch.randperm(600, generator=torch.Generator().manual_seed(seed * 100 + epoch))
        for start in range(0, 600, 32):
            rows = order[start : start + 32]
            loss = model(**{k: v[rows] for k, v in data.items()}).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return trained(0)


@pytest.fixture(scope="module")
def loaders() -> dict[str, DataLoader]:
    return {
        "val": DataLoader(Items(sequences(300, 1)), batch_size=64),
        "test": DataLoader(Items(sequences(200, 2)), batch_size=50),
    }


def test_the_model_learned_the_task(model, loaders):
    metrics = peg.evaluate(model, loaders["test"])
    assert metrics["error"] < 0.2  # chance is ~0.3 (70% of the labels are 0)


def test_an_ensemble_of_two_berts_predicts_dict_batches(model, loaders, tmp_path):
    ens = peg.Ensemble.from_models([model, trained(1)])
    logits = ens.member_logits(loaders["test"])
    assert logits.shape == (2, 200, 2)
    with torch.no_grad():
        first = model(**{k: v for k, v in sequences(200, 2).items() if k != "labels"}).logits
    torch.testing.assert_close(logits[0], first, rtol=1e-4, atol=1e-5)
    path = ens.save(tmp_path / "two-berts")
    again = peg.load(path, bert(5))
    assert torch.equal(again.member_logits(loaders["test"]), logits)


def test_temperature_scaling_on_a_bert(model, loaders, tmp_path):
    ts = peg.TemperatureScaling().fit(model, loaders["val"])
    assert 0 < ts.temperature_ < 10
    calibrated = peg.evaluate(ts, loaders["test"])
    assert calibrated["error"] == peg.evaluate(model, loaders["test"])["error"]  # T keeps argmax
    loaded = peg.load(ts.save(tmp_path / "ts"), bert(5))
    assert torch.equal(loaded.member_logits(loaders["test"]), ts.member_logits(loaders["test"]))


def test_mc_dropout_on_a_bert(model, loaders):
    mc = peg.MCDropout(n_members=4, seed=0).fit(model, loaders["val"])
    logits = mc.member_logits(loaders["test"])
    assert logits.shape == (4, 200, 2)
    assert not torch.equal(logits[0], logits[1])  # dropout on: the passes differ
    again = peg.MCDropout(n_members=4, seed=0).fit(model).member_logits(loaders["test"])
    assert torch.equal(logits, again)  # masks from (seed, member, batch)
    assert peg.evaluate(mc, loaders["test"])["nll"] > 0


def test_last_layer_peg_on_a_bert_runs_the_encoder_once_per_batch(model, loaders, monkeypatch):
    data = sequences(300, 1)  # the tokens alone as a tensor: BERT's first argument is input_ids
    p = peg.PEG(n_members=15, params="last_layer", eta=0.1, grad_batch_size=32, progress=False)
    p.fit(model, (data["input_ids"], data["labels"]))
    assert p.param_names_ == ["classifier.weight", "classifier.bias"]
    p.member_logits(loaders["test"])  # the trunk/head split is found and checked here, once
    calls = []
    encoder = transformers.models.bert.modeling_bert.BertModel.forward

    def counted(self, *args, **kwargs):
        calls.append(1)
        return encoder(self, *args, **kwargs)

    monkeypatch.setattr(transformers.models.bert.modeling_bert.BertModel, "forward", counted)
    logits = p.member_logits(loaders["test"])  # 4 batches of 50, dict inputs
    assert len(calls) == 4  # the encoder once per batch, not once per member and batch
    monkeypatch.undo()
    inputs = {k: v for k, v in sequences(200, 2).items() if k != "labels"}
    with torch.no_grad():
        members = [p.ensemble().member_model(i)(**inputs).logits for i in range(15)]
    torch.testing.assert_close(logits, torch.stack(members), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", ["PEG", "PEP"])
def test_peg_and_pep_fit_on_dict_batches_and_save_both_ways(model, loaders, method, tmp_path):
    """Fitted on the dict-batch loader itself (mini-batches drawn by index from its dataset,
    collated as the loader collates), then saved as a recipe and materialised."""
    options = {"grad_batch_size": 32, "eta": 0.05} if method == "PEG" else {"sigma": 0.01}
    fitted = getattr(peg, method)(n_members=3, seed=0, progress=False, **options)
    fitted.fit(model, loaders["val"])
    logits = fitted.member_logits(loaders["test"])
    assert logits.shape == (3, 200, 2) and not torch.equal(logits[0], logits[1])
    recipe = peg.load(fitted.save(str(tmp_path / "recipe")), bert(5), val=loaders["val"])
    torch.testing.assert_close(recipe.member_logits(loaders["test"]), logits)
    members = peg.load(fitted.save(str(tmp_path / "members"), materialize=True), bert(5))
    assert torch.equal(members.member_logits(loaders["test"]), logits)
    assert peg.evaluate(fitted, loaders["test"])["nll"] > 0
