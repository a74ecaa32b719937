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
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from peg._features import Features
from peg.errors import ArchiveError
from peg.methods import _constraints as checks
from peg.methods._predictors import check_predictor
from peg.methods.base import store_arguments
from peg.methods.conformal._base import ConformalBase
from peg.methods.conformal._shift import (
    FEATURES_OPTION,
    HEAVY,
    SEPARABLE,
    WEIGHT_CUTOFFS,
    check_target,
    fit_weights,
    joint_batches,
    weighted_thresholds,
)
from peg.methods.conformal._split import (
    ALPHA,
    check_scores,
    conformal_quantile,
    labelled_batches,
    quantile_rank,
)
from peg.metrics.regression import moment_match, split_gaussian
from peg.source import Data, Source
from peg.source.batches import BatchFn

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


def _mean_outputs(outputs: Tensor) -> Tensor:
    """The members' mean outputs `[B, 2]`: a regressor's "logits" features."""
    return outputs.double().mean(0)


def _regression_shift(value: Any, name: str) -> None:
    if isinstance(value, str) and value == "label":
        raise ValueError(f"{name}: 'label' is for classes; regression takes None or 'covariate'")
    checks.one_of(None, "covariate")(value, name)


class ConformalRegressor(ConformalBase):
    """Split conformal prediction intervals for a Gaussian-head regressor or ensemble: μ(x) ± q̂
    (times σ(x) for `score="normalized"`), q̂ the ⌈(n + 1)(1 − α)⌉-th smallest calibration
    score (Lei et al. 2018; Angelopoulos & Bates 2021, §2.3).

    Args:
        alpha: the miscoverage level in (0, 1): intervals hold y with probability >= 1 − α.
        score: "absolute" (|y − μ|: one width everywhere) or "normalized" (|y − μ| / σ, σ the
            mixture's predictive std: adaptive widths).
        shift: None (exchangeable data) or "covariate": weighted split conformal (Tibshirani
            et al. 2019) for deployment inputs that differ from the calibration data's; `fit`
            then needs `target=` unlabelled deployment inputs, and each interval's q̂ depends
            on its input's likelihood ratio (`peg.methods.conformal._shift`).
        features, n_folds: the covariate-shift domain classifier's inputs ("penultimate",
            "logits": the mean outputs, "inputs") and cross-fitting folds.
        max_auroc, min_ess, warn_ess: the cut-offs of the covariate-shift weights
            (`peg.methods.conformal._shift.DomainWeights.check`, docs/shift.md): `fit` refuses
            where the domain classifier's out-of-fold AUROC is >= `max_auroc` (no overlap:
            unbounded weights) or the weights' effective sample size (Σw)² / Σw² is below
            `min_ess` (None: 1/α − 1, the fewest points a conformal quantile needs), and warns
            below `warn_ess` · n (heavy weights: wide sets that vary between calibration sets).
        batch_size, batch_fn: how the predictor reads data (`peg.source.batches`).

    After `fit(predictor, val)` (float targets): `quantile_` (q̂; None under covariate shift),
    `n_calib_`;
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
        shift: str | None = None,
        features: str = "penultimate",
        n_folds: int = 5,
        max_auroc: float = SEPARABLE,
        min_ess: float | None = None,
        warn_ess: float = HEAVY,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "alpha": ALPHA,
        "score": checks.one_of(*REG_SCORES),
        "shift": checks.described(_regression_shift, "None or 'covariate'"),
        "features": FEATURES_OPTION,
        "n_folds": checks.positive_int(minimum=2),
        **WEIGHT_CUTOFFS,
        **ConformalBase.parameter_constraints,
    }

    def fit(
        self,
        predictor: Any,
        val: Data | None = None,
        *,
        target: Data | None = None,
        bn_data: Data | None = None,
    ) -> ConformalRegressor:
        """Fit q̂ on calibration data `val` (X, y) with float targets y, read once; returns
        self. `target`: unlabelled deployment inputs, with `shift` only. `bn_data` is unused."""
        self._check_params()
        check_predictor(predictor)
        if val is None:
            raise ValueError("val: conformal regression needs calibration data (X, y)")
        check_target(self.shift, target, val)
        rows = Source(val).known_rows()
        if rows is not None and self.shift is None:
            quantile_rank(rows, float(self.alpha))
        size = int(self.batch_size)
        if self.shift == "covariate":
            features = Features(predictor, self.features, _mean_outputs)
            kept: list[Tensor] = []
            batches = self._kept(predictor, val, size, features, kept)
            score = self._scores(batches)
            state = fit_weights(predictor, target, score, torch.cat(kept), features, self)
            self._set_fitted(predictor, state)
            return self
        score = self._scores(labelled_batches(predictor, val, size, self.batch_fn, "val"))
        q = conformal_quantile(score, float(self.alpha))
        self._set_fitted(
            predictor, {"quantile_": q, "n_calib_": len(score), "scores_": "log_probs"}
        )
        return self

    def _kept(
        self, predictor: Any, val: Data, size: int, features: Features, kept: list[Tensor]
    ) -> Iterator[tuple[Tensor, Tensor]]:
        for outputs, y, f in joint_batches(
            predictor, val, size, self.batch_fn, features, "val", True
        ):
            assert y is not None and f is not None
            kept.append(f)
            yield outputs, y

    def _scores(self, batches: Iterable[tuple[Tensor, Tensor]]) -> Tensor:
        """The calibration scores `[n]` float64 of `(outputs [M, B, 2], y [B])` batches."""
        scores = []
        for outputs, y in batches:
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
        if not scores:
            raise ValueError("val: no calibration points (0 samples)")
        return torch.cat(scores)

    def predict_interval(
        self, X: Data, batch_size: int | None = None, batch_fn: BatchFn | None = None
    ) -> Tensor:
        """Intervals `[N, 2]` float64: (μ − q̂·w, μ + q̂·w), w = 1 or σ."""
        self._check_fitted()
        parts = []
        if self.shift == "covariate":
            size = int(self.batch_size if batch_size is None else batch_size)
            split = self.batch_fn if batch_fn is None else batch_fn
            features = Features(self.predictor_, self.features_, _mean_outputs)
            batches = joint_batches(self.predictor_, X, size, split, features, "X", False)
        else:
            batches = ((outputs, None, None) for outputs in self._batches(X, batch_size, batch_fn))
        for outputs, _, f in batches:
            mu, std = mean_and_std(outputs)
            q: Any = self.quantile_
            if f is not None:
                w = torch.from_numpy(self.domain_(f.numpy()))
                q = weighted_thresholds(
                    self.calib_scores_, self.calib_weights_, w, float(self.alpha)
                )
                q = q.to(mu.device)
            half = q * (std if self.score == "normalized" else torch.ones_like(mu))
            parts.append(torch.stack([mu - half, mu + half], dim=-1))
        return torch.cat(parts)

    def predict(self, X: Data, batch_size: int | None = None, **kwargs: Any) -> Tensor:
        """The mixture's mean `[N]` (float64)."""
        return mean_and_std(self.member_logits(X, batch_size, **kwargs))[0]

    # ---------------------------------------------------------------- persistence
    def _entry(self) -> dict[str, Any]:
        q = None if self.quantile_ is None else float(self.quantile_)
        return {"quantile": q, "n_calib": int(self.n_calib_)}

    def _tensors(self) -> dict[str, Tensor]:
        if self.shift == "covariate":
            raise TypeError(
                "save: a covariate-shift conformal predictor holds a domain classifier, which "
                "peg does not save yet; refit it from the calibration and target data"
            )
        return {}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        q, n = entry.get("quantile"), entry.get("n_calib")
        if not isinstance(q, (int, float)) or isinstance(q, bool) or not math.isfinite(q) or q < 0:
            # a score is a distance (|y − μ|, over σ): q̂ < 0 loaded and covered nothing
            raise ArchiveError(f"calibration: expected a finite quantile >= 0, got {q!r}")
        if not isinstance(n, int) or n < 1:
            raise ArchiveError(f"calibration: bad n_calib {n!r}")
        return {"quantile_": float(q), "n_calib_": n}
