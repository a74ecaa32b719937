"""`peg.integrations.transformers.NextToken`: a causal LM's next-token logits aligned with their
labels, on a tiny GPT-2 built from a config (random weights, nothing fetched)."""

from __future__ import annotations

import pytest
import torch

import peg

transformers = pytest.importorskip("transformers")

from peg.integrations.transformers import NextToken  # noqa: E402
from peg.methods.calibration._streamed import streamed_sums  # noqa: E402
from peg.methods.calibration.temperature import fit_temperature  # noqa: E402
from tiny_hf import Items  # noqa: E402

VOCAB = 40


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=16,
        n_embd=16,
        n_layer=1,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=0.5,  # logits of some spread: a temperature inside its bounds
    )
    return transformers.GPT2LMHeadModel(config).eval()


def _data(n: int = 12, length: int = 10, seed: int = 0) -> dict[str, torch.Tensor]:
    """Token ids, a prompt of 3 tokens not scored (-100), the last rows padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (n, length), generator=g)
    mask = torch.ones_like(ids)
    mask[-3:, -4:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :3] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _loss(model, data) -> float:
    with torch.no_grad():
        return float(model(**data).loss)


def test_the_streamed_nll_is_the_models_own_loss():
    model, data = _gpt2(), _data()
    sums = streamed_sums(NextToken(model).batches(data, batch_size=5), 1.0)
    assert sums["nll"] / sums["n"] == pytest.approx(_loss(model, data), abs=1e-5)
    assert sums["n"] == int((data["labels"][:, 1:] != -100).sum())


def test_without_labels_the_input_ids_are_the_labels_padding_left_out():
    model, data = _gpt2(), _data(seed=1)
    inputs = {k: v for k, v in data.items() if k != "labels"}
    hf = inputs | {"labels": inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)}
    sums = streamed_sums(NextToken(model).batches(Items(inputs), batch_size=4), 1.0)
    assert sums["nll"] / sums["n"] == pytest.approx(_loss(model, hf), abs=1e-5)


def test_a_loader_is_read_with_the_shifted_labels_recorded():
    model, data = _gpt2(), _data()
    lm = NextToken(model)
    tapped = peg.source.Tapped(torch.utils.data.DataLoader(Items(data), batch_size=5))
    logits = lm.member_logits(tapped)
    assert logits.shape == (1, 12, VOCAB, 9)  # [M, B, V, T - 1]
    assert torch.equal(tapped.labels(), data["labels"][:, 1:])
    with torch.no_grad():
        own = model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits
    torch.testing.assert_close(logits[0], own[:, :-1].movedim(-1, 1))
    assert not model.training


def test_evaluate_gives_the_models_own_loss():
    model, data = _gpt2(), _data()
    loader = torch.utils.data.DataLoader(Items(data), batch_size=5)
    assert peg.evaluate(NextToken(model), loader)["nll"] == pytest.approx(
        _loss(model, data), abs=1e-5
    )


def test_the_streamed_temperature_is_the_gathered_fits():
    model, data = _gpt2(), _data()
    lm = NextToken(model)
    t = lm.fit_temperature(data, batch_size=5)
    rows = [(z[y != -100], y[y != -100]) for z, y in lm.pairs(data, batch_size=5)]
    exact = fit_temperature(torch.cat([z for z, _ in rows]), torch.cat([y for _, y in rows]))
    assert t == pytest.approx(exact, rel=1e-9)
    assert t != pytest.approx(1.0, abs=0.05)


def test_a_batch_without_labels_or_input_ids_is_refused():
    lm = NextToken(_gpt2())
    with pytest.raises(ValueError, match="needs input_ids"):
        lm.aligned({"inputs_embeds": torch.zeros(2, 5, 16)})
    with pytest.raises(TypeError, match="model: expected a causal LM"):
        NextToken("gpt2")
