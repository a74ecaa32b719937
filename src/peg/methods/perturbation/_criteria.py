"""What a perturbation scale (PEG's η, PEP's σ) is chosen by: criteria on held-out points.

A criterion maps member logits `[M, N, C]` and labels `[N]` to a float, lower is better. The
ones that are means of non-negative per-point losses (`PER_POINT`) also have their per-point
form (`POINT_LOSSES`), which lets the search race two scales on the same points or stop early.
Regression (floating-point targets, Gaussian heads `[B, 2]`) is scored by the mixture NLL.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor, nn

from peg import metrics
from peg._forward import diagnose, eval_mode
from peg.metrics._inputs import pred_and_labels
from peg.metrics.regression import log_predictive_density, point_log_density, split_gaussian
from peg.output import model_output
from peg.source._devices import model_device, move
from peg.source._values import regression_targets
from peg.source.batches import call_model, take_rows, tensors

Criterion = Literal["nll", "ece", "brier"] | Callable[[Tensor, Tensor], float]

CRITERIA: dict[str, Callable[[Tensor, Tensor], float]] = {
    "nll": metrics.nll,
    "ece": metrics.ece,
    "brier": metrics.brier,
}


def mixture_nll(outputs: Tensor, y: Tensor) -> float:
    """Regression criterion: minus the log predictive density of the members' Gaussian mixture.

    `outputs` `[M, N, 2]` are Gaussian heads (mean, log-variance; `peg.models.gaussian`). A
    log-variance whose exponential overflows to inf or underflows to 0 (a scale so large the
    members diverged) scores +inf, the worst, like non-finite outputs.
    """
    mean, var = split_gaussian(outputs)
    if not (torch.isfinite(var).all() and (var > 0).all()):
        return math.inf
    return -log_predictive_density(mean, var, y)


# criteria that are means of non-negative per-point losses (scored batch by batch, early stop)
PER_POINT = ("nll", "brier")


def _point_nll(logits: Tensor, y: Tensor) -> Tensor:
    """Per-point NLL `[N]` of the ensemble of member logits `[M, N, C]` (mean: `metrics.nll`)."""
    log_p, y = pred_and_labels(logits, y)
    return -log_p.gather(1, y[:, None]).squeeze(1)


def _point_brier(logits: Tensor, y: Tensor) -> Tensor:
    """Per-point Brier score `[N]` (mean: `metrics.brier`)."""
    p, y = pred_and_labels(logits, y, log=False)
    return (p - torch.nn.functional.one_hot(y, p.shape[1]).to(p.dtype)).pow(2).sum(-1)


POINT_LOSSES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "nll": _point_nll,
    "brier": _point_brier,
}
REGRESSION_CRITERIA: dict[str, Callable[[Tensor, Tensor], float]] = {"nll": mixture_nll}


def _point_mixture_nll(outputs: Tensor, y: Tensor) -> Tensor:
    """Per-point `mixture_nll` `[N]` (not non-negative: a density may exceed 1)."""
    mean, var = split_gaussian(outputs)
    return -point_log_density(mean, var, y)


# per-point forms of the regression criteria (for standard errors, not for early stopping)
REGRESSION_POINT_LOSSES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"nll": _point_mixture_nll}


def is_regression(y: Tensor, width: int | None = None) -> bool:
    """Whether labels `y` are regression targets: by the one rule of peg
    (`peg.source._values.regression_targets`) for a model of `width` outputs (floats that are
    whole numbers in [0, C) are class labels); floating-point labels without it."""
    return torch.is_floating_point(y) if width is None else regression_targets(y, width)


def check_task(models: list[nn.Module], X: Any, y: Tensor, criterion: Criterion) -> int:
    """Probe one forward pass of each base model before any long work; the output width C.

    `X`, `y`: the validation data, or its first batch (inputs may be a mapping of tensors,
    `model(**inputs)`); the model runs on two rows.

    Integer labels `[N]` in [0, C) mean classification; floating-point targets `[N]` mean
    regression, for which the models must be Gaussian heads with outputs `[B, 2]` (mean,
    log-variance) and the criterion the mixture NLL.
    """
    C = None
    for r, model in enumerate(models):
        name = f"model {r}" if len(models) > 1 else "model"
        shown = tensors(X)
        device = model_device(model, name, ("val", shown[0]) if shown else None)
        x = move(take_rows(X, 0, 2), device, "val")
        with eval_mode(model), torch.no_grad():
            out = model_output(diagnose(functools.partial(call_model, model), x, "val"), name)
        if C is not None and out.shape[1] != C:
            raise ValueError(
                f"model: base models disagree on the number of classes ({C} vs {out.shape[1]})"
            )
        C = out.shape[1]
    assert C is not None
    if y.ndim != 1:
        raise ValueError(f"val: labels must be a vector [N], got shape {tuple(y.shape)}")
    if is_regression(y, C):
        if C != 2:
            raise ValueError(
                f"model: regression (floating-point targets that are not class indices, whole "
                f"numbers in [0, {C})) needs a Gaussian head with outputs [B, 2] (mean, "
                f"log-variance), got [B, {C}]; for classification pass class indices in [0, {C})"
            )
        if not (criterion in REGRESSION_CRITERIA or callable(criterion)):
            raise ValueError(
                f"criterion: {criterion!r} is for classification; regression takes "
                f"{sorted(REGRESSION_CRITERIA)} or a callable"
            )
        if not torch.isfinite(y).all():
            raise ValueError("val: regression targets contain NaN or inf")
        return C
    if y.min() < 0 or y.max() >= C:
        raise ValueError(
            f"val: labels must lie in [0, {C}) for a model with {C} outputs, "
            f"got min {int(y.min())}, max {int(y.max())}"
        )
    return C
