"""Split conformal regression for Gaussian-head models and their ensembles (Lei et al. 2018;
Angelopoulos & Bates 2021 §2.3): intervals that hold the target with probability >= 1 - alpha
for exchangeable data, whatever the model.

The predictor's member outputs are `[M, N, 2]` (mean, log-variance; `peg.metrics.regression`);
μ and σ² are the mixture's mean and total variance (`moment_match`). The score is the absolute
residual |y − μ| (intervals of one width everywhere) or the normalised residual |y − μ| / σ
(intervals as wide as the ensemble's predictive std says, scaled so the coverage holds);
`predict_interval(X)` is μ ± q̂ (times σ), q̂ the ⌈(n + 1)(1 − α)⌉-th smallest score.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from peg._inputs import Data
from peg.batches import BatchFn
from peg.errors import ArchiveError
from peg.methods._conformal import (
    check_alpha,
    check_scores,
    conformal_quantile,
    labelled_batches,
    quantile_rank,
)
from peg.methods._conformal_base import ConformalBase, known_rows
from peg.methods._predictors import check_predictor
from peg.methods.base import store_arguments
from peg.metrics.regression import moment_match, split_gaussian

REG_SCORES = ("absolute", "normalized")


def mean_and_std(outputs: Tensor) -> tuple[Tensor, Tensor]:
    """The mixture's mean and predictive std, `[B]` float64 each, of Gaussian head outputs
    `[M, B, 2]` (mean, log-variance)."""
    if outputs.ndim != 3 or outputs.shape[-1] != 2:
        raise ValueError(
            "predictor: conformal regression needs Gaussian head outputs [M, B, 2] (mean, "
            f"log-variance), got {tuple(outputs.shape)}"
        )
    mu, var = moment_match(*split_gaussian(outputs))
    return mu, var.sqrt()


class ConformalRegressor(ConformalBase):
    """Split conformal prediction intervals for a Gaussian-head regressor or ensemble.

    Args:
        alpha: the miscoverage level in (0, 1): intervals hold y with probability >= 1 − α.
        score: "absolute" (|y − μ|: one width everywhere) or "normalized" (|y − μ| / σ, σ the
            mixture's predictive std: adaptive widths).
        batch_size, batch_fn: how the predictor reads data (`peg.batches`).

    After `fit(predictor, val)` (float targets): `quantile_` (q̂), `n_calib_`;
    `predict_interval(X) -> [N, 2]` (lower, upper), `predict(X) -> [N]` (μ);
    `member_logits` is the predictor's; `save(path)` / `peg.load(path, model)`.
    """

    method = "conformal_regression"
    label = "conformal regression"

    def __init__(
        self,
        *,
        alpha: float = 0.1,
        score: str = "normalized",
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

    def _check_params(self) -> None:
        check_alpha(self.alpha)
        if self.score not in REG_SCORES:
            raise ValueError(f"score: expected one of {list(REG_SCORES)}, got {self.score!r}")
        super()._check_params()

    def fit(
        self, predictor: Any, val: Data | None = None, *, bn_data: Data | None = None
    ) -> ConformalRegressor:
        """Fit q̂ on calibration data `val` (X, y) with float targets y, read once; returns
        self. `bn_data` is unused."""
        self._check_params()
        check_predictor(predictor)
        if val is None:
            raise ValueError("val: conformal regression needs calibration data (X, y)")
        rows = known_rows(val)
        if rows is not None:
            quantile_rank(rows, float(self.alpha))
        scores = []
        size = int(self.batch_size)
        for outputs, y in labelled_batches(predictor, val, size, self.batch_fn, "val"):
            if not torch.is_floating_point(y):
                raise ValueError(
                    f"val: conformal regression needs float targets, got {y.dtype} labels "
                    "(for classes use ConformalClassifier)"
                )
            mu, std = mean_and_std(outputs)
            s = (y.double() - mu).abs()
            if self.score == "normalized":
                s = s / std
            check_scores(s, "val")
            scores.append(s.cpu())
        score = torch.cat(scores)
        q = conformal_quantile(score, float(self.alpha))
        self._set_fitted(
            predictor, {"quantile_": q, "n_calib_": len(score), "scores_": "log_probs"}
        )
        return self

    def predict_interval(
        self, X: Data, batch_size: int | None = None, batch_fn: BatchFn | None = None
    ) -> Tensor:
        """Intervals `[N, 2]` float64: (μ − q̂·w, μ + q̂·w), w = 1 or σ."""
        self._check_fitted()
        parts = []
        for outputs in self._batches(X, batch_size, batch_fn):
            mu, std = mean_and_std(outputs)
            half = self.quantile_ * (std if self.score == "normalized" else torch.ones_like(mu))
            parts.append(torch.stack([mu - half, mu + half], dim=-1))
        return torch.cat(parts)

    def predict(self, X: Data, batch_size: int | None = None, **kwargs: Any) -> Tensor:
        """The mixture's mean `[N]` (float64)."""
        return mean_and_std(self.member_logits(X, batch_size, **kwargs))[0]

    # ---------------------------------------------------------------- persistence
    def _entry(self) -> dict[str, Any]:
        return {"quantile": float(self.quantile_), "n_calib": int(self.n_calib_)}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        q, n = entry.get("quantile"), entry.get("n_calib")
        if not isinstance(q, (int, float)) or isinstance(q, bool) or not math.isfinite(q):
            raise ArchiveError(f"calibration: expected a finite quantile, got {q!r}")
        if not isinstance(n, int) or n < 1:
            raise ArchiveError(f"calibration: bad n_calib {n!r}")
        return {"quantile_": float(q), "n_calib_": n}
