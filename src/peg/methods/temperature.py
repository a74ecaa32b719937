"""Temperature scaling (Guo et al. 2017): one scalar T > 0 fitted on validation NLL.

Works on a single model and on any ensemble: the scores scaled are the log of the averaged
predictive distribution, log p̄ `[N, C]` (for one model these are its logits up to a per-row
constant, which softmax ignores). T is fitted by L-BFGS on log T, so it stays positive. The
fitting, predicting and saving are every calibrator's (`peg.methods._calibrator.Calibrator`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from peg.batches import BatchFn
from peg.errors import ArchiveError
from peg.methods import _constraints as checks
from peg.methods._calibrator import Calibrator
from peg.methods.base import store_arguments

__all__ = [
    "TemperatureScaling",
    "fit_temperature",
]


class TemperatureScaling(Calibrator):
    """Post-hoc calibration of a model or an ensemble by one temperature.

    Args:
        max_iter: L-BFGS iterations (the NLL is smooth and one-dimensional: a few suffice).
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches that are neither
            `(x, y, ...)` nor a mapping with "labels" (`peg.batches`); used by `fit` and
            `member_logits`. None: those conventions.

    After `fit(predictor, val)`: `temperature_` (T), `predictor_`, `meta_` (method, T and the
    predictor's meta when it has one), `member_logits(X) -> [1, N, C]` (log p̄ / T),
    `predict_proba(X) -> [N, C]`, `predict(X) -> [N]` (temperature scaling never changes the
    class); `save(path)` writes the calibrated ensemble, its meta gaining
    `"calibration": {"method": "temperature", "temperature": T}`, which `peg.load(path, model)`
    gives back as a fitted `TemperatureScaling`.
    """

    method = "temperature"
    label = "temperature scaling"

    def __init__(
        self, *, max_iter: int = 100, batch_size: int = 512, batch_fn: BatchFn | None = None
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "max_iter": checks.positive_int(),
        **Calibrator.parameter_constraints,
    }

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        return {"temperature_": fit_temperature(scores, y, int(self.max_iter))}

    def _apply(self, scores: Tensor) -> Tensor:
        return scores / self.temperature_

    def _entry(self) -> dict[str, Any]:
        return {"temperature": float(self.temperature_)}

    def _archived(self) -> dict[str, Any]:
        return {"method": self.method, **self._entry()}  # T alone: the arguments are defaults

    def _described(self) -> dict[str, Any]:
        return self._entry()

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        temperature = entry.get("temperature")
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, (int, float))
            or not math.isfinite(temperature)
            or temperature <= 0
        ):
            raise ArchiveError(
                f"calibration: expected a temperature > 0 in the archive, got {temperature!r}"
            )
        return {"temperature_": float(temperature)}


def fit_temperature(scores: Tensor, y: Tensor, max_iter: int = 100) -> float:
    """argmin_T NLL(softmax(scores / T), y) for scores `[N, C]`, labels `[N]`.

    Newton's method on β = 1/T, where the NLL is convex: its derivative is the mean of
    E_p[s] - s_y and its second the mean of Var_p[s], both from one softmax over the scores, so
    each iteration is a few passes over `[N, C]` (float64), with a backtracking line search
    keeping β > 0; about six iterations to full precision (L-BFGS on log T took tens of
    function evaluations: at 1000 classes the fit's whole cost)."""
    scores = scores.detach().double()
    finite = torch.isfinite(scores).all(-1)
    s, y = scores[finite], y[finite].long()
    true = s.gather(1, y[:, None])[:, 0]

    def terms(beta: float, second: bool) -> tuple[float, float, float]:
        log_p = (beta * s).log_softmax(-1)
        value = -float(log_p.gather(1, y[:, None]).mean())
        if not second:
            return value, 0.0, 0.0
        p = log_p.exp()
        mean = (p * s).sum(-1)
        var = (p * s.square()).sum(-1) - mean.square()
        return value, float((mean - true).mean()), float(var.clamp_min(0).mean())

    beta = 1.0
    value, grad, hess = terms(beta, True)
    for _ in range(max_iter):
        if abs(grad) <= 1e-12 * max(1.0, abs(value)) or not hess > 0:
            break
        step = grad / hess
        # T > 0: β falls at most to a tenth per step (an optimum at β ≤ 0, scores anti-correlated
        # with the labels, is approached as T → ∞: the uniform prediction)
        t = min(1.0, 0.9 * beta / step) if step > 0 else 1.0
        while t > 1e-10:
            new = terms(beta - t * step, False)[0]
            if new <= value - 1e-4 * t * step * grad:
                break
            t /= 2
        else:
            break
        gain = value - new
        beta -= t * step
        value, grad, hess = terms(beta, True)
        if gain <= 1e-15 * max(1.0, abs(value)):
            break
    t = 1.0 / beta if beta != 0 else math.inf
    if not math.isfinite(t) or t <= 0:
        raise FloatingPointError(f"temperature scaling diverged (T = {t})")
    return t
