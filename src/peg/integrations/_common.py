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

import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
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
from peg.output import logits_of, model_output
from peg.source._devices import move
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


def rows(logits: Any, labels: Any, where: str) -> tuple[Tensor, Tensor]:
    """Logits `[..., C]` and labels `[...]` as rows `[N, C]`, `[N]`, the -100 labels left out."""
    z = torch.as_tensor(logits)
    y = torch.as_tensor(labels)
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

    def __init__(self, where: str) -> None:
        self.where = where
        self.logits: list[Tensor] = []
        self.labels: list[Tensor] = []

    def add(self, logits: Any, labels: Any) -> None:
        z, y = rows(logits, labels, self.where)
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
        y = torch.empty(n, dtype=torch.int64)
        stop = n
        while self.labels:  # from the last batch back: each freed once copied
            chunk, labels = self.logits.pop(), self.labels.pop()
            z[stop - len(labels) : stop] = chunk
            y[stop - len(labels) : stop] = labels
            stop -= len(labels)
        return z, y


def gather(
    model: nn.Module,
    loader: Iterable[Any],
    device: torch.device | None,
    batch_fn: BatchFn | None,
    where: str,
    forward: Callable[[nn.Module, Any], Any] = call_model,
) -> tuple[Tensor, Tensor]:
    """The logits `[N, C]` and labels `[N]` of `model` on every batch of `loader` (split by
    `peg.source.batches`' conventions or `batch_fn`, inputs moved to `device`, the model run by
    `forward(model, inputs)`), in eval mode and without autograd; the model's mode is restored
    after."""
    gathered = Gathered(where)
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
    return gathered.result()


KEYS = ["nll", "error", "brier", "ece"]  # peg.metrics' keys of METRICS (accuracy = 1 - error)


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
) -> Calibration:
    """Fit a fresh `calibrator` (and `conformal`) on logits `[N, C]` and labels `[N]`.

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
        fitted = new_calibrator(calibrator).fit(nn.Identity(), (z, y))
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
    """The metrics of logits `[N, C]` on labels `[N]` before and after a fitted `calibrator`."""
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
