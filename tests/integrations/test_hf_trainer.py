"""`peg.integrations.transformers`: `compute_metrics` and `CalibrationCallback` in real
HuggingFace `Trainer` runs on a tiny BERT built from a config (no download, CPU, one step)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import peg

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # what Trainer runs on

from transformers import EvalPrediction, Trainer, TrainingArguments  # noqa: E402

from peg.integrations.transformers import (  # noqa: E402
    CalibrationCallback,
    ComputeMetrics,
    compute_metrics,
)
from tiny_hf import CLASSES, Items, bert  # noqa: E402


def _model() -> nn.Module:
    torch.manual_seed(0)
    return bert(vocab_size=50)


def _tokens(n: int, seed: int) -> Items:
    """Random token sequences labelled by the initial model's own prediction, a fifth of them
    changed at random: logits that say something, a temperature inside its bounds."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (n, 8), generator=g)
    with torch.no_grad():
        labels = _model().eval()(input_ids=ids).logits.argmax(1)
    flip = torch.rand(n, generator=g) < 0.2
    labels = torch.where(flip, torch.randint(0, CLASSES, (n,), generator=g), labels)
    return Items({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})


def _trainer(tmp_path, callbacks=(), **kw) -> Trainer:
    batch_eval = kw.pop("batch_eval_metrics", False)
    model = kw.pop("model", None) or _model()
    train, evaluation = kw.pop("data", None) or (_tokens(32, seed=0), _tokens(96, seed=1))
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=32,
        eval_strategy="steps",
        eval_steps=1,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        batch_eval_metrics=batch_eval,
        seed=0,
        learning_rate=1e-4,
    )
    return Trainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=evaluation,
        callbacks=list(callbacks),
        **kw,
    )


def _eval_logits(trainer: Trainer) -> tuple[torch.Tensor, torch.Tensor]:
    out = trainer.predict(trainer.eval_dataset)
    return torch.as_tensor(out.predictions), torch.as_tensor(out.label_ids)


def test_callback_fits_on_the_trainers_logits_and_the_metrics_are_logged(tmp_path):
    calibration = CalibrationCallback("TS", conformal=0.2)
    trainer = _trainer(tmp_path, [calibration], compute_metrics=calibration.compute_metrics)
    trainer.train()
    logged = next(h for h in trainer.state.log_history if "eval_calibrated_nll" in h)
    for key in ("eval_accuracy", "eval_nll", "eval_ece", "eval_brier", "eval_calibrated_ece"):
        assert key in logged  # through Trainer.log: every reporter got them

    logits, labels = _eval_logits(trainer)  # the model after its one step, as evaluated
    expected = peg.TemperatureScaling().fit(nn.Identity(), (logits, labels))
    assert calibration.calibrator_.temperature_ == pytest.approx(expected.temperature_, rel=1e-4)
    assert logged["eval_nll"] == pytest.approx(peg.metrics.nll(logits[None], labels), rel=1e-5)
    sets = peg.ConformalClassifier(alpha=0.2).fit(nn.Identity(), (logits, labels))
    assert calibration.conformal_.quantile_ == pytest.approx(sets.quantile_, rel=1e-4)

    # after training an evaluation applies the calibrator, never refits it on its data
    fitted = calibration.calibrator_
    test = _tokens(64, seed=2)
    metrics = trainer.evaluate(test, metric_key_prefix="test")
    assert calibration.calibrator_ is fitted
    test_logits = torch.as_tensor(trainer.predict(test).predictions)
    probs = fitted.predict_proba(test_logits)
    assert metrics["test_calibrated_nll"] == pytest.approx(
        peg.metrics.nll(probs, test.data["labels"]), rel=1e-5
    )


def test_callback_alone_reads_the_eval_loader_itself(tmp_path):
    calibration = CalibrationCallback(peg.TemperatureScaling(max_iter=50))
    trainer = _trainer(tmp_path, [calibration])  # no compute_metrics: the Trainer keeps no logits
    trainer.train()
    logits, labels = _eval_logits(trainer)
    expected = peg.TemperatureScaling().fit(nn.Identity(), (logits, labels))
    assert calibration.calibrator_.temperature_ == pytest.approx(expected.temperature_, rel=1e-4)
    logged = next(h for h in trainer.state.log_history if "eval_runtime" in h)
    assert logged["eval_calibrated_nll"] == calibration.metrics_["calibrated_nll"]
    metrics = trainer.evaluate()  # after training: applied, and in what evaluate returns
    assert metrics["eval_nll"] == pytest.approx(peg.metrics.nll(logits[None], labels), rel=1e-5)
    assert metrics["eval_calibrated_nll"] <= metrics["eval_nll"] + 1e-9


def test_compute_metrics_in_a_trainer_batch_by_batch_equals_at_once(tmp_path):
    whole = _trainer(tmp_path, compute_metrics=compute_metrics).evaluate()
    metrics = ComputeMetrics()  # one per Trainer, among its callbacks too
    batched = _trainer(
        tmp_path, [metrics], compute_metrics=metrics, batch_eval_metrics=True
    ).evaluate()
    for key in ("eval_accuracy", "eval_nll", "eval_ece", "eval_brier"):
        assert batched[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7)


def test_compute_metrics_of_tokens_leaves_out_the_ignored_labels():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 6, CLASSES)).astype(np.float32)
    labels = rng.integers(0, CLASSES, size=(4, 6))
    labels[:, 4:] = -100  # padding
    got = compute_metrics(EvalPrediction(predictions=(logits, logits[..., :1]), label_ids=labels))
    keep = labels.reshape(-1) != -100
    z, y = (
        torch.as_tensor(logits.reshape(-1, CLASSES)[keep]),
        torch.as_tensor(labels.reshape(-1)[keep]),
    )
    assert got["nll"] == pytest.approx(peg.metrics.nll(z[None], y))
    assert got["accuracy"] == pytest.approx(peg.metrics.accuracy(z[None], y))
    assert got["ece"] == pytest.approx(peg.metrics.ece(z[None], y))
    assert got["brier"] == pytest.approx(peg.metrics.brier(z[None], y))


@pytest.mark.parametrize(
    ("eval_pred", "match"),
    [
        (EvalPrediction(np.zeros(5, dtype=np.int64), np.zeros(5, dtype=np.int64)), "argmax"),
        (EvalPrediction(np.zeros((5, 3), np.float32), np.zeros(4, dtype=np.int64)), "labels"),
        (EvalPrediction(np.zeros((5, 3), np.float32), None), "label_ids"),
        (EvalPrediction(np.zeros((2, 3), np.float32), np.full(2, -100)), "no labelled rows"),
    ],
)
def test_bad_predictions_are_one_clear_error(eval_pred, match):
    with pytest.raises(ValueError, match=match):
        CalibrationCallback().compute_metrics(eval_pred)


def test_bad_arguments_are_refused_at_construction():
    with pytest.raises(peg.InvalidParameterError, match="calibrator"):
        CalibrationCallback("platt")
    with pytest.raises(peg.InvalidParameterError, match="extra_metrics"):
        CalibrationCallback(extra_metrics="accuracy")
    with pytest.raises(ValueError, match="bins"):
        ComputeMetrics(bins=0)


class _Stops(Items):
    """Items whose `stop`-th raises while `armed`: an evaluation that stops early, as an
    interrupt or a failing batch stops it."""

    def __init__(self, items: Items, stop: int) -> None:
        super().__init__(items.data)
        self.stop, self.armed = stop, True

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.armed and i == self.stop:
            raise RuntimeError("stopped")
        return super().__getitem__(i)


def _stopped_then_whole(trainer: Trainer) -> dict[str, float]:
    """An evaluation stopped in its third batch (two held), then a whole one."""
    data = _Stops(trainer.eval_dataset, stop=70)
    with pytest.raises(RuntimeError, match="stopped"):
        trainer.evaluate(data)
    data.armed = False
    return trainer.evaluate(data)


def test_batch_metrics_of_a_stopped_evaluation_never_reach_the_next(tmp_path):
    """The batches of an evaluation that stopped early were added to the next one's."""
    whole = _trainer(tmp_path, compute_metrics=compute_metrics).evaluate()
    metrics = ComputeMetrics()
    trainer = _trainer(tmp_path, [metrics], compute_metrics=metrics, batch_eval_metrics=True)
    got = _stopped_then_whole(trainer)
    for key in ("eval_accuracy", "eval_nll", "eval_ece", "eval_brier"):
        assert got[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7)


def test_the_callback_never_fits_on_a_stopped_evaluations_batches(tmp_path):
    """A calibrator fitted on a stopped evaluation's batches and the next one's (NLL 4.59
    against 1.88): fitted on the whole evaluation's alone."""
    calibration = CalibrationCallback("TS")
    trainer = _trainer(
        tmp_path, [calibration], compute_metrics=calibration.compute_metrics,
        batch_eval_metrics=True,
    )  # fmt: skip
    got = _stopped_then_whole(trainer)
    logits, labels = _eval_logits(trainer)
    expected = peg.TemperatureScaling().fit(nn.Identity(), (logits, labels))
    assert calibration.calibrator_.temperature_ == pytest.approx(expected.temperature_, rel=1e-4)
    assert got["eval_nll"] == pytest.approx(peg.metrics.nll(logits[None], labels), rel=1e-5)


def test_the_shared_compute_metrics_holds_nothing():
    """The module-level instance was shared by every Trainer of the process: a function now,
    which measures a whole evaluation and refuses the batch-by-batch calls it cannot hold."""
    z = np.random.default_rng(0).normal(size=(8, CLASSES)).astype(np.float32)
    y = np.arange(8) % CLASSES
    with pytest.raises(ValueError, match=r"ComputeMetrics\(\)"):
        compute_metrics(EvalPrediction(z, y), compute_result=False)
    assert compute_metrics(EvalPrediction(z, y)) == ComputeMetrics()(EvalPrediction(z, y))
    assert not hasattr(compute_metrics, "__dict__") or not vars(compute_metrics)


def test_batch_metrics_outside_the_callbacks_say_what_is_at_risk():
    metrics = ComputeMetrics()
    z = np.zeros((4, CLASSES), np.float32)
    with pytest.warns(UserWarning, match="callbacks="):
        metrics(EvalPrediction(z, np.zeros(4, dtype=np.int64)), compute_result=False)


def test_the_callback_warns_when_it_fits_on_few_rows():
    calibration = CalibrationCallback("TS")
    z = np.random.default_rng(0).normal(size=(3, CLASSES)).astype(np.float32)
    with pytest.warns(UserWarning, match="fitted on 3 labelled rows, fewer than 50"):
        calibration.compute_metrics(EvalPrediction(z, np.arange(3)))


def _multi_hot(n: int, seed: int) -> Items:
    """Multi-hot labels [N, 3] (floats, as transformers' multi-label loss takes them) drawn
    from the initial model's own sigmoids at T = 2."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (n, 8), generator=g)
    with torch.no_grad():
        logits = _multi_label().eval()(input_ids=ids).logits
    labels = torch.bernoulli(torch.sigmoid(logits / 2), generator=g)
    return Items({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})


def _multi_label() -> nn.Module:
    torch.manual_seed(0)
    return bert(vocab_size=50, problem_type="multi_label_classification", initializer_range=0.5)


@pytest.mark.parametrize("through", ["compute_metrics", "on_evaluate"])
def test_a_multi_label_model_is_calibrated_as_multilabel(tmp_path, through):
    calibration = CalibrationCallback("TS")
    kw = {"compute_metrics": calibration.compute_metrics} if through == "compute_metrics" else {}
    data = (_multi_hot(16, 0), _multi_hot(64, 1))
    trainer = _trainer(tmp_path, [calibration], model=_multi_label(), data=data, **kw)
    metrics = trainer.evaluate()
    fitted = calibration.calibrator_
    assert fitted.kind_.kind == "multilabel"
    logits, labels = _eval_logits(trainer)
    expected = peg.TemperatureScaling().fit(logits, labels.long())
    assert expected.kind_.kind == "multilabel"
    assert fitted.temperature_ == pytest.approx(expected.temperature_, rel=1e-6)
    assert metrics["eval_calibrated_nll"] <= metrics["eval_nll"] + 1e-9
    own = peg.evaluate(logits, labels.long())
    assert metrics["eval_nll"] == pytest.approx(own["nll"], rel=1e-5)
