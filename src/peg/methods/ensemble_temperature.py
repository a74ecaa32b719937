"""Ensemble temperature scaling (Zhang, Kailkhura & Han 2020, "Mix-n-Match: ensemble and
compositional methods for uncertainty calibration in deep learning", ICML, Section 3.1).

The calibrated prediction is a convex mixture of the temperature-scaled, the uncalibrated and
the uniform predictions:

    p(s) = w1 softmax(s / T) + w2 softmax(s) + w3 / C,   w ≥ 0, w1 + w2 + w3 = 1,

for scores s `[N, C]` (log p̄, the log of the averaged prediction: softmax(s) is the predictor's
own p̄, for one model and for an ensemble). As in the paper, T is fitted first (temperature
scaling on validation NLL, `fit_temperature`), then w with T fixed. The paper's reference code
offers the squared error or the NLL as the loss of w; peg fits w on the NLL (`loss="nll"`), where
the mixture's NLL, -mean log(w · P_iy), is convex in w: the EM iteration for mixing proportions
(w_k ← mean_i w_k P_ik / Σ_j w_j P_ij, each P_ik the probability component k gives to the label
of point i) increases the likelihood monotonically to its maximum on the simplex; it stops
when no weight moves by more than `tol`.

The uniform component keeps every probability at least w3 / C: the NLL stays finite even where
the scaled prediction saturates. The argmax is the predictor's (all three components agree on
the order of the classes), so accuracy is unchanged.
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
from peg.methods._affine import finite_scores
from peg.methods._calibrator import Calibrator, stored
from peg.methods.base import store_arguments
from peg.methods.temperature import fit_temperature

__all__ = ["EnsembleTemperatureScaling", "mixture_log_probs"]


def _components(scores: Tensor, temperature: float) -> Tensor:
    """The three components' log-probabilities `[3, N, C]`: softmax(s / T), softmax(s), 1 / C."""
    s = finite_scores(scores)
    uniform = torch.full_like(s, -math.log(s.shape[-1]))
    return torch.stack([(s / temperature).log_softmax(-1), s.log_softmax(-1), uniform])


def mixture_log_probs(scores: Tensor, temperature: float, weights: Tensor) -> Tensor:
    """log p `[N, C]` (float64) of the mixture w · (softmax(s / T), softmax(s), 1 / C)."""
    parts = _components(scores, temperature)
    w = weights.to(parts).log()[:, None, None]  # a zero weight: log 0 = -inf, dropped by lse
    return torch.logsumexp(parts + w, 0)


def fit_weights(true: Tensor, max_iter: int, tol: float) -> Tensor:
    """argmax_w mean_i log Σ_k w_k P_ik on the simplex, for the components' probabilities of the
    labels P `[N, K]` (as log P): EM for mixing proportions, from the uniform w."""
    log_p = true.double()
    k = log_p.shape[1]
    w = torch.full((k,), 1.0 / k, dtype=log_p.dtype, device=log_p.device)
    for _ in range(max_iter):
        joint = log_p + w.log()  # [N, K]
        resp = (joint - torch.logsumexp(joint, 1, keepdim=True)).exp()
        new = resp.mean(0)
        new = new / new.sum()
        moved = float((new - w).abs().max())
        w = new
        if moved <= tol:
            break
    return w


class EnsembleTemperatureScaling(Calibrator):
    """Ensemble temperature scaling (ETS, Zhang et al. 2020): a convex mixture of the
    temperature-scaled, the uncalibrated and the uniform predictions (`peg.methods.
    ensemble_temperature`).

    Args:
        max_iter: iterations of temperature scaling's fit and of the weights' EM.
        tol: the EM stops when no weight moves by more than this.
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape
            (`peg.batches`).

    After `fit(predictor, val)`: `temperature_` (T), `weights_` (w `[3]`: scaled, uncalibrated,
    uniform), `n_classes_` (C), `predictor_`, `meta_`; `member_logits(X) -> [1, N, C]` (log p of
    the mixture), `predict_proba`, `predict` (the predictor's class), `save(path)` / `peg.load`.
    """

    method = "ensemble-temperature"
    label = "ensemble temperature scaling"

    def __init__(
        self,
        *,
        max_iter: int = 500,
        tol: float = 1e-9,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "max_iter": checks.positive_int(),
        "tol": checks.number(),
        **Calibrator.parameter_constraints,
    }

    def _check_classes(self, classes: int) -> None:
        if classes < 2:
            raise ValueError(f"val: {self.label} needs at least 2 classes, got {classes}")

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        keep = ~torch.isnan(scores).any(-1)
        s, y = scores[keep], y[keep].long()
        temperature = fit_temperature(s, y, int(self.max_iter))
        parts = _components(s, temperature)  # [3, N, C]
        true = parts.gather(2, y[None, :, None].expand(3, -1, 1))[..., 0].T  # [N, 3]
        weights = fit_weights(true, int(self.max_iter), float(self.tol))
        return {"temperature_": temperature, "weights_": weights, "n_classes_": s.shape[1]}

    def _apply(self, scores: Tensor) -> Tensor:
        return mixture_log_probs(scores, self.temperature_, self.weights_)

    def _fitted_classes(self) -> int | None:
        return int(self.n_classes_)

    def _entry(self) -> dict[str, Any]:
        return {"temperature": float(self.temperature_), "n_classes": int(self.n_classes_)}

    def _tensors(self) -> dict[str, Tensor]:
        return {"weights": self.weights_}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        t, c = entry.get("temperature"), entry.get("n_classes")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < math.inf:
            raise ArchiveError(f"calibration: expected a temperature > 0, got {t!r}")
        if isinstance(c, bool) or not isinstance(c, int) or c < 2:
            raise ArchiveError(f"calibration: expected n_classes >= 2, got {c!r}")
        w = stored(tensors, "weights", (3,))
        if (
            not bool(torch.isfinite(w).all())
            or bool((w < 0).any())
            or abs(float(w.sum()) - 1) > 1e-6
        ):
            raise ArchiveError(
                f"calibration: 'weights' must be 3 weights >= 0 summing to 1, got {w}"
            )
        return {"temperature_": float(t), "weights_": w, "n_classes_": c}
