"""Platt scaling (Platt 1999): a binary scorer's score s mapped to p = sigmoid(a s + b).

A map of two-column rows (`kinds` binary and multilabel): a binary scorer's scores `[N]`, or
each label's of a multilabel head, reach it as the canonical rows `[0, s]`
(`peg.source._kinds`; s is their difference, the logit of the second column, so logits and
log-probabilities give the same s), and it gives back `[0, a s + b]`, whose softmax is
(1 - p, p). (a, b) minimise the NLL in float64 by Newton's method with a
backtracking line search (`fit_logistic`; Lin, Lin & Weng 2007, "A note on Platt's
probabilistic outputs for support vector machines", Machine Learning 68), from Platt's start
a = 0, b = log((N₊ + 1) / (N₋ + 1)).

With `smoothed_targets` (the default, as scikit-learn's `method="sigmoid"` and Platt's paper),
a label 1 is read as the target (N₊ + 1) / (N₊ + 2) and a label 0 as 1 / (N₋ + 2): a prior
that keeps a finite where the scores separate the labels. Without it, the fit is the plain
logistic regression of the labels on s (the NLL's minimum; infinite where they separate:
warned of).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from peg._schema import Fields
from peg.methods import _constraints as checks
from peg.methods.base import store_arguments
from peg.methods.calibration._calibrator import Calibrator
from peg.methods.calibration._export import CalibrationMap, as_f64
from peg.source._kinds import IGNORE_INDEX
from peg.source.batches import BatchFn

__all__ = ["PlattScaling", "binary_score", "fit_logistic"]

RIDGE = 1e-12  # added to the Hessian's diagonal: a constant feature stays solvable
DECREMENT = 1e-16  # the Newton decrement at the optimum: logits off by ~1e-8 at most


def binary_score(scores: Tensor) -> Tensor:
    """The logit of the second class `[R]` of two-column rows `[R, 2]` (logits or
    log-probabilities: the difference of the columns, float64)."""
    s = scores.double()
    return s[:, 1] - s[:, 0]


def fit_logistic(
    features: Tensor,
    targets: Tensor,
    max_iter: int = 100,
    tol: float = 1e-10,
) -> tuple[Tensor, bool]:
    """argmin_w of the mean cross-entropy of sigmoid(features @ w) against `targets` in [0, 1]
    `[R]`, for `features` `[R, D]` (a column of ones for an intercept), by Newton's method with
    a backtracking line search on the NLL (float64). Returns (w `[D]`, converged): not
    converged after `max_iter` steps where the NLL has no minimum (separable labels: w grows
    without bound) or falls too slowly."""
    x, t = features.double(), targets.double()
    w = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
    if x.shape[1] and bool((x[:, -1] == 1).all()):  # Platt's start for the intercept
        mean = float(t.mean())
        n = len(t)
        w[-1] = math.log((mean * n + 1) / ((1 - mean) * n + 1))

    def nll(w: Tensor) -> float:
        z = x @ w
        return float((torch.nn.functional.softplus(z) - t * z).mean())

    loss = nll(w)
    for _ in range(max_iter):
        p = torch.sigmoid(x @ w)
        grad = x.T @ (p - t) / len(t)
        if float(grad.abs().max()) <= tol:
            return w, True
        hess = (x * (p * (1 - p))[:, None]).T @ x / len(t)
        hess += RIDGE * torch.eye(len(w), dtype=x.dtype, device=x.device)
        step = torch.linalg.solve(hess, grad)
        # the Newton decrement g·H⁻¹g, twice the NLL's predicted fall: below rounding, the
        # optimum (whatever the features' scale, where the gradient cannot reach `tol`)
        if float(grad @ step) <= DECREMENT:
            return w, True
        size = 1.0
        while size > 1e-12:  # Armijo: the NLL falls at least a tenth of the step's promise
            new = nll(w - size * step)
            if new <= loss - 1e-4 * size * float(grad @ step):
                break
            size /= 2
        else:  # no step lowers the NLL in float64: the optimum, to rounding
            return w, True
        w, loss = w - size * step, new
    return w, False


def warn_unconverged(label: str, max_iter: int, hint: str) -> None:
    """The warning of a logistic fit that did not settle (`fit_logistic`)."""
    warnings.warn(
        f"{label}: the fit did not converge in max_iter={max_iter} Newton steps: the scores "
        f"may separate the labels (the NLL then has no minimum and the slope grows without "
        f"bound); {hint}",
        stacklevel=4,
    )


class Sigmoid(CalibrationMap):
    """Platt scaling: rows [0, a s + b], s the logit of the second column."""

    slope: Tensor
    intercept: Tensor

    def __init__(self, scores: str, slope: float, intercept: float) -> None:
        super().__init__(scores)
        self.register_buffer("slope", as_f64(slope))
        self.register_buffer("intercept", as_f64(intercept))

    def log_probs(self, s: Tensor) -> Tensor:
        z = self.slope * (s[:, 1] - s[:, 0]) + self.intercept
        return torch.stack([torch.zeros_like(z), z], -1)


class PlattScaling(Calibrator):
    """Platt scaling of a binary scorer: p = sigmoid(a s + b), (a, b) minimising the
    validation NLL (Platt 1999, "Probabilistic outputs for support vector machines and
    comparisons to regularized likelihood methods", Advances in Large Margin Classifiers).
    scikit-learn's `CalibratedClassifierCV(method="sigmoid")`, to 1e-4 in probability.

    It takes a binary scorer's scores `[N]` (or `[N, 1]`) with 0/1 labels, and a multilabel
    head's logits `[N, K]` with multi-hot labels (one shared map, or one per label with
    `per_label=True`); it acts on their canonical rows `[0, s]` (`peg.source._kinds`).

    Args:
        smoothed_targets: Platt's targets (N₊ + 1) / (N₊ + 2) for label 1 and 1 / (N₋ + 2)
            for label 0 (scikit-learn's too): a finite fit where the scores separate the
            labels. False: the labels themselves (the plain maximum-likelihood fit).
        max_iter: Newton steps (about ten suffice).
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape
            (`peg.source.batches`).
        task: the kind of input, read from the logits' and labels' shapes ("auto"), or
            "binary" or "multilabel" where the shapes could be either (`peg.source._kinds`).
        ignore_index: labels equal to it are left out of the fit (torch's -100).
        per_label: on a multilabel head, one map per label instead of one shared map.
        class_dim: unused by a map of two-column rows (dense input is not among its kinds);
            accepted as by every calibrator.

    After `fit(predictor, val)`: `slope_` (a), `intercept_` (b), `kind_`, `predictor_`,
    `meta_`; `predict_proba(X)` (P(y = 1) in the input's shape: `[N]`, or `[N, K]` for a
    multilabel head), `predict`, `member_logits(X)` (the calibrated logits a s + b),
    `save` / `peg.load`, `to_module()`.

    Examples:
        >>> import torch, peg
        >>> g = torch.Generator().manual_seed(0)
        >>> y = torch.randint(0, 2, (400,), generator=g)
        >>> s = 6.0 * (2 * y - 1) + 4 * torch.randn(400, generator=g)  # over-confident [N]
        >>> platt = peg.PlattScaling().fit(s[:300], y[:300])
        >>> 0 < platt.slope_ < 1  # too sharp: the slope softens them
        True
        >>> platt.predict_proba(s[300:]).shape  # P(y = 1)
        torch.Size([100])

    See Also:
        peg.BetaCalibration: three parameters, a family Platt's is part of.
        peg.VennAbers: isotonic, with an interval [p0, p1] per prediction.
        docs/calibration.md: the binary maps and when to use which.
    """

    method = "platt-scaling"
    label = "Platt scaling"
    name = "Platt scaling"  # the registry's entry (`Calibrator`): compare's, AutoSelect's row
    table_name = "Platt-scaled"
    growth = 0  # two parameters
    kinds: ClassVar[tuple[str, ...]] = ("binary", "multilabel")
    order = 9
    simplicity = 0.5  # after TS's one parameter
    cost_order = 0.5

    def __init__(
        self,
        *,
        smoothed_targets: bool = True,
        max_iter: int = 100,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
        task: str = "auto",
        ignore_index: int = IGNORE_INDEX,
        per_label: bool = False,
        class_dim: int | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "smoothed_targets": checks.boolean(),
        "max_iter": checks.positive_int(),
        **Calibrator.parameter_constraints,
    }

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        s, y = binary_score(scores), y.double()
        targets = y
        if self.smoothed_targets:  # Platt's: (N₊ + 1) / (N₊ + 2) and 1 / (N₋ + 2)
            positives = float(y.sum())
            negatives = len(y) - positives
            high, low = (positives + 1) / (positives + 2), 1 / (negatives + 2)
            targets = torch.where(y > 0, high, low)
        features = torch.stack([s, torch.ones_like(s)], 1)
        w, converged = fit_logistic(features, targets, int(self.max_iter))
        if not converged:
            warn_unconverged(self.label, int(self.max_iter), "smoothed_targets=True bounds it")
        return {"slope_": float(w[0]), "intercept_": float(w[1])}

    def _apply(self, scores: Tensor) -> Tensor:
        z = self.slope_ * binary_score(scores) + self.intercept_
        return torch.stack([torch.zeros_like(z), z], -1)

    def _module(self) -> CalibrationMap:
        """The fitted map as a module (`to_module`)."""
        return Sigmoid(self.scores_, self.slope_, self.intercept_)

    def _entry(self) -> dict[str, Any]:
        return {"slope": float(self.slope_), "intercept": float(self.intercept_)}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        fields = Fields(entry, "calibration", "meta.calibration.")
        return {"slope_": fields.number("slope"), "intercept_": fields.number("intercept")}
