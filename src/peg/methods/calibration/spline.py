"""Spline calibration (Gupta et al. 2021, "Calibration of neural networks using splines",
ICLR), top-label.

On validation data, sort the N points by their top-label confidence f_(1) ≤ ... ≤ f_(N)
(f = max_c p̄_c), and take the cumulative top-label accuracy and confidence over the fractile
t = i / N,

    h̃(t_i) = (1/N) Σ_{j≤i} 1[ŷ_(j) = y_(j)],   s̃(t_i) = (1/N) Σ_{j≤i} f_(j).

Their derivatives in t are the accuracy and the confidence at fractile t, so the calibrated
confidence of a point with confidence f at fractile t is h̃'(t). As the paper's reference code,
peg fits a natural cubic spline, by least squares with `n_knots` knots equally spaced in t, to
the difference h̃ - s̃ (smoother than h̃ alone), and the calibrated confidence of the i-th
validation point is γ_i = f_(i) + (h̃ - s̃)'(t_i); a new confidence f is mapped by linear
interpolation between the (f_(i), γ_i) (constant beyond the ends), then clipped (below).
The map keeps `MAP_POINTS` of them at most, at evenly spaced fractiles (the ends included):
the N validation confidences themselves would make the map (and its archive) grow with N and
hold the validation data; between 129 fractiles the spline's derivative moves little (on
10-class logits, 500 to 50,000 points, the probabilities differ from the map through every
point by at most 0.003, the ECE and NLL by less than 1e-3).

The paper recalibrates the top-label probability only. To predict a full distribution, peg
renormalises the other classes proportionally: with q the calibrated top probability and p̂ the
predictor's, p_top = q and p_c = (1 - q) ((1 - ε) r_c + ε / (C - 1)) for the others, r_c =
p̂_c / (1 - p̂_top) their proportions (in log space: 1 - p̂_top as the logsumexp of the others,
exact when p̂ saturates), ε = `floor` (1e-6 by default) a sliver spread evenly so that a class
the predictor gave a probability of e^-1000 is not scored 1000 nats. q is clipped to
[a / (1 + a) + floor, 1 - floor], a the runner-up's share (at a / (1 + a) it would tie with the
top class): the predicted class never changes, and every probability is at least
floor² / (C - 1): the NLL stays finite, at most log((C - 1) / floor²) a point.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from peg.errors import ArchiveError
from peg.methods import _constraints as checks
from peg.methods.base import store_arguments
from peg.methods.calibration._calibrator import Calibrator, stored
from peg.methods.calibration._export import CalibrationMap, as_f64, interpolate_columns
from peg.source._kinds import IGNORE_INDEX
from peg.source.batches import BatchFn
from peg.utils.memory import require_memory

__all__ = ["SplineCalibration", "natural_spline_basis", "top_label_recalibrated"]

MAP_POINTS = 129  # (confidence, calibrated) pairs a map keeps, at most (the module doc)


def natural_spline_basis(t: Tensor, knots: Tensor) -> tuple[Tensor, Tensor]:
    """The natural cubic spline basis `[N, K]` at t `[N]` with `knots` `[K]` (K ≥ 2; Hastie,
    Tibshirani & Friedman, eq. 5.4-5.5: 1, t, d_k - d_{K-1}), and its derivative in t."""
    k = len(knots)
    ones = torch.ones_like(t)
    value, slope = [ones, t], [torch.zeros_like(t), ones]
    last = knots[-1]

    def d(j: int, power: int) -> Tensor:
        scale = (power + 1) if power < 3 else 1  # d/dt of x^3 is 3 x^2
        cubes = (t - knots[j]).clamp_min(0) ** power - (t - last).clamp_min(0) ** power
        return scale * cubes / (last - knots[j])

    for j in range(k - 2):
        value.append(d(j, 3) - d(k - 2, 3))
        slope.append(d(j, 2) - d(k - 2, 2))
    return torch.stack(value, 1), torch.stack(slope, 1)


def interpolate(x: Tensor, xs: Tensor, ys: Tensor) -> Tensor:
    """Linear interpolation of (xs, ys) (xs non-decreasing) at x, constant beyond the ends (as
    `numpy.interp`)."""
    x = x.clamp(xs[0], xs[-1])
    right = torch.searchsorted(xs, x.contiguous(), right=True).clamp(1, len(xs) - 1)
    x0, x1, y0, y1 = xs[right - 1], xs[right], ys[right - 1], ys[right]
    width = x1 - x0
    share = torch.where(width > 0, (x - x0) / width.clamp_min(1e-300), torch.ones_like(x))
    return y0 + share * (y1 - y0)


def top_label_recalibrated(log_p: Tensor, q: Tensor, floor: float) -> Tensor:
    """log p `[N, C]`: the top class given probability q `[N]`, the others sharing 1 - q in
    proportion to the predictor's probabilities, a `floor` of it spread evenly (the module
    doc); q clipped so that the top class stays the top."""
    c = log_p.shape[1]
    top = log_p.argmax(-1, keepdim=True)
    others = log_p.scatter(1, top, float("-inf"))
    log_rest = torch.logsumexp(others, -1, keepdim=True)  # log(1 - p̂_top), exact when saturated
    # r_c = p̂_c / (1 - p̂_top); a row whose others all underflowed to 0: r uniform
    log_r = torch.where(torch.isinf(log_rest), -math.log(c - 1), others - log_rest)
    even = torch.full_like(log_r, math.log(floor / (c - 1)))
    share = torch.logaddexp(log_r + math.log1p(-floor), even)  # (1 - ε) r_c + ε / (C - 1)
    share = share.scatter(1, top, float("-inf"))
    # the runner-up gets (1 - q) a, a its share: q ≥ a / (1 + a) + floor keeps the top the top
    a = share.max(-1).values.exp()
    q = torch.minimum(torch.maximum(q, a / (1 + a) + floor), torch.full_like(q, 1 - floor))
    return (share + torch.log1p(-q)[:, None]).scatter(1, top, q.log()[:, None])


class TopLabel(CalibrationMap):
    """Spline calibration: the top-label confidence interpolated on (confidences, calibrated),
    the other classes renormalised (`spline.top_label_recalibrated`)."""

    confidences: Tensor
    calibrated: Tensor

    def __init__(self, scores: str, confidences: Tensor, calibrated: Tensor, floor: float) -> None:
        super().__init__(scores)
        self.register_buffer("confidences", as_f64(confidences)[None])
        self.register_buffer("calibrated", as_f64(calibrated)[None])
        self.floor = float(floor)

    def log_probs(self, s: Tensor) -> Tensor:
        if torch.onnx.is_in_onnx_export() and torch.jit.is_tracing():
            raise TypeError(
                "torch.onnx.export: the TorchScript exporter (dynamo=False) has no ONNX "
                "operator for spline calibration's logaddexp; export with dynamo=True (the "
                "default since torch 2.9; needs onnxscript: pip install 'peg[export]')"
            )
        log_p = s.log_softmax(-1)
        top = log_p.max(-1).values.exp()[:, None]
        q = interpolate_columns(top, self.confidences, self.calibrated)[:, 0]
        return top_label_recalibrated(log_p, q, self.floor)


class SplineCalibration(Calibrator):
    """Spline calibration of the top-label confidence (Gupta et al. 2021), the other classes
    renormalised proportionally (`peg.methods.calibration.spline`).

    Args:
        n_knots: knots of the natural cubic spline, equally spaced in the fractile (the paper's
            code: 6); at least 2, at most the validation points (refused otherwise: knots in the
            fractile are not tied by tied scores, so none is dropped), and refused where the
            basis `[N, n_knots]` would not fit in memory.
        floor: the top class's least margin over the runner-up and the least mass left to
            the others, in (0, 0.1): the class kept, a finite NLL.
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

    After `fit(predictor, val)`: `confidences_` `[K]` (sorted validation confidences at K =
    min(N, 129) evenly spaced fractiles) and `calibrated_` `[K]` (γ at each), `predictor_`,
    `meta_`; `member_logits(X) -> [1, N, C]` (log of the recalibrated probabilities),
    `predict_proba`, `predict` (the predictor's class), `save` / `peg.load`.
    """

    method = "spline"
    label = "spline calibration"
    name = "Spline"  # the registry's entry (`Calibrator`): compare's, AutoSelect's row
    kinds = ("multiclass", "binary", "multilabel")
    growth = 0  # a few knots, whatever C
    order = 6
    simplicity = 3
    cost_order = 3

    def __init__(
        self,
        *,
        n_knots: int = 6,
        floor: float = 1e-6,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
        task: str = "auto",
        ignore_index: int = IGNORE_INDEX,
        per_label: bool = False,
        class_dim: int | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "n_knots": checks.positive_int(minimum=2),
        "floor": checks.interval(0, 0.1),
        **Calibrator.parameter_constraints,
    }

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        keep = ~torch.isnan(scores).any(-1)
        log_p, y = scores[keep].double(), y[keep]
        n = len(y)
        if n < int(self.n_knots):
            raise ValueError(
                f"val: {self.label} with n_knots={self.n_knots} needs at least that many "
                f"validation points, got {n}"
            )
        # the basis and its slope `[n, K]` (built from 2K columns, then copied by lstsq): a
        # ValueError naming n_knots where they cannot fit, not the allocator's
        require_memory("n_knots", int(self.n_knots), 5 * n * int(self.n_knots) * 8,
                       log_p.device, f"the spline basis of {n} points, float64",
                       "give fewer knots (the default, the paper's, is 6)")  # fmt: skip
        confidence, predicted = log_p.max(-1)
        order = confidence.argsort()
        f = confidence[order].exp()
        correct = (predicted[order] == y[order]).double()
        t = torch.linspace(0, 1, n, dtype=f.dtype, device=f.device)
        target = (correct - f).cumsum(0) / n  # h̃ - s̃ at each fractile
        knots = torch.linspace(0, 1, int(self.n_knots), dtype=f.dtype, device=f.device)
        value, slope = natural_spline_basis(t, knots)
        coef = torch.linalg.lstsq(value.cpu(), target.cpu()[:, None]).solution.to(f)
        calibrated = f + (slope @ coef)[:, 0] * n / (n - 1)  # t steps by 1 / (n - 1), h̃ by 1 / n
        kept = torch.linspace(0, n - 1, min(n, MAP_POINTS), dtype=f.dtype, device=f.device)
        kept = kept.round().long()
        return {"confidences_": f[kept], "calibrated_": calibrated[kept].clamp(0, 1)}

    def _module(self) -> CalibrationMap:
        """The fitted map as a module (`to_module`)."""
        return TopLabel(self.scores_, self.confidences_, self.calibrated_, self.floor)

    def _apply(self, scores: Tensor) -> Tensor:
        log_p = scores.double().log_softmax(-1)  # log p̄, normalised (a no-op for log p̄)
        xs, ys = self.confidences_.to(log_p), self.calibrated_.to(log_p)
        q = interpolate(log_p.max(-1).values.exp(), xs, ys)
        return top_label_recalibrated(log_p, q, float(self.floor))

    def _tensors(self) -> dict[str, Tensor]:
        return {"confidences": self.confidences_, "calibrated": self.calibrated_}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        xs = stored(tensors, "confidences")
        if xs.ndim != 1 or len(xs) < 2:
            raise ArchiveError("calibration: 'confidences' must be a 1-D array of >= 2 values")
        ys = stored(tensors, "calibrated", (len(xs),))
        for name, v in (("confidences", xs), ("calibrated", ys)):
            if not bool(((v >= 0) & (v <= 1)).all()):
                raise ArchiveError(f"calibration: {name!r} must hold probabilities in [0, 1]")
        if not bool((xs.diff() >= 0).all()):
            raise ArchiveError("calibration: 'confidences' must be sorted")
        return {"confidences_": xs, "calibrated_": ys}
