"""Ensemble temperature scaling (Zhang, Kailkhura & Han 2020, "Mix-n-Match: ensemble and
compositional methods for uncertainty calibration in deep learning", ICML, Section 3.1).

The calibrated prediction is a convex mixture of the temperature-scaled, the uncalibrated and
the uniform predictions:

    p(s) = w1 softmax(s / T) + w2 softmax(s) + w3 / C,   w ≥ 0, w1 + w2 + w3 = 1,

for scores s `[N, C]` (log p̄, the log of the averaged prediction: softmax(s) is the predictor's
own p̄, for one model and for an ensemble). As in the paper, T is fitted first (temperature
scaling on validation NLL, `fit_temperature`), then w with T fixed. The paper's reference code
offers the squared error or the NLL as the loss of w (optimised by SLSQP); peg fits w on the
NLL, -mean_i log Σ_k w_k P_ik (P_ik the probability component k gives to the label of point i),
which is convex in w: Newton's method on the simplex (`fit_weights`) reaches its minimum in a
few steps.

The uniform component keeps every probability at least w3 / C: the NLL stays finite even where
the scaled prediction saturates. The argmax is the predictor's (all three components agree on
the order of the classes), so accuracy is unchanged.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from peg.errors import ArchiveError
from peg.methods import _constraints as checks
from peg.methods.base import store_arguments
from peg.methods.calibration._affine import finite_scores
from peg.methods.calibration._calibrator import Calibrator, stored
from peg.methods.calibration._export import CalibrationMap, as_f64
from peg.methods.calibration._few_points import warn_few_points_shared
from peg.methods.calibration.temperature import fit_temperature, fitted_temperature
from peg.source._kinds import IGNORE_INDEX
from peg.source.batches import BatchFn

__all__ = ["EnsembleTemperatureScaling", "mixture_log_probs"]

EM_STEPS = 50  # EM steps before Newton's, on each face of the simplex (`_face`)


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
    """argmin_w -mean_i log Σ_k w_k P_ik on the simplex, for the components' probabilities of
    the labels P `[N, K]` (given as log P). The NLL is convex, so its minimum lies inside one
    face of the simplex (a set of weights > 0, the others 0), where it is the face's own
    minimum: each of the 2^K - 1 faces is solved (`_face`) and the best taken."""
    p = true.double().exp()
    k = p.shape[1]
    best, weights = math.inf, None
    for size in range(1, k + 1):
        for face in itertools.combinations(range(k), size):
            cols = torch.tensor(face)  # CPU indices: they index a tensor on any device
            w, value = _face(p[:, cols], max_iter, tol)
            if value < best:
                best, weights = value, p.new_zeros(k).index_copy(0, cols.to(p.device), w)
    assert weights is not None
    return weights


def _face(p: Tensor, max_iter: int, tol: float) -> tuple[Tensor, float]:
    """The NLL's minimum over one face (weights and value): `EM_STEPS` steps of EM for mixing
    proportions (w_k ← mean_i w_k P_ik / Σ_j w_j P_ij: monotone, from the uniform w, into the
    region where Newton's quadratic model holds), then Newton's method on the first K - 1
    weights (the last is 1 minus their sum), each step cut to stay inside the face (at most 99%
    of the way to its boundary) and backtracked until the NLL falls; it stops when the Newton
    decrement is below `tol` (nats)."""
    k = p.shape[1]
    w = torch.full((k,), 1.0 / k, dtype=p.dtype, device=p.device)
    for _ in range(EM_STEPS if k > 1 else 0):
        share = p * w
        w = (share / share.sum(1, keepdim=True)).mean(0)
    d = p[:, :-1] - p[:, -1:]  # [N, K - 1]: the gradient directions of the free weights

    def value(w: Tensor) -> float:
        return float(-(p * w).sum(1).log().mean())

    current = value(w)
    for _ in range(max_iter if k > 1 else 0):
        m = (p * w).sum(1)[:, None]
        grad = -(d / m).mean(0)
        hess = ((d / m)[:, :, None] * (d / m)[:, None, :]).mean(0)
        # pseudo-inverse: two identical components (T = 1) leave their split unidentified
        step = -(torch.linalg.pinv(hess, hermitian=True) * grad).sum(1)
        move = torch.cat([step, -step.sum(0, keepdim=True)])
        decrement = -float((grad * step).sum())
        if not decrement > tol:
            break
        out = move < 0
        t = min(1.0, 0.99 * float((w[out] / -move[out]).min())) if bool(out.any()) else 1.0
        while t > 1e-12:
            new = value(w + t * move)
            if new <= current - 1e-4 * t * decrement:
                break
            t /= 2
        else:
            break
        w, current = (w + t * move).clamp_min(0), new
    return w / w.sum(), current


class Mixture(CalibrationMap):
    """Ensemble temperature scaling: w · (softmax(s / T), softmax(s), 1 / C)."""

    temperature: Tensor
    weights: Tensor

    def __init__(self, scores: str, temperature: float, weights: Tensor) -> None:
        super().__init__(scores)
        self.register_buffer("temperature", as_f64(temperature))
        self.register_buffer("weights", as_f64(weights))

    def log_probs(self, s: Tensor) -> Tensor:
        temperature: Any = self.temperature  # a 0-d buffer where a float is documented
        return mixture_log_probs(s, temperature, self.weights)


class EnsembleTemperatureScaling(Calibrator):
    """Ensemble temperature scaling (ETS, Zhang et al. 2020): a convex mixture of the
    temperature-scaled, the uncalibrated and the uniform predictions (`peg.methods.
    ensemble_temperature`).

    Args:
        max_iter: iterations of temperature scaling's fit and of the weights' Newton steps.
        tol: the weights' fit stops when the Newton decrement (nats) falls below it.
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape
            (`peg.source.batches`).
        task: the kind of input, read from the logits' and labels' shapes ("auto"), or
            "multiclass", "binary" or "multilabel" where the shapes could be either
            (`peg.source._kinds`).
        ignore_index: labels equal to it are left out of the fit (torch's -100; 255 in
            Cityscapes and VOC).
        per_label: on a multilabel head, one map per label instead of one shared map.
        class_dim: where dense logits hold the classes, 1 (`[B, C, *S]`) or -1 (`[B, *S, C]`, a
            language model's); None: read from the shapes (an error where both read).

    After `fit(predictor, val)`: `temperature_` (T), `weights_` (w `[3]`: scaled, uncalibrated,
    uniform), `n_classes_` (C, as every calibrator), `predictor_`, `meta_`; `member_logits(X) ->
    [1, N, C]` (log p of the mixture), `predict_proba`, `predict` (the predictor's class),
    `save(path)` / `peg.load`.
    """

    method = "ensemble-temperature"
    label = "ensemble temperature scaling"
    name = "Ensemble TS"  # the registry's entry (`Calibrator`): compare's, AutoSelect's row
    table_name = "Ensemble-TS"
    growth = 0  # T and three mixture weights
    order = 7
    simplicity = 1
    cost_order = 1
    on_logits_default = True

    def __init__(
        self,
        *,
        max_iter: int = 100,
        tol: float = 1e-12,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
        task: str = "auto",
        ignore_index: int = IGNORE_INDEX,
        per_label: bool = False,
        class_dim: int | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "max_iter": checks.positive_int(),
        "tol": checks.number(),
        **Calibrator.parameter_constraints,
    }

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        s, y = scores, y.long()  # finite: `Calibrator.fit` checked the logits
        warn_few_points_shared(
            len(y), 3, self.label,  # T and the weights on the simplex (two free)
            "its weights rest on a handful of points: temperature scaling (one parameter) is "
            "safer",
        )  # fmt: skip
        temperature = fit_temperature(s, y, int(self.max_iter), label=self.label)
        parts = _components(s, temperature)  # [3, N, C]
        true = parts.gather(2, y[None, :, None].expand(3, -1, 1))[..., 0].T  # [N, 3]
        weights = fit_weights(true, int(self.max_iter), float(self.tol))
        return {"temperature_": temperature, "weights_": weights}

    def _module(self) -> CalibrationMap:
        """The fitted map as a module (`to_module`)."""
        return Mixture(self.scores_, self.temperature_, self.weights_)

    def _apply(self, scores: Tensor) -> Tensor:
        return mixture_log_probs(scores, self.temperature_, self.weights_)

    def _entry(self) -> dict[str, Any]:
        return {"temperature": float(self.temperature_)}  # C: every map's `n_classes`

    def _tensors(self) -> dict[str, Tensor]:
        return {"weights": self.weights_}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        t = fitted_temperature(entry)
        w = stored(tensors, "weights", (3,))
        if (
            not bool(torch.isfinite(w).all())
            or bool((w < 0).any())
            or abs(float(w.sum()) - 1) > 1e-6
        ):
            raise ArchiveError(
                f"calibration: 'weights' must be 3 weights >= 0 summing to 1, got {w}"
            )
        return {"temperature_": t, "weights_": w}
