"""peg in HuggingFace's `Trainer`: `compute_metrics` and `CalibrationCallback`.

    from peg.integrations.transformers import CalibrationCallback, compute_metrics

    Trainer(model, args, ..., compute_metrics=compute_metrics)   # eval_nll, eval_ece, ...

    metrics = ComputeMetrics()                 # batch_eval_metrics=True: one per Trainer
    Trainer(model, args, ..., compute_metrics=metrics, callbacks=[metrics])

    calibration = CalibrationCallback("TS")
    trainer = Trainer(model, args, ..., compute_metrics=calibration.compute_metrics,
                      callbacks=[calibration])
    trainer.train()                            # eval_calibrated_nll, ... logged at every eval
    calibration.calibrator_.predict_proba(logits)

The metrics of an `EvalPrediction`: its `predictions` are the logits (the first element where
the model returns a tuple), `[N, C]`, or `[N, T, C]` with `label_ids` `[N, T]` (token
classification: every token a row); rows labelled -100 (the ignore index of transformers'
losses, which the Trainer also pads with) are left out. `preprocess_logits_for_metrics` may
shrink the logits but must leave logits: an argmax leaves nothing to measure.

With `TrainingArguments(batch_eval_metrics=True)` the Trainer calls `compute_metrics` batch by
batch, so what is called holds the batches of the evaluation running: `ComputeMetrics` and
`CalibrationCallback` are also callbacks, and drop what an evaluation that stopped early (an
exception, an interrupt) left when the next one starts (`on_prediction_step` with another
evaluation dataloader, a training step, the start of training), so it is never added to the
next evaluation's batches. The module-level `compute_metrics` holds nothing: it measures a whole
evaluation at once, and refuses the batch-by-batch calls.

A causal LM: `NextToken(model)` aligns its next-token logits with their labels (`logits[:, :-1]`
against `labels[:, 1:]`, -100 left out), so `peg.evaluate(NextToken(model), loader)["nll"]` is
the model's own loss, and `NextToken(model).fit_temperature(loader)` fits T streamed, batch by
batch, never holding `[N, V]` (`peg.integrations._next_token`).

Needs `transformers` (`pip install "peg[hf]"`); imported only by this module, never by
`import peg`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from torch import Tensor

from peg.integrations._common import (
    DEFAULT_CALIBRATOR,
    KEYS,
    Calibration,
    Collected,
    Gathered,
    Spilled,
    applied,
    check_calibrator,
    check_conformal,
    fit_calibration,
    gather,
    named,
    rows,
    streamed_calibration,
    task_of,
)
from peg.integrations._next_token import NextToken
from peg.methods import _constraints as checks
from peg.methods.base import Params, store_arguments
from peg.methods.calibration._calibrator import Calibrator
from peg.methods.conformal.classifier import ConformalClassifier
from peg.metrics.streaming import StreamingMetrics
from peg.source._devices import weights_device
from peg.source.batches import BatchFn
from peg.utils.scalars import check_positive_int

try:
    from transformers import TrainerCallback
except ImportError:
    raise ImportError(
        "peg.integrations.transformers needs transformers: pip install 'peg[hf]'"
    ) from None

__all__ = ["CalibrationCallback", "ComputeMetrics", "NextToken", "compute_metrics"]


def _logits_and_labels(eval_pred: Any) -> tuple[Any, Any]:
    """`(predictions, label_ids)` of an `EvalPrediction` (or a pair), the logits picked."""
    if hasattr(eval_pred, "predictions"):
        logits, labels = eval_pred.predictions, eval_pred.label_ids
    elif isinstance(eval_pred, (tuple, list)) and len(eval_pred) >= 2:
        logits, labels = eval_pred[0], eval_pred[1]
    else:
        raise TypeError(
            "eval_pred: expected a transformers EvalPrediction or a pair (logits, labels), "
            f"got {type(eval_pred).__name__}"
        )
    if isinstance(logits, (tuple, list)):  # (logits, hidden_states, ...): the model's first
        logits = logits[0]
    if labels is None or isinstance(labels, (tuple, list)):
        got = "None" if labels is None else f"a tuple of {len(labels)}"
        raise ValueError(
            f"eval_pred.label_ids: expected one array of labels, got {got}; the eval dataset "
            "needs its labels (TrainingArguments.label_names naming one field)"
        )
    return logits, labels


class _PerEvaluation(TrainerCallback):
    """What a `compute_metrics` called batch by batch (`batch_eval_metrics=True`) holds between
    its calls, dropped when a new evaluation starts: each evaluation builds its dataloader and
    hands it to every callback event, so an `on_prediction_step` with another dataloader than
    the one of the batches held is a new evaluation; a training step or the start of training
    is between evaluations. Without these events (not in `callbacks`), an evaluation that
    stopped early cannot be told from the next one: said once, at the first batch."""

    def _drop(self) -> None:
        """Forget the batches held (subclasses: their own state too)."""
        raise NotImplementedError

    def _new_evaluation(self) -> None:
        self._drop()
        self._loader: Any = None

    def _batch(self) -> None:
        """A batch of `batch_eval_metrics` arrives: without the events, say what is at risk."""
        if getattr(self, "_loader", None) is None and not getattr(self, "_warned", False):
            self._warned = True
            warnings.warn(
                f"{type(self).__name__}: called batch by batch (batch_eval_metrics=True) but "
                "not among the Trainer's callbacks: pass it to callbacks=[...] too, or the "
                "batches of an evaluation that stops early are added to the next one's",
                stacklevel=3,
            )

    def _finished(self) -> None:
        """The last batch of an evaluation was measured: nothing is held any more."""
        self._drop()
        self._loader = None

    def on_prediction_step(
        self, args: Any, state: Any, control: Any, eval_dataloader: Any = None, **kwargs: Any
    ) -> None:
        if eval_dataloader is not getattr(self, "_loader", None):
            self._drop()  # another evaluation's first step: the last one stopped early
        self._loader = eval_dataloader if eval_dataloader is not None else self

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._new_evaluation()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._new_evaluation()  # no evaluation spans a training step


class ComputeMetrics(_PerEvaluation):
    """`compute_metrics` for `transformers.Trainer`: accuracy, nll, ece, brier of the logits.

    Args:
        bins: the ECE's equal-width bins (`peg.metrics.ece`).
        next_token: a causal LM's evaluation: logits `[N, T, V]` and labels `[N, T]` (the
            input ids), position t's logits read against the label of t + 1.

    Called with an `EvalPrediction`, returns `{"accuracy", "nll", "ece", "brier"}` (the Trainer
    logs them as `eval_accuracy`, ...). With `TrainingArguments(batch_eval_metrics=True)` the
    Trainer calls it batch by batch: the sums are accumulated
    (`peg.metrics.streaming.StreamingMetrics`, the same values) and the metrics returned at the
    last batch, `compute_result=True`. Then make one per Trainer and pass it to `callbacks` too
    (`Trainer(compute_metrics=m, callbacks=[m])`): an evaluation that stopped early leaves its
    sums, and the callback events drop them when the next evaluation starts.
    """

    def __init__(self, bins: int = 15, next_token: bool = False) -> None:
        self.bins = check_positive_int(bins, "bins")
        self.next_token = bool(next_token)
        self._stream: StreamingMetrics | None = None
        self._loader = None

    def _drop(self) -> None:
        self._stream = None

    def __call__(self, eval_pred: Any, compute_result: bool | None = None) -> dict[str, float]:
        if compute_result is None:  # the whole evaluation at once: nothing held
            self._drop()
            return _metrics(eval_pred, self.bins, self.next_token)
        self._batch()
        try:
            logits, labels = _logits_and_labels(eval_pred)
            z, y = rows(logits, labels, "eval_pred.predictions", self.next_token)
            if self._stream is None:
                self._stream = StreamingMetrics(bins=self.bins, metrics=KEYS)
            if len(y):
                self._stream.update(z.unsqueeze(0), y)
        except BaseException:
            self._drop()  # this evaluation stops here: nothing of it is left to the next
            raise
        if not compute_result:  # a batch of batch_eval_metrics: more to come
            return {}
        stream = self._stream
        self._finished()
        return named(stream.compute())

    def __repr__(self) -> str:
        return f"ComputeMetrics(bins={self.bins}, next_token={self.next_token})"


def _metrics(eval_pred: Any, bins: int, next_token: bool = False) -> dict[str, float]:
    """accuracy, nll, ece, brier of a whole evaluation's `EvalPrediction`."""
    logits, labels = _logits_and_labels(eval_pred)
    z, y = rows(logits, labels, "eval_pred.predictions", next_token)
    stream = StreamingMetrics(bins=bins, metrics=KEYS)
    if len(y):
        stream.update(z.unsqueeze(0), y)
    return named(stream.compute())


def compute_metrics(eval_pred: Any, compute_result: bool | None = None) -> dict[str, float]:
    """`Trainer(compute_metrics=compute_metrics)`: accuracy, nll, ece, brier of a whole
    evaluation (`ComputeMetrics()`'s, 15 bins). It holds nothing, so every Trainer of the
    process may share it; batch by batch (`batch_eval_metrics=True`) needs the sums of one
    evaluation held between calls: refused, pointing to a `ComputeMetrics()` of its own."""
    if compute_result is not None:
        raise ValueError(
            "compute_metrics: called batch by batch (TrainingArguments(batch_eval_metrics="
            "True)), which needs an evaluation's sums held between calls; the module-level "
            "compute_metrics holds nothing (every Trainer of the process shares it). Make one "
            "per Trainer: metrics = ComputeMetrics(); Trainer(..., compute_metrics=metrics, "
            "callbacks=[metrics])"
        )
    return _metrics(eval_pred, 15)


class CalibrationCallback(Params, _PerEvaluation):
    """Fit a calibrator (and a conformal predictor) on the logits of the Trainer's evaluations.

    Args:
        calibrator: "TS" or another calibrator's archive name ("vector-scaling", "isotonic",
            ...), or a peg calibrator instance whose arguments are used (a fresh copy is fitted).
        conformal: None, a miscoverage level α, or a `peg.ConformalClassifier` to copy; fitted
            on the model's own probabilities (the guarantee stays exact).
        bins: the ECE's bins.
        batch_fn: for the callback's own pass (below), batches that are neither a mapping with
            "labels" nor `(x, y, ...)` (`peg.source.batches`).
        extra_metrics: a function of the `EvalPrediction` whose metrics are merged into those
            `callback.compute_metrics` returns (your own `compute_metrics`).
        next_token: a causal LM: logits `[N, T, V]` read against the labels shifted by one
            (`logits[:, :-1]` against `labels[:, 1:]`, the labels being the input ids).

    A model whose config says `problem_type="multi_label_classification"` (logits `[N, K]`,
    multi-hot labels `[N, K]`) is calibrated as multi-label (`task="multilabel"`: one map over
    every label entry; the metrics over them too, `peg.metrics.kinds`).

    Token outputs (`[N, T, V]`: token classification, a causal LM) calibrated by temperature
    scaling without `conformal` are never joined into `[N, V]`: each batch's labelled rows go to
    a temporary folder as they come, and T is fitted streamed over them
    (`fit_temperature_streamed`, a pass over the files per Newton step), as are the metrics.

    Which evaluations fit: every one during `trainer.train()`, and the first one if none has
    fitted yet; the others (`trainer.evaluate(test_set)` after training, `trainer.predict`)
    apply the calibrator fitted last, never refit on them. Two ways to the logits:

    - `Trainer(compute_metrics=callback.compute_metrics, callbacks=[callback])`: the logits the
      Trainer gathers; the metrics of the model (`accuracy`, `nll`, `ece`, `brier`) and after
      the calibrator (`calibrated_nll`, ...) are returned to the Trainer, which logs them to
      every reporter (`eval_calibrated_nll`). Under several processes, the only way.
    - `callbacks=[callback]` alone: `on_evaluate` reads the evaluation dataloader once more
      with the model, gathering the logits on the CPU batch by batch (the Trainer, without a
      `compute_metrics`, keeps no logits); the metrics are added to those `trainer.evaluate()`
      returns and to `trainer.state.log_history`, not sent to the reporters: the Trainer logs
      before `on_evaluate` runs.

    After an evaluation: `calibrator_` (fitted on `nn.Identity()`: it applies to logits),
    `conformal_` (or None), `metrics_` (the model's and the calibrated metrics). With
    `batch_eval_metrics=True` the batches of an evaluation are held until its last; an
    evaluation that stopped early leaves them, dropped when the next one starts (the callback
    events), never fitted on with the next one's.
    """

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "calibrator": checks.described(check_calibrator, "a calibrator's name or instance"),
        "conformal": checks.described(check_conformal, "None, α in (0, 1) or a conformal"),
        "bins": checks.positive_int(),
        "batch_fn": checks.batch_fn,
        "extra_metrics": checks.optional_callable("a function of an EvalPrediction"),
        "next_token": checks.boolean(),
    }

    def __init__(
        self,
        calibrator: str | Calibrator = DEFAULT_CALIBRATOR,
        *,
        conformal: float | ConformalClassifier | None = None,
        bins: int = 15,
        batch_fn: BatchFn | None = None,
        extra_metrics: Callable[[Any], Mapping[str, float]] | None = None,
        next_token: bool = False,
    ) -> None:
        store_arguments(self, locals())
        self.calibrator_: Calibrator | None = None
        self.conformal_: ConformalClassifier | None = None
        self.metrics_: dict[str, float] = {}
        self._training = False
        self._gathered: Collected | None = None  # batch_eval_metrics: the batches so far
        self._answered = False  # compute_metrics ran in this evaluation
        self._loader = None
        self._task = "auto"  # the model's: "multilabel" for multi_label_classification

    def _drop(self) -> None:
        if self._gathered is not None:
            self._gathered.close()
        self._gathered = None
        self._answered = False

    # ---------------------------------------------------------------- the Trainer's logits
    def compute_metrics(
        self, eval_pred: Any, compute_result: bool | None = None
    ) -> dict[str, float]:
        """`Trainer(compute_metrics=...)`: the model's metrics and the calibrated ones."""
        if compute_result is None:  # the whole evaluation in one call: nothing of another
            self._drop()
        else:
            self._batch()
        try:
            logits, labels = _logits_and_labels(eval_pred)
            if self._gathered is None:
                self._gathered = self._store("eval_pred.predictions")
            self._gathered.add(logits, labels)
            if compute_result is False:  # batch_eval_metrics: more batches to come
                return {}
            gathered, self._gathered = self._gathered, None
            self._finished()
        except BaseException:
            self._drop()  # this evaluation stops here: nothing of it is left to the next
            raise
        self._answered = True
        out = self._calibrate_store(gathered)
        if self.extra_metrics is not None:
            out |= dict(self.extra_metrics(eval_pred))
        return out

    def _store(self, where: str) -> Collected:
        multilabel = self._task == "multilabel"
        return Collected(where, self.calibrator, self.conformal, bool(self.next_token), multilabel)

    def _calibrate_store(self, store: Collected) -> dict[str, float]:
        """`_calibrate` on the batches of `store`, streamed from disk where they were spilled."""
        try:
            if not isinstance(store.inner, Spilled):
                return self._calibrate(*(store.inner or Gathered(store.where)).result())
            fit = self.training_or_unfitted()
            spec = self.calibrator if fit else self.calibrator_
            calibration = streamed_calibration(spec, store.inner, self.bins, fit=fit)
        finally:
            store.close()
        if fit:
            self.calibrator_, self.conformal_ = calibration.calibrator, None
        self.metrics_ = calibration.before | {
            f"calibrated_{k}": v for k, v in calibration.after.items()
        }
        return dict(self.metrics_)

    def training_or_unfitted(self) -> bool:
        """Whether this evaluation fits (while training, or nothing fitted yet) or applies."""
        return self._training or self.calibrator_ is None

    def _calibrate(self, z: Tensor, y: Tensor) -> dict[str, float]:
        """Fit (while training, or when nothing was fitted) or apply; the metrics."""
        fit: Calibration
        if self._training or self.calibrator_ is None:
            fit = fit_calibration(self.calibrator, self.conformal, z, y, self.bins, self._task)
            self.calibrator_, self.conformal_ = fit.calibrator, fit.conformal
        else:
            fit = applied(self.calibrator_, self.conformal_, z, y, self.bins)
        self.metrics_ = fit.before | {f"calibrated_{k}": v for k, v in fit.after.items()}
        return dict(self.metrics_)

    # ---------------------------------------------------------------- events
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_train_begin(args, state, control, **kwargs)
        self._training = True
        self._task = task_of(kwargs.get("model"))

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_prediction_step(args, state, control, **kwargs)
        self._task = task_of(kwargs.get("model"))  # before compute_metrics reads the batches

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._training = False  # from here on evaluations apply the calibrator fitted last

    def on_predict(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._answered = False  # compute_metrics ran for a prediction, no on_evaluate follows

    def on_evaluate(
        self,
        args: Any,
        state: Any,
        control: Any,
        metrics: dict[str, float] | None = None,
        model: Any = None,
        eval_dataloader: Any = None,
        **kwargs: Any,
    ) -> None:
        if self._answered:  # compute_metrics gave the Trainer these metrics to log already
            self._answered = False
            return
        if int(getattr(args, "world_size", 1)) > 1:
            raise RuntimeError(
                "CalibrationCallback: under several processes each sees a shard of the eval "
                "data; pass Trainer(compute_metrics=callback.compute_metrics), whose logits "
                "the Trainer gathers from every process"
            )
        if model is None or eval_dataloader is None:
            return
        device = weights_device(model)
        self._task = task_of(model)
        store = self._store("eval_dataloader")
        gather(model, eval_dataloader, device, self.batch_fn, "eval_dataloader", store=store)
        prefix = _prefix(metrics or {})
        added = {f"{prefix}{k}": v for k, v in self._calibrate_store(store).items()}
        if metrics is not None:
            metrics.update(added)  # what trainer.evaluate() returns
        if state.log_history and prefix and f"{prefix}runtime" in state.log_history[-1]:
            state.log_history[-1].update(added)


def _prefix(metrics: Mapping[str, float]) -> str:
    """The evaluation's `metric_key_prefix` + "_" ("eval_", "test_"), read off the runtime
    the Trainer always reports; "" if there is none."""
    key = next((k for k in metrics if k.endswith("_runtime")), None)
    return key[: -len("runtime")] if key else ""
