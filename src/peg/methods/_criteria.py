"""What a perturbation scale (PEG's η, PEP's σ) is chosen by: criteria on held-out points.

A criterion maps member logits `[M, N, C]` and labels `[N]` to a float, lower is better. The
ones that are means of non-negative per-point losses (`PER_POINT`) also have their per-point
form (`POINT_LOSSES`), which lets the search race two scales on the same points or stop early.
Regression (floating-point targets, Gaussian heads `[B, 2]`) is scored by the mixture NLL.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from peg import metrics
from peg.metrics._inputs import pred_and_labels
from peg.metrics.regression import log_predictive_density, split_gaussian

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


def is_regression(y: Tensor) -> bool:
    """Floating-point targets mean regression; integer labels mean classification."""
    return torch.is_floating_point(y)
