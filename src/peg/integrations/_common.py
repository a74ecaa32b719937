"""What the framework integrations share: the calibrator and conformal arguments (checked and
made fresh for every fit), the logits of a labelled loader gathered on the CPU batch by batch,
the fit on them and its metrics before and after, and the reliability figure.

Logits are fitted on as saved logits are, through `nn.Identity()`: the calibrator keeps no
reference to the user's model (nothing of the model is saved with it), and applies to logits
`[N, C]` (`calibrator_.predict_proba(logits)`). Rows whose label is -100 are left out: the
`ignore_index` of `torch.nn.functional.cross_entropy` and of every transformers loss (padding
tokens, special tokens), which no metric or calibrator should read as a class.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from peg.methods.calibration._calibrator import Calibrator
from peg.methods.calibration._wraps import WrapsCalibrator
from peg.methods.calibration.temperature import TemperatureScaling
from peg.methods.conformal._split import check_alpha
from peg.methods.conformal.classifier import ConformalClassifier
from peg.metrics import classification_metrics, reliability
from peg.metrics.kinds import kind_metrics
from peg.metrics.streaming import StreamingMetrics
from peg.output import logits_of, model_output
from peg.source import reread_loader
from peg.source._devices import move
from peg.source._kinds import Kind
from peg.source.batches import BatchFn, call_model, split_batch

IGNORE_INDEX = -100  # labels left out (cross_entropy's and transformers' ignore_index)
METRICS = ("accuracy", "nll", "ece", "brier")  # what is logged, before and after
# fewer labelled rows than this: the fit and the metrics after it are mostly noise (the ECE's
# 15 bins hold a few points each; vector scaling fits 2C numbers), said with the count
MIN_ROWS = 50
DEFAULT_CALIBRATOR = TemperatureScaling.name  # the callbacks' default map, "TS"


def calibrator_names() -> dict[str, type[Calibrator]]:
    """A calibrator by name: "TS" (as `peg.compare` names it) or a registered map's key
    (`Calibrator.registry`: "temperature", "vector-scaling", ...)."""
    return {TemperatureScaling.name: TemperatureScaling, **Calibrator.registry}


def check_calibrator(value: Any, name: str) -> None:
    """`calibrator`: a name of `calibrator_names()` or a calibrator instance (fitted or not: a
    copy is fitted); the wrappers (conformal, label shift) are refused, they need more than
    logits."""
    if isinstance(value, str) and value in calibrator_names():
        return
    if isinstance(value, Calibrator) and not isinstance(value, WrapsCalibrator):
        return
    hint = (
        "; pass a ConformalClassifier as conformal=" if isinstance(value, WrapsCalibrator) else ""
    )
    raise TypeError(
        f"{name}: expected one of {sorted(calibrator_names())} or a peg calibrator instance "
        f"(peg.TemperatureScaling(), ...), got {value!r}{hint}"
    )


def check_conformal(value: Any, name: str) -> None:
    """`conformal`: None, a miscoverage level α in (0, 1), or a `peg.ConformalClassifier`
    without `shift` (a shift needs deployment inputs, which a callback does not have)."""
    if value is None:
        return
    if isinstance(value, ConformalClassifier):
        if value.shift is not None:
            raise ValueError(
                f"{name}: a ConformalClassifier with shift={value.shift!r} needs target inputs "
                "at fit; fit it yourself on the callback's logits (docs/integrations.md)"
            )
        return
    if isinstance(value, (bool, str)) or not isinstance(value, (int, float, np.number)):
        raise TypeError(
            f"{name}: expected None, a miscoverage level in (0, 1) or a "
            f"peg.ConformalClassifier, got {value!r}"
        )
    check_alpha(value, name)


def new_calibrator(spec: str | Calibrator) -> Calibrator:
    """A fresh calibrator to fit: the named class with its defaults, or a copy of the one given
    (the user's instance is never fitted in place: each fit starts from its arguments)."""
    if isinstance(spec, str):
        return calibrator_names()[spec]()
    return type(spec)(**spec.get_params(deep=False))


def new_conformal(spec: float | ConformalClassifier | None) -> ConformalClassifier | None:
    if spec is None:
        return None
    if isinstance(spec, ConformalClassifier):
        return type(spec)(**spec.get_params(deep=False))
    return ConformalClassifier(alpha=float(spec))


def rows(
    logits: Any, labels: Any, where: str, next_token: bool = False, multilabel: bool = False
) -> tuple[Tensor, Tensor]:
    """Logits `[..., C]` and labels `[...]` as rows `[N, C]`, `[N]`, the -100 labels left out.

    `next_token`: a causal LM's logits `[B, T, V]` and labels `[B, T]` (the input ids): position
    t's logits predict token t + 1, so `logits[:, :-1]` are read against `labels[:, 1:]`.
    `multilabel`: a multi-label head's logits `[N, K]` and multi-hot labels `[N, K]` (floats, as
    transformers' `multi_label_classification` takes them), kept as they are (int64 labels)."""
    z = torch.as_tensor(logits)
    y = torch.as_tensor(labels)
    if multilabel and z.ndim == 2 and tuple(y.shape) == tuple(z.shape):
        return z, y.long()
    if next_token:
        if z.ndim != 3 or y.ndim != 2:
            raise ValueError(
                f"{where}: next_token=True expects a causal LM's logits [B, T, V] and labels "
                f"[B, T], got shapes {tuple(z.shape)} and {tuple(y.shape)}"
            )
        z, y = z[:, :-1], y[:, 1:]
    if z.ndim < 2 or not z.is_floating_point():
        raise ValueError(
            f"{where}: expected floating-point logits [N, C] (or [N, T, C] with labels [N, T]), "
            f"got {z.dtype} of shape {tuple(z.shape)}; a preprocess_logits_for_metrics that "
            "takes the argmax leaves no probabilities to calibrate"
        )
    if tuple(y.shape) != tuple(z.shape[:-1]) or y.is_floating_point() or y.dtype == torch.bool:
        raise ValueError(
            f"{where}: expected integer labels of shape {tuple(z.shape[:-1])} for logits of "
            f"shape {tuple(z.shape)}, got {y.dtype} of shape {tuple(y.shape)}"
        )
    z, y = z.reshape(-1, z.shape[-1]), y.reshape(-1)
    keep = y != IGNORE_INDEX
    if not bool(keep.all()):
        z, y = z[keep], y[keep]
    return z, y


class Gathered:
    """Logits and labels added batch by batch, held on the CPU (float32 logits, int64 labels)
    and joined once by `result()` into `[N, C]`, `[N]`: the batches are freed as they are
    copied, so no more than the joined logits and one batch are held at once."""

    def __init__(self, where: str, next_token: bool = False, multilabel: bool = False) -> None:
        self.where, self.next_token, self.multilabel = where, next_token, multilabel
        self.logits: list[Tensor] = []
        self.labels: list[Tensor] = []

    def add(self, logits: Any, labels: Any) -> None:
        z, y = rows(logits, labels, self.where, self.next_token, self.multilabel)
        if self.logits and z.shape[1] != self.logits[0].shape[1]:
            raise ValueError(
                f"{self.where}: batch {len(self.logits)} has {z.shape[1]} classes, the first "
                f"had {self.logits[0].shape[1]}"
            )
        self.logits.append(z.detach().to("cpu", torch.float32))
        self.labels.append(y.detach().to("cpu", torch.int64))

    def result(self) -> tuple[Tensor, Tensor]:
        n = sum(len(y) for y in self.labels)
        if n == 0:
            raise ValueError(f"{self.where}: no labelled rows to calibrate on (every label -100?)")
        z = torch.empty(n, self.logits[0].shape[1])
        y = torch.empty(n, *self.labels[0].shape[1:], dtype=torch.int64)  # [N] or [N, K]
        stop = n
        while self.labels:  # from the last batch back: each freed once copied
            chunk, labels = self.logits.pop(), self.labels.pop()
            z[stop - len(labels) : stop] = chunk
            y[stop - len(labels) : stop] = labels
            stop -= len(labels)
        return z, y


class Spilled:
    """Token outputs' labelled rows written to disk batch by batch (float32 `[R_j, C]`, int64
    `[R_j]`, one file a batch) instead of joined in memory: `[N, V]` at V = 50,257 does not fit,
    and temperature scaling reads the rows pass after pass (`pairs`, memory-mapped), so only a
    batch is in memory at once. `close()` removes the files."""

    def __init__(self, where: str, next_token: bool = False) -> None:
        self.where, self.next_token = where, next_token
        self.folder = Path(tempfile.mkdtemp(prefix="peg-rows-"))
        self.count = self.n = 0
        self.classes: int | None = None

    def add(self, logits: Any, labels: Any) -> None:
        z, y = rows(logits, labels, self.where, self.next_token)
        if self.classes is not None and z.shape[1] != self.classes:
            raise ValueError(
                f"{self.where}: batch {self.count} has {z.shape[1]} classes, the first had "
                f"{self.classes}"
            )
        self.classes = z.shape[1]
        part = {"z": z.detach().to("cpu", torch.float32), "y": y.detach().to("cpu", torch.int64)}
        torch.save(part, self.folder / f"{self.count}.pt")
        self.count, self.n = self.count + 1, self.n + len(y)

    def pairs(self) -> Iterator[tuple[Tensor, Tensor]]:
        """Every batch's rows `[R_j, C]` and labels `[R_j]`, read back memory-mapped."""
        for j in range(self.count):
            part = torch.load(self.folder / f"{j}.pt", mmap=True, weights_only=True)
            yield part["z"], part["y"]

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def loader(self) -> Any:
        """The batches as dense outputs a calibrator's `fit(nn.Identity(), loader)` streams:
        `(logits [1, R_j, C], labels [1, R_j])` each (one sequence of R_j positions, the
        classes last), read from the files again on every pass."""
        return reread_loader(self._sequences)

    def _sequences(self) -> Iterator[tuple[Tensor, Tensor]]:
        for z, y in self.pairs():
            if len(y):  # a batch of ignored labels only: nothing to fit
                yield z[None], y[None]


def spills(calibrator: str | Calibrator, conformal: Any, logits: Any) -> bool:
    """Whether an evaluation's logits are kept on disk (`Spilled`) rather than gathered: token
    outputs `[B, T, V]` calibrated by temperature scaling alone, which is fitted streamed;
    another map, or a conformal predictor, needs every row at once (gathered)."""
    named = calibrator_names().get(calibrator) if isinstance(calibrator, str) else calibrator
    is_ts = named is TemperatureScaling or isinstance(named, TemperatureScaling)
    return is_ts and conformal is None and getattr(logits, "ndim", 2) == 3


class Collected:
    """An evaluation's batches, `Spilled` or `Gathered` as `spills` chooses at the first."""

    def __init__(
        self,
        where: str,
        calibrator: Any,
        conformal: Any,
        next_token: bool = False,
        multilabel: bool = False,
    ) -> None:
        self.where, self.calibrator, self.conformal = where, calibrator, conformal
        self.next_token, self.multilabel = next_token, multilabel
        self.inner: Gathered | Spilled | None = None

    def add(self, logits: Any, labels: Any) -> None:
        if self.inner is None:
            spill = spills(self.calibrator, self.conformal, torch.as_tensor(logits))
            self.inner = (
                Spilled(self.where, self.next_token)
                if spill
                else Gathered(self.where, self.next_token, self.multilabel)
            )
        self.inner.add(logits, labels)

    def close(self) -> None:
        if isinstance(self.inner, Spilled):
            self.inner.close()


def streamed_calibration(
    calibrator: Any, store: Spilled, bins: int = 15, fit: bool = True
) -> Calibration:
    """Temperature scaling fitted on a `Spilled` store's rows, streamed
    (its public `fit` on `Spilled.loader()`: a pass over the files per Newton step;
    `calibrator` the callbacks' argument, a fresh copy fitted) or applied (`fit=False`:
    `calibrator` a fitted `TemperatureScaling`), with the metrics before and after streamed
    too (`StreamingMetrics`). The fitted map's kind is dense, the classes last: its
    `predict_proba` takes token logits `[N, T, V]`."""
    if store.n == 0:
        raise ValueError(f"{store.where}: no labelled rows to calibrate on (every label -100?)")
    if not fit:
        fitted = calibrator
    else:
        fitted = new_calibrator(calibrator)
        assert isinstance(fitted, TemperatureScaling)
        # the rows as token outputs [1, R_j, C]: dense, the classes last, fitted streamed
        fitted.set_params(class_dim=-1, task="auto", ignore_index=-100, per_label=False)
        fitted.fit(nn.Identity(), store.loader())
    t = float(fitted.temperature_)
    before, after = (StreamingMetrics(bins=bins, metrics=KEYS) for _ in range(2))
    for z, y in store.pairs():
        before.update(z.unsqueeze(0), y)
        after.update((z / t).unsqueeze(0), y)
    return Calibration(fitted, None, named(before.compute()), named(after.compute()))


def gather(
    model: nn.Module,
    loader: Iterable[Any],
    device: torch.device | None,
    batch_fn: BatchFn | None,
    where: str,
    forward: Callable[[nn.Module, Any], Any] = call_model,
    store: Collected | None = None,
) -> Any:
    """The logits `[N, C]` and labels `[N]` of `model` on every batch of `loader` (split by
    `peg.source.batches`' conventions or `batch_fn`, inputs moved to `device`, the model run by
    `forward(model, inputs)`), in eval mode and without autograd; the model's mode is restored
    after. `store`: where the batches go, returned filled (not joined) when given."""
    gathered = Gathered(where) if store is None else store
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for i, batch in enumerate(loader):
                x, y = split_batch(batch, batch_fn, name=where, index=i, need_labels=True)
                out = logits_of(forward(model, move(x, device, where)))
                if not isinstance(out, Tensor):
                    model_output(out, where)  # the one message for a forward without logits
                gathered.add(out, y)
    finally:
        model.train(was_training)
    return gathered.result() if isinstance(gathered, Gathered) else gathered


KEYS = ["nll", "error", "brier", "ece"]  # peg.metrics' keys of METRICS (accuracy = 1 - error)


def task_of(model: Any) -> str:
    """The calibrators' `task` of a transformers model: "multilabel" where its config's
    `problem_type` is "multi_label_classification" (sigmoid per label), else "auto"."""
    problem = getattr(getattr(model, "config", None), "problem_type", None)
    return "multilabel" if problem == "multi_label_classification" else "auto"


def named(got: Mapping[str, float]) -> dict[str, float]:
    """`METRICS` from peg.metrics' values of `KEYS`."""
    return {"accuracy": 1.0 - got["error"], **{k: got[k] for k in METRICS if k != "accuracy"}}


def summary(pred: Tensor, y: Tensor, bins: int) -> dict[str, float]:
    """accuracy, nll, ece, brier of probabilities `[N, C]` or member logits `[M, N, C]`."""
    return named(classification_metrics(pred, y, bins=bins, metrics=KEYS))


@dataclass
class Calibration:
    """One fit: the fitted calibrator (and conformal predictor), the metrics of the logits
    before and of the calibrated probabilities after, and their reliability curves."""

    calibrator: Calibrator
    conformal: ConformalClassifier | None
    before: dict[str, float]
    after: dict[str, float]
    curves: dict[str, dict[str, Tensor]] = field(default_factory=dict)

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """`{prefix}{metric}_before` / `_after` for every metric of `METRICS`."""
        out = {f"{prefix}{k}_before": v for k, v in self.before.items()}
        return out | {f"{prefix}{k}_after": v for k, v in self.after.items()}


def fit_calibration(
    calibrator: str | Calibrator,
    conformal: float | ConformalClassifier | None,
    logits: Tensor,
    labels: Tensor,
    bins: int = 15,
    task: str = "auto",
) -> Calibration:
    """Fit a fresh `calibrator` (and `conformal`) on logits `[N, C]` and labels `[N]` (`task`:
    the calibrator's, "multilabel" for a multi-label head's `[N, K]` with `[N, K]`).

    The conformal predictor is fitted on the model's own probabilities, not on the calibrated
    ones: the calibrator was fitted on these same points, and a set built on a map fitted on its
    own calibration data would lose the exact finite-sample guarantee. Runs with autograd on and
    outside inference mode, wherever the framework calls it from (Lightning's validation hooks
    run under `no_grad` or `inference_mode`): the logits are copied out of it first.
    """
    if len(labels) < MIN_ROWS:
        warnings.warn(
            f"calibrator: fitted on {len(labels)} labelled rows, fewer than {MIN_ROWS}: the "
            "fitted map and the metrics after it rest on too few points to trust; evaluate "
            "on more data (a larger validation set, not a sanity check's batches)",
            stacklevel=2,
        )
    with torch.inference_mode(False), torch.enable_grad():
        z, y = logits.clone(), labels.clone()
        fitted = new_calibrator(calibrator)
        if task != "auto":
            fitted.set_params(task=task)
        fitted.fit(nn.Identity(), (z, y))
        sets = new_conformal(conformal)
        if sets is not None:
            sets.fit(nn.Identity(), (z, y))
    return applied(fitted, sets, z, y, bins)


def applied(
    calibrator: Calibrator,
    conformal: ConformalClassifier | None,
    logits: Tensor,
    labels: Tensor,
    bins: int = 15,
) -> Calibration:
    """The metrics of logits `[N, C]` on labels `[N]` before and after a fitted `calibrator`
    (a multi-label head's `[N, K]`, `[N, K]`: over every label entry, `kind_metrics`)."""
    kind = getattr(calibrator, "kind_", None)
    if isinstance(kind, Kind) and kind.kind == "multilabel":
        with torch.no_grad():
            after = calibrator.scale(logits.unsqueeze(0), "logits")[0]
        both = (logits, after)
        metrics = [named(kind_metrics(z, labels, kind, bins, metrics=KEYS)) for z in both]
        return Calibration(calibrator, conformal, *metrics)
    with torch.no_grad():
        probs = calibrator.predict_proba(logits)
    before = logits.unsqueeze(0)
    return Calibration(
        calibrator=calibrator,
        conformal=conformal,
        before=summary(before, labels, bins),
        after=summary(probs, labels, bins),
        curves={
            "before": reliability(before, labels, bins),
            "after": reliability(probs, labels, bins),
        },
    )


def reliability_figure(curves: Mapping[str, Mapping[str, Any]], title: str) -> Any:
    """The reliability diagrams of `curves` (`peg.plots.reliability_diagram`) as a matplotlib
    Figure, for a logger's `add_figure`."""
    from peg.plots import reliability_diagram

    return reliability_diagram(curves, path=None, title=title)


def figure_sink(experiment: Any) -> Any:
    """The `add_figure(tag, figure, global_step)` of a logger's experiment (TensorBoard's
    `SummaryWriter`; anything else with one), or None: told by capability, not by type."""
    add = getattr(experiment, "add_figure", None)
    return add if callable(add) else None
