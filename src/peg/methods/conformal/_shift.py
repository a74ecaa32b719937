"""Weighted split conformal prediction under shift: what `ConformalClassifier(shift=...)` and
`ConformalRegressor(shift="covariate")` are made of.

Covariate shift (Tibshirani, Barber, Candès & Ramdas 2019): with w(x) = dP_target/dP_source(x),
the threshold for a test point x is the level-(1 − α) quantile of Σᵢ pᵢ(x) δ_{sᵢ} +
p_{n+1}(x) δ_{+∞}, pᵢ(x) = w(xᵢ) / (Σⱼ w(xⱼ) + w(x)), p_{n+1}(x) = w(x) / (...): the smallest
calibration score sᵢ whose cumulative weight reaches (1 − α)(W + w(x)), or +∞ (the full set, the
whole line) when none does. w is estimated by a domain classifier (`DomainWeights`, logistic
regression on standardised features, `peg._features`, wider ones reduced to their first 32
principal components) cross-fitted on calibration vs target points:
w(x) = (n / m) · P(target | x) / P(source | x), each calibration point's weight from the
classifiers that did not see it.

Label shift (Podkopaev & Ramdas 2021): w(y) = q(y) / p(y) (`peg.LabelShift`'s weights), so the
threshold depends on the candidate class only: one quantile per class `[C]`, with the
calibration points weighted by w(yᵢ) and the test point's mass w(c).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from peg._features import FEATURES, Features, check_features, check_target_shape
from peg.methods import _constraints as checks
from peg.methods._predictors import member_logits_of
from peg.methods.calibration.label_shift import LabelShift
from peg.methods.conformal._split import class_scores, labelled_batches, min_points
from peg.source import Data, Source
from peg.source._values import check_finite
from peg.source.batches import BatchFn

MIN_TARGET = 50  # target points the domain classifier needs at the least
SEPARABLE = 0.99  # `max_auroc`: out-of-fold AUROC from which the weights are taken as unbounded
HEAVY = 0.2  # `warn_ess`: a warning when the effective sample size is below n times this
CONCENTRATED = 20  # below n / this, the warning says "very heavy"
NOISE = 0.6  # an AUROC below this: the classifier does not tell the domains apart
COMPONENTS = 32  # wider features are reduced to their first principal components

# the cut-offs of `DomainWeights.check`, options of both conformal predictors
# the `features=` of the conformal predictors and `OODDetector`: what a domain classifier or a
# detector reads
FEATURES_OPTION = checks.described(check_features, f"one of {list(FEATURES)}")
WEIGHT_CUTOFFS: dict[str, checks.Check] = {
    "max_auroc": checks.interval(0.5, 1, "an AUROC", closed="(]"),
    "min_ess": checks.number(allow_zero=True, optional=True),
    "warn_ess": checks.interval(0, 1, "a fraction of the calibration points", closed="[]"),
}


def joint_batches(
    predictor: Any,
    data: Data,
    batch_size: int,
    batch_fn: BatchFn | None,
    features: Features | None,
    name: str,
    labelled: bool,
) -> Iterator[tuple[Tensor, Tensor | None, Tensor | None]]:
    """`(member logits [M, B, C], labels [B] or None, features [B, D] or None)` per batch of
    `data`, one pass (the inputs and their features from the same batch, so a shuffled loader
    keeps them aligned)."""
    for inputs, y in Source(data, batch_fn, name).batches(batch_size, need_labels=labelled):
        check_finite(inputs, name)
        logits = member_logits_of(predictor, inputs, batch_size)
        if logits.ndim != 3:
            raise ValueError(f"predictor: expected member logits [M, B, C] on {name}")
        _check_outputs(logits.transpose(0, 1), name, "outputs")
        feats = None if features is None else features(inputs, logits).cpu()
        if feats is not None:
            _check_outputs(feats, name, f"{features.kind_} features")
        yield logits, y, feats


def _check_outputs(t: Tensor, name: str, what: str) -> None:
    """A ValueError naming `name` where the model's `what` `[B, ...]` are not finite (its
    inputs are: the model overflows on them), before a covariance or a classifier fails on
    them with a linear-algebra error."""
    bad = ~torch.isfinite(t).flatten(1).all(1)
    if bad.any():
        raise ValueError(
            f"{name}: the model's {what} are NaN or inf for {int(bad.sum())} of {len(t)} "
            "samples (their inputs are finite: the model overflows on them)"
        )


class DomainWeights:
    """Likelihood ratios w(x) from a domain classifier cross-fitted on calibration (source) vs
    target features (see the module doc); `calib_` `[n]` the calibration points' weights
    (out-of-fold), `auroc_` the out-of-fold AUROC of the classifier, `n_eff_` the calibration
    weights' effective sample size (Σw)² / Σw²."""

    def __init__(self, source: np.ndarray, target: np.ndarray, n_folds: int, seed: int) -> None:
        from sklearn.decomposition import PCA
        from sklearn.linear_model import LogisticRegression
        from sklearn.metrics import roc_auc_score
        from sklearn.model_selection import StratifiedKFold
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        n, m = len(source), len(target)
        if target.shape[1:] != source.shape[1:]:
            raise ValueError(
                f"target: its features have shape {target.shape[1:]}, the calibration points' "
                f"{source.shape[1:]}"
            )
        if m < max(MIN_TARGET, n_folds):
            raise ValueError(
                f"target: {m} points are too few for the domain classifier (at least "
                f"{max(MIN_TARGET, n_folds)})"
            )
        x = np.concatenate([source, target])
        d = np.r_[np.zeros(n), np.ones(m)]
        logit = np.empty(n + m)
        self.models = []
        folds = StratifiedKFold(n_folds, shuffle=True, random_state=seed)
        for train, held in folds.split(x, d):
            steps: list[Any] = [StandardScaler()]
            if x.shape[1] > COMPONENTS:  # 1568 conv features on 4k points: LR over-fits
                steps.append(PCA(COMPONENTS, random_state=seed))
            clf = make_pipeline(*steps, LogisticRegression(max_iter=2000))
            clf.fit(x[train], d[train])
            logit[held] = clf.decision_function(x[held])
            self.models.append(clf)
        self.log_ratio = math.log(n / m)
        self.calib_ = np.exp(np.clip(logit[:n] + self.log_ratio, -700, 700))
        self.auroc_ = float(roc_auc_score(d, logit))
        self.n_eff_ = float(self.calib_.sum() ** 2 / np.square(self.calib_).sum())
        self.dims = x.shape[1]

    def __call__(self, features: np.ndarray) -> np.ndarray:
        """w(x) `[B]` of new points: the fold classifiers' log-odds averaged."""
        logit = np.mean([clf.decision_function(features) for clf in self.models], axis=0)
        return np.exp(np.clip(logit + self.log_ratio, -700, 700))

    def check(self, alpha: float, cp: Any = None, stacklevel: int = 2) -> None:
        """A ValueError where the weights are unbounded: the classifier separates the domains
        (out-of-fold AUROC >= `cp.max_auroc`, 0.99: no overlap, no guarantee) or the weights'
        effective sample size is below `cp.min_ess` (None: 1/α − 1, the fewest points a split
        conformal quantile needs: fewer, and the sets are mostly full); a warning below
        `cp.warn_ess` · n (0.2). Between these the weights are heavy but bounded and weighted
        conformal prediction restores coverage (tests/methods/test_conformal_shift_cutoffs.py:
        ≈ 0.9 at α = 0.1 with an effective sample size of 20-160 of 1,000)."""
        n, a, e = len(self.calib_), self.auroc_, self.n_eff_
        max_auroc = float(getattr(cp, "max_auroc", SEPARABLE))
        floor = getattr(cp, "min_ess", None)
        floor, why = (min_points(alpha), "1/alpha - 1") if floor is None else (floor, "min_ess")
        if a >= max_auroc:
            raise ValueError(
                f"target: the domain classifier separates calibration and target points "
                f"(out-of-fold AUROC {a:.3f} >= max_auroc={max_auroc:g}; effective sample "
                f"size of the weights {e:.1f} of {n}): the likelihood ratios are unbounded where "
                "the domains do not overlap, and weighted conformal prediction would return "
                "meaningless (mostly full) sets; this shift is outside what it can correct"
            )
        if e < float(floor):
            raise ValueError(
                f"target: the weights concentrate on a few calibration points (effective sample "
                f"size {e:.1f} of {n}, below {why} = {float(floor):g}): {self._cause()}; "
                "weighted conformal prediction would return mostly full sets"
            )
        if e < float(getattr(cp, "warn_ess", HEAVY)) * n:
            very = "very " if e < n / CONCENTRATED else ""
            warnings.warn(
                f"target: {very}heavy weights (effective sample size {e:.0f} of {n}, domain "
                f"AUROC {a:.3f}): the sets will be wide and vary from one calibration set to "
                f"another (coverage holds on average); {self._cause()}",
                stacklevel=stacklevel,
            )

    def _cause(self) -> str:
        """Why the weights are heavy: a shift the classifier sees, or noise it fits."""
        if self.auroc_ < NOISE:
            return (
                f"the domain classifier does not tell the domains apart (out-of-fold AUROC "
                f"{self.auroc_:.3f}), so these weights are noise it fits in {self.dims} features "
                f"of {len(self.calib_)} points, not a shift; pass more calibration and target "
                "points or fewer features (features='logits'), or use shift=None if the data "
                "are exchangeable"
            )
        return (
            f"the domains differ (out-of-fold AUROC {self.auroc_:.3f}) and a few calibration "
            "points carry most of the weight; more calibration points like the target's help"
        )


def weighted_thresholds(
    sorted_scores: Tensor, cum_weights: Tensor, w_test: Tensor, alpha: float
) -> Tensor:
    """Per-test-point thresholds `[B]` float64: the smallest calibration score whose cumulative
    weight reaches (1 − α)(W + w_test), +∞ where none does. `sorted_scores` `[n]` ascending,
    `cum_weights` `[n]` the cumulative sum of their weights, `w_test` `[B]`."""
    total = cum_weights[-1]
    need = (1 - alpha) * (total + w_test.double()) * (1 - 1e-12)  # ulp slack: unweighted = rank
    k = torch.searchsorted(cum_weights, need)
    inf = torch.tensor(math.inf, dtype=torch.float64)
    padded = torch.cat([sorted_scores.double(), inf[None]])
    return padded[k.clamp_max(len(sorted_scores))]


def sorted_weighted(scores: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """(scores sorted ascending, the cumulative sum of their weights), both `[n]` float64."""
    order = scores.argsort(stable=True)
    return scores[order].double(), weights.double()[order].cumsum(0)


def label_thresholds(scores: Tensor, y: Tensor, w_class: Tensor, alpha: float) -> Tensor:
    """Podkopaev & Ramdas's per-class thresholds `[C]`: calibration point i weighted by
    w(yᵢ), the test point's mass w(c) for candidate class c."""
    s, cum = sorted_weighted(scores, w_class.double()[y])
    return weighted_thresholds(s, cum, w_class.double(), alpha)


# ------------------------------------------------------------ ConformalClassifier(shift=...)
SHIFTS = (None, "covariate", "label")


def check_target(shift: str | None, target: Data | None, val: Data) -> None:
    """A clear error for `target` given without a shift, missing with one, or in memory with
    other features than `val`'s."""
    check_target_shape(val, target)
    if shift is None and target is not None:
        raise ValueError("target: only used with shift='covariate' or shift='label'")
    if shift is not None and target is None:
        raise ValueError(f"target: shift={shift!r} needs unlabelled inputs from the deployment")
    if isinstance(target, (Tensor, np.ndarray)):  # a loader's batches: checked as they are read
        if target.ndim == 0 or len(target) == 0:
            raise ValueError(f"target: no inputs (shape {tuple(target.shape)})")
        check_finite(torch.as_tensor(target), "target")


def fit_shifted(cp: Any, predictor: Any, val: Data, target: Data) -> dict[str, Any]:
    """The fitted state of `ConformalClassifier` `cp` with `shift` set (see the module doc)."""
    alpha, size = float(cp.alpha), int(cp.batch_size)
    if cp.shift == "label":
        batches = labelled_batches(predictor, val, size, cp.batch_fn, "val")
        score, y, classes = cp.label_scores(batches)
        shift = LabelShift(batch_size=size, batch_fn=cp.batch_fn)
        shift.fit(predictor, val, target=target)
        q = label_thresholds(score, y, shift.weights_.double(), alpha)
        return {
            "quantile_": q,
            "n_calib_": len(score),
            "n_classes_": classes,
            "priors_": shift.priors_,
            "weights_": shift.weights_,
            "scores_": "log_probs",
        }
    features = Features(predictor, cp.features)
    kept: list[Tensor] = []

    def labelled() -> Iterator[tuple[Tensor, Tensor]]:
        for logits, y, f in joint_batches(predictor, val, size, cp.batch_fn, features, "val", True):
            assert y is not None and f is not None
            kept.append(f)
            yield logits, y

    score, _, classes = cp.label_scores(labelled())
    state = fit_weights(predictor, target, score, torch.cat(kept), features, cp, stacklevel=4)
    return state | {"quantile_": None, "n_classes_": classes}


def fit_weights(
    predictor: Any,
    target: Data,
    score: Tensor,
    source: Tensor,
    features: Features,
    cp: Any,
    stacklevel: int = 3,
) -> dict[str, Any]:
    """The covariate-shift state shared by the classifier and the regressor: the domain
    classifier fitted on the calibration features `source` `[n, D]` and the target's, checked,
    and the calibration scores `[n]` sorted with their cumulative weights."""
    size = int(cp.batch_size)
    unlabelled = joint_batches(predictor, target, size, cp.batch_fn, features, "target", False)
    read = [f.numpy() for _, _, f in unlabelled if f is not None]
    if not read:
        raise ValueError(f"target: no inputs (0 samples); the domain classifier needs {MIN_TARGET}")
    target_features = np.concatenate(read)
    domain = DomainWeights(
        source.numpy(), target_features, int(cp.n_folds), int(getattr(cp, "seed", 0))
    )
    domain.check(float(cp.alpha), cp, stacklevel + 1)  # a warning names the user's fit call
    s, cum = sorted_weighted(score, torch.from_numpy(domain.calib_))
    return {
        "quantile_": None,
        "n_calib_": len(score),
        "calib_scores_": s,
        "calib_weights_": cum,
        "domain_": domain,
        "features_": features.kind_,
        "domain_auroc_": domain.auroc_,
        "n_eff_": domain.n_eff_,
        "n_target_": len(target_features),
        "scores_": "log_probs",
    }


def covariate_sets(cp: Any, X: Data, batch_size: int | None, batch_fn: BatchFn | None) -> Tensor:
    """`cp.predict_set(X)` under covariate shift: each row's threshold from its weight."""
    cp._check_fitted()
    size = int(cp.batch_size if batch_size is None else batch_size)
    split = cp.batch_fn if batch_fn is None else batch_fn
    features = Features(cp.predictor_, cp.features_)
    u, alpha, out, start = cp._stream(1), float(cp.alpha), [], 0
    for logits, _, f in joint_batches(cp.predictor_, X, size, split, features, "X", False):
        assert f is not None
        if logits.shape[-1] != cp.n_classes_:
            raise ValueError(
                f"X: the predictor gives {logits.shape[-1]} classes, fitted on {cp.n_classes_}"
            )
        probs, draws = cp._probs_and_draws(logits, u, "X", start)
        start += logits.shape[1]
        w = torch.from_numpy(cp.domain_(f.numpy()))
        q = weighted_thresholds(cp.calib_scores_, cp.calib_weights_, w, alpha)
        every = class_scores(probs, cp.score, int(cp.k_reg), float(cp.lam), draws)
        out.append(every <= q.to(every.device)[:, None])
    return torch.cat(out)
