"""Beta calibration (Kull, Silva Filho & Flach 2017), the three-parameter "abm" version.

A map of two-column rows (`kinds` binary and multilabel), as Platt scaling: s is the logit of
the second column, q = sigmoid(s) the scorer's probability, and the calibrated log-odds are

    a ln q - b ln(1 - q) + c,   a, b >= 0,

the log-odds of a beta distribution's likelihood ratio. a = b gives Platt scaling's a s + c
back (ln q - ln(1 - q) = s); a ≠ b bends the map (an S or an inverse S in q), which Platt's
cannot. As the paper, (a, b, c) are a logistic regression of the labels on the features
[ln q, -ln(1 - q)] (computed from s in log space: -softplus(-s) and softplus(s), exact where q
saturates) with an intercept, fitted by Newton's method in float64 (`platt.fit_logistic`);
where the fit makes a coefficient negative (a map that is not monotone in q), the paper drops
that feature and refits. Here the nonnegative fit is exact: where the free fit is not
feasible, every face of the constraint (a = 0, b = 0, both) is fitted and the feasible one of
least NLL kept, which is the paper's refit wherever it is feasible.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.nn.functional import softplus

from peg._schema import Fields
from peg.methods import _constraints as checks
from peg.methods.base import store_arguments
from peg.methods.calibration._calibrator import Calibrator
from peg.methods.calibration._export import CalibrationMap, as_f64
from peg.methods.calibration.platt import (
    binary_score,
    fit_logistic,
    warn_unconverged,
)
from peg.source._kinds import IGNORE_INDEX
from peg.source.batches import BatchFn

__all__ = ["BetaCalibration", "beta_features"]


def _softplus(x: Tensor) -> Tensor:
    """ln(1 + e^x), stable, from ops ONNX Runtime runs in float64 (it has no float64 Softplus:
    the exported map would not load)."""
    return x.clamp(min=0) + torch.log1p(torch.exp(-x.abs()))


def beta_features(s: Tensor) -> Tensor:
    """[ln q, -ln(1 - q)] `[R, 2]` of scores s `[R]`, q = sigmoid(s), in log space."""
    return torch.stack([-_softplus(-s), _softplus(s)], -1)


def _nll(features: Tensor, y: Tensor, w: Tensor) -> float:
    z = features @ w
    return float((softplus(z) - y * z).mean())


def fit_beta(s: Tensor, y: Tensor, max_iter: int) -> tuple[Tensor, bool]:
    """(a, b, c) `[3]` of the least NLL with a, b >= 0 (the module doc), and whether every fit
    it took converged."""
    x = torch.cat([beta_features(s), torch.ones_like(s)[:, None]], 1)
    w, converged = fit_logistic(x, y, max_iter)
    if bool((w[:2] >= 0).all()):
        return w, converged
    # the optimum lies on a face: a = 0, b = 0 or both (the NLL is convex: the least NLL of
    # the faces' feasible optima is the constrained optimum)
    best, best_nll, all_converged = None, float("inf"), converged
    for kept in ([1], [0], []):  # the paper's refit first: the feature made negative dropped
        cols = [*kept, 2]
        v, ok = fit_logistic(x[:, cols], y, max_iter)
        if bool((v[:-1] < 0).any()):
            continue
        full = torch.zeros(3, dtype=v.dtype, device=v.device)
        full[cols] = v
        loss = _nll(x, y, full)
        if loss < best_nll:
            best, best_nll, all_converged = full, loss, converged and ok
    assert best is not None  # the intercept alone is always feasible
    return best, all_converged


class Beta(CalibrationMap):
    """Beta calibration: rows [0, a ln q - b ln(1 - q) + c], q = sigmoid(s)."""

    weights: Tensor

    def __init__(self, scores: str, weights: Tensor) -> None:
        super().__init__(scores)
        self.register_buffer("weights", as_f64(weights))

    def log_probs(self, s: Tensor) -> Tensor:
        d = s[:, 1] - s[:, 0]
        z = beta_features(d) @ self.weights[:2] + self.weights[2]
        return torch.stack([torch.zeros_like(z), z], -1)


class BetaCalibration(Calibrator):
    """Beta calibration of a binary scorer, three parameters: logit p = a ln q - b ln(1 - q)
    + c, q = sigmoid(s), a, b >= 0 (Kull, Silva Filho & Flach 2017, "Beta calibration: a
    well-founded and easily implemented improvement on logistic calibration for binary
    classifiers", AISTATS; `peg.methods.calibration.beta`). a = b is Platt scaling.

    It takes a binary scorer's scores `[N]` (or `[N, 1]`) with 0/1 labels, and a multilabel
    head's logits `[N, K]` with multi-hot labels (one shared map, or one per label with
    `per_label=True`); it acts on their canonical rows `[0, s]` (`peg.source._kinds`).

    Args:
        max_iter: Newton steps of each logistic fit (about ten suffice).
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape
            (`peg.source.batches`).
        task: the kind of input, read from the logits' and labels' shapes ("auto"), or
            "binary" or "multilabel" where the shapes could be either (`peg.source._kinds`).
        ignore_index: labels equal to it are left out of the fit (torch's -100).
        per_label: on a multilabel head, one map per label instead of one shared map.
        class_dim: unused by a map of two-column rows (dense input is not among its kinds);
            accepted as by every calibrator.

    After `fit(predictor, val)`: `a_`, `b_`, `c_`, `kind_`, `predictor_`, `meta_`;
    `predict_proba(X)` (P(y = 1) in the input's shape: `[N]`, or `[N, K]` for a multilabel
    head), `predict`, `member_logits(X)` (the calibrated logits), `save` / `peg.load`,
    `to_module()`.

    Examples:
        >>> import torch, peg
        >>> g = torch.Generator().manual_seed(0)
        >>> y = torch.randint(0, 2, (600,), generator=g)
        >>> s = 3.0 * (2 * y - 1) + 2 * torch.randn(600, generator=g)  # scores [N]
        >>> beta = peg.BetaCalibration().fit(s[:400], y[:400])
        >>> beta.a_ >= 0 and beta.b_ >= 0
        True
        >>> beta.predict_proba(s[400:]).shape  # P(y = 1)
        torch.Size([200])

    See Also:
        peg.PlattScaling: the map with a = b.
        peg.VennAbers: isotonic, with an interval [p0, p1] per prediction.
        docs/calibration.md: the binary maps and when to use which.
    """

    method = "beta-calibration"
    label = "beta calibration"
    name = "Beta calibration"  # the registry's entry (`Calibrator`): compare's, AutoSelect's row
    table_name = "Beta-calibrated"
    growth = 0  # three parameters
    kinds: ClassVar[tuple[str, ...]] = ("binary", "multilabel")
    order = 10
    simplicity = 1.5  # three parameters: after ETS's, before order-preserving's nine
    cost_order = 1.5

    def __init__(
        self,
        *,
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
        "max_iter": checks.positive_int(),
        **Calibrator.parameter_constraints,
    }

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        w, converged = fit_beta(binary_score(scores), y.double(), int(self.max_iter))
        if not converged:
            warn_unconverged(self.label, int(self.max_iter), "Platt scaling's targets bound it")
        return {"a_": float(w[0]), "b_": float(w[1]), "c_": float(w[2])}

    def _weights(self) -> Tensor:
        return torch.tensor([self.a_, self.b_, self.c_], dtype=torch.float64)

    def _apply(self, scores: Tensor) -> Tensor:
        w = self._weights().to(scores.device)
        z = beta_features(binary_score(scores)) @ w[:2] + w[2]
        return torch.stack([torch.zeros_like(z), z], -1)

    def _module(self) -> CalibrationMap:
        """The fitted map as a module (`to_module`)."""
        return Beta(self.scores_, self._weights())

    def _entry(self) -> dict[str, Any]:
        return {"a": float(self.a_), "b": float(self.b_), "c": float(self.c_)}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        fields = Fields(entry, "calibration", "meta.calibration.")
        return {
            "a_": fields.number("a", minimum=0),
            "b_": fields.number("b", minimum=0),
            "c_": fields.number("c"),
        }
