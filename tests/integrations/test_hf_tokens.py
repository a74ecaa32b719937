"""Token outputs in real HuggingFace `Trainer` runs: a causal LM (`next_token=True`) and token
classification, on tiny models built from configs (no download, CPU). Temperature scaling is
fitted streamed over the batches spilled to disk, never on `[N, V]` joined in memory."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # what Trainer runs on

from transformers import Trainer, TrainingArguments  # noqa: E402

from peg.integrations import _common  # noqa: E402
from peg.integrations.transformers import (  # noqa: E402
    CalibrationCallback,
    ComputeMetrics,
    NextToken,
)
from peg.methods.calibration.temperature import fit_temperature  # noqa: E402
from tiny_hf import Items  # noqa: E402

VOCAB = 40


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
        eos_token_id=0, initializer_range=0.5,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _texts(n: int, seed: int) -> Items:
    """Sequences sampled from the initial model at temperature 0.7 (so T ≈ 0.7 calibrates
    it), labels = input_ids (HF's causal LM convention), the last 2 tokens not scored."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (n, 1), generator=g)
    model = _gpt2().eval()
    with torch.no_grad():
        for _ in range(9):
            probs = (model(input_ids=ids).logits[:, -1] / 0.7).softmax(-1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=g)], 1)
    labels = ids.clone()
    labels[:, -2:] = -100
    return Items({"input_ids": ids, "labels": labels})


def _own_loss(model, items: Items) -> float:
    """The model's own mean loss over every scored token (HF shifts inside the model).
    Not the Trainer's eval_loss: it divides each batch's sum by `num_items_in_batch`, which
    counts the labels before the shift (a row's first token too), 8 a row here for 7 scored."""
    with torch.no_grad():
        return float(model.eval()(**items.data).loss)


def _bert_tokens() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, num_labels=5, initializer_range=0.5,
    )  # fmt: skip
    return transformers.BertForTokenClassification(config)


def _tagged(n: int, seed: int) -> Items:
    """Tags of the initial model's own prediction, a quarter changed at random: logits that
    say something, a temperature inside its bounds."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 30, (n, 8), generator=g)
    with torch.no_grad():
        labels = _bert_tokens().eval()(input_ids=ids).logits.argmax(-1)
    flip = torch.rand(labels.shape, generator=g) < 0.25
    labels = torch.where(flip, torch.randint(0, 5, labels.shape, generator=g), labels)
    labels[:, 0] = -100  # [CLS]
    return Items({"input_ids": ids, "labels": labels})


def _trainer(tmp_path, model, train, evaluation, callbacks=(), **kw) -> Trainer:
    batch_eval = kw.pop("batch_eval_metrics", False)
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=8,
        per_device_eval_batch_size=8, eval_strategy="steps", eval_steps=1, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0, batch_eval_metrics=batch_eval, seed=0, learning_rate=1e-4,
    )  # fmt: skip
    return Trainer(
        model=model, args=args, train_dataset=train, eval_dataset=evaluation,
        callbacks=list(callbacks), **kw,
    )  # fmt: skip


@pytest.fixture
def never_gathered(monkeypatch):
    """Joining an evaluation's rows in memory fails the test."""

    def refuse(self):
        raise AssertionError("the token rows were gathered into [N, V]")

    monkeypatch.setattr(_common.Gathered, "result", refuse)


@pytest.mark.parametrize("batch_eval", [False, True])
def test_a_causal_lms_temperature_is_fitted_streamed_on_the_shifted_tokens(
    tmp_path, never_gathered, batch_eval
):
    calibration = CalibrationCallback("TS", next_token=True)
    kw = {"compute_metrics": calibration.compute_metrics} if batch_eval else {}
    trainer = _trainer(
        tmp_path, _gpt2(), _texts(16, 0), _texts(40, 1), [calibration],
        batch_eval_metrics=batch_eval, **kw,
    )  # fmt: skip
    trainer.train()
    metrics = trainer.evaluate()  # after training: the fitted T applied
    # the next-token NLL is the model's own loss: the shift and the -100 labels as HF's
    assert metrics["eval_nll"] == pytest.approx(_own_loss(trainer.model, _texts(40, 1)), abs=1e-5)
    assert metrics["eval_calibrated_nll"] <= metrics["eval_nll"] + 1e-9
    # the T fitted at the last training evaluation is that of the model's streamed fit
    expected = NextToken(trainer.model).fit_temperature(trainer.eval_dataset, batch_size=8)
    assert calibration.calibrator_.temperature_ == pytest.approx(expected, rel=1e-6)
    assert calibration.calibrator_.temperature_ != pytest.approx(1.0, abs=0.02)


def test_compute_metrics_of_a_causal_lm_is_its_loss(tmp_path):
    metrics = ComputeMetrics(next_token=True)
    trainer = _trainer(
        tmp_path, _gpt2(), _texts(16, 0), _texts(24, 1), [metrics],
        compute_metrics=metrics, batch_eval_metrics=True,
    )  # fmt: skip
    out = trainer.evaluate()
    own = _own_loss(trainer.model, _texts(24, 1))
    assert out["eval_nll"] == pytest.approx(own, abs=1e-5)
    unshifted = _trainer(
        tmp_path, _gpt2(), _texts(16, 0), _texts(24, 1), compute_metrics=ComputeMetrics()
    ).evaluate()
    assert abs(unshifted["eval_nll"] - own) > 1e-2  # unshifted: another number


def test_token_classification_is_fitted_streamed(tmp_path, never_gathered):
    calibration = CalibrationCallback("TS")
    trainer = _trainer(tmp_path, _bert_tokens(), _tagged(16, 0), _tagged(40, 1), [calibration])
    trainer.train()
    model = trainer.model.eval()
    data = trainer.eval_dataset.data
    with torch.no_grad():
        logits = model(input_ids=data["input_ids"]).logits
    keep = data["labels"] != -100
    expected = fit_temperature(logits[keep], data["labels"][keep])
    assert calibration.calibrator_.temperature_ == pytest.approx(expected, rel=1e-5)
    assert 1e-2 < expected < 1e2
    assert calibration.metrics_["nll"] == pytest.approx(
        float(torch.nn.functional.cross_entropy(logits[keep], data["labels"][keep])), rel=1e-5
    )
    # fitted through the calibrator's public fit, on token outputs: its predictions take them
    fitted = calibration.calibrator_
    assert fitted.kind_.kind == "dense" and fitted.kind_.class_dim == -1
    probs = fitted.predict_proba(logits[:3])
    torch.testing.assert_close(
        probs, (logits[:3].double() / fitted.temperature_).softmax(-1).float()
    )


def test_next_token_needs_token_outputs():
    with pytest.raises(ValueError, match="next_token=True expects a causal LM's logits"):
        _common.rows(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long), "x", next_token=True)
