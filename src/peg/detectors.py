"""OOD detectors that read features: Mahalanobis distance to the nearest class mean under a
tied covariance (Lee et al. 2018) and the distance to the k-th nearest validation point on
normalised features (Sun et al. 2022), fitted on (labelled) validation data.

`OODDetector(score="mahalanobis" | "knn").fit(predictor, val)` reads `val` once through the
predictor's model (`peg._features`: the penultimate features by default) and keeps the class
means `[C, D]` and the precision `[D, D]` (Mahalanobis) or the normalised features `[N, D]`
(k-NN, the bank); `ood_score(X)` `[N]` float64 follows `peg.metrics.ood`'s sign: higher = more
likely OOD, so its output goes straight into `peg.metrics.ood.auroc(in, out)`.

What is left out of the papers: Lee et al.'s input preprocessing and their ensemble of layers
(one layer here, the penultimate), Sun et al.'s contrastive training (any model here).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from peg._features import Features
from peg.methods import _constraints as checks
from peg.methods._predictors import check_predictor
from peg.methods.base import Method, store_arguments
from peg.methods.conformal._shift import FEATURES_OPTION, joint_batches
from peg.source import Data
from peg.source._values import check_labels
from peg.source.batches import BatchFn, check_batch_fn

DETECTOR_SCORES = ("mahalanobis", "knn")
AUTO_LEAST = 1e-6  # ridge="auto": the floor at least this much of the mean variance


def _ridge(value: Any, name: str) -> None:
    """The value 'auto' or a finite number >= 0."""
    if not (isinstance(value, str) and value == "auto"):
        checks.number(allow_zero=True)(value, name)


class OODDetector(Method):
    """An OOD detector on a predictor's features, fitted on validation data.

    Args:
        score: "mahalanobis" (min over classes of the Mahalanobis distance to the class mean,
            shared covariance: needs labels) or "knn" (Euclidean distance to the k-th nearest
            validation point, features L2-normalised; labels unused).
        k: the neighbour whose distance is the k-NN score (at most the validation points).
        features: "penultimate" (the model's trunk; the logits, with a warning, for a model
            without one), "logits" (log p̄) or "inputs".
        ridge: added to the covariance's diagonal, times its mean variance μ (trace / D),
            before inverting. "auto" (the default) chooses it from the data: the level of
            Ledoit and Wolf's shrinkage (2004, "A well-conditioned estimator for
            large-dimensional covariance matrices", J. Multivariate Anal.; scikit-learn's
            `LedoitWolf`: Σ̂ = (1 − δ) S + δ μ I, their δ estimated from the data), δ / (1 − δ)
            of μ (at least 1e-6), as a floor under the covariance's eigenvalues: the directions
            `val` estimates well are kept as they are, those below the floor (dead ReLU units,
            rarely active ones, too few points) raised to it. Why: 1e-6 of μ, the old default,
            let a test point that moves a unit dead on `val` score ~10⁶ times its offset² (a
            digits MLP's in-distribution scores reached 5,700, with a warning on every model
            with a dead unit); Ledoit-Wolf's own shrinkage (the ridge δ / (1 − δ) everywhere)
            cost up to 1 point of AUROC on a Fashion-MNIST MLP's near-OOD sets, the floor none.
        batch_size, batch_fn: how the predictor reads data (`peg.source.batches`).

    After `fit(predictor, val)`: `means_` `[C, D]`, `precision_` `[D, D]` and `ridge_` (the ridge
    used, times the mean variance) (Mahalanobis) or `bank_` `[N, D]` (k-NN), `features_` (what
    was read), `n_fit_`; `ood_score(X)` `[N]`.
    """

    def __init__(
        self,
        *,
        score: str = "mahalanobis",
        k: int = 50,
        features: str = "penultimate",
        ridge: float | str = "auto",
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

    fitted_attribute: ClassVar[str] = "predictor_"
    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "score": checks.one_of(*DETECTOR_SCORES),
        "k": checks.positive_int(),
        "features": FEATURES_OPTION,
        "ridge": checks.described(_ridge, "'auto' or a finite number >= 0"),
        "batch_size": checks.positive_int(),
        "batch_fn": checks.batch_fn,
    }

    def fit(self, predictor: Any, val: Data | None = None) -> OODDetector:
        """Fit on validation data `val` ((X, y), a Dataset or a DataLoader; k-NN also takes
        inputs without labels); returns self."""
        self._check_params()
        check_predictor(predictor)
        if val is None:
            raise ValueError("val: an OOD detector is fitted on validation data")
        labelled = self.score == "mahalanobis"
        features = Features(predictor, self.features)
        size, split = int(self.batch_size), check_batch_fn(self.batch_fn)
        feats, labels, classes = [], [], 0
        for logits, y, f in joint_batches(predictor, val, size, split, features, "val", labelled):
            assert f is not None
            classes = logits.shape[-1]
            feats.append(f)
            if y is not None:
                labels.append(check_labels(y, len(f), classes, "val labels").cpu())
        if not feats:
            raise ValueError("val: no points (0 samples)")
        f = torch.cat(feats)
        state: dict[str, Any] = {"features_": features.kind_, "n_fit_": len(f)}
        if labelled:
            state |= _gaussian(f, torch.cat(labels), classes, self.ridge)
        else:
            if int(self.k) > len(f):
                raise ValueError(f"k: {self.k} neighbours, but val has only {len(f)} points")
            state["bank_"] = _normalised(f)
        self.__dict__.update(state)
        self.predictor_ = predictor  # last: `fitted_attribute`
        return self

    @torch.no_grad()
    def ood_score(self, X: Data, batch_size: int | None = None) -> Tensor:
        """OOD scores `[N]` float64 of inputs `X` (higher = more likely OOD)."""
        self._check_fitted("ood_score")
        size = int(self.batch_size if batch_size is None else batch_size)
        features = Features(self.predictor_, self.features_)
        out = []
        for _, _, f in joint_batches(self.predictor_, X, size, self.batch_fn, features, "X", False):
            assert f is not None
            out.append(self._score(f))
        return torch.cat(out)

    def _score(self, f: Tensor) -> Tensor:
        if self.score == "knn":
            d = torch.cdist(_normalised(f), self.bank_)
            return d.topk(int(self.k), dim=1, largest=False).values[:, -1]
        # (f − μ)ᵀ P (f − μ) expanded: [B, C] without a [B, C, D] difference
        fp, mp = f @ self.precision_, self.means_ @ self.precision_
        d = (fp * f).sum(1, keepdim=True) - 2 * fp @ self.means_.T + (mp * self.means_).sum(1)
        return d.min(1).values


def _normalised(f: Tensor) -> Tensor:
    return f / f.norm(dim=1, keepdim=True).clamp_min(1e-12)


def _gaussian(f: Tensor, y: Tensor, classes: int, ridge: float | str) -> dict[str, Any]:
    """Class means `[C, D]`, the precision of the tied covariance `[D, D]` (Lee et al.:
    Σ = (1/N) Σᵢ (fᵢ − μ_yᵢ)(fᵢ − μ_yᵢ)ᵀ, plus the ridge) and the ridge used; the means of
    classes absent from `val` left out."""
    counts = torch.bincount(y, minlength=classes)
    present = torch.nonzero(counts > 0)[:, 0]
    sums = torch.zeros(classes, f.shape[1], dtype=f.dtype).index_add_(0, y, f)
    means = sums / counts.clamp_min(1)[:, None]
    centred = f - means[y]
    cov = centred.T @ centred / len(f)
    auto = isinstance(ridge, str)
    used = max(ledoit_wolf_ridge(centred), AUTO_LEAST) if auto else float(ridge)
    _warn_degenerate(cov, len(f), len(present), used, auto)
    mean = float(cov.diagonal().mean().clamp_min(1e-12))
    if auto:  # the eigenvalues below the floor raised to it, the others kept
        eig, vec = torch.linalg.eigh(cov.double())
        precision = ((vec / eig.clamp_min(used * mean)) @ vec.T).to(cov)
    else:
        cov = cov + used * mean * torch.eye(len(cov)).to(cov)
        precision = torch.linalg.pinv(cov, hermitian=True)
    return {"means_": means[present], "precision_": precision, "ridge_": used}


def ledoit_wolf_ridge(centred: Tensor) -> float:
    """δ / (1 − δ), δ Ledoit and Wolf's shrinkage of the covariance of `centred` `[N, D]`
    (rows of mean zero) towards μ I, μ its mean variance: scikit-learn's
    `ledoit_wolf_shrinkage(X, assume_centered=True)`, in float64 (the class-centred features
    are taken as centred). δ is capped at 0.999 (at most 999 times the mean variance)."""
    x = centred.double()
    n, d = x.shape
    squares = x * x
    variances = squares.sum(0) / n
    mu = float(variances.sum()) / d
    s = x.T @ x / n
    frobenius = float((s * s).sum())  # ‖S‖²_F
    beta = float((squares.sum(1) ** 2).sum())  # Σ_k ‖x_k‖⁴ = Σ_ij Σ_k x_ki² x_kj²
    beta = (beta / n - frobenius) / (d * n)
    delta = (frobenius - 2 * mu * float(variances.sum()) + d * mu * mu) / d  # ‖S − μI‖²_F / D
    shrinkage = 0.0 if delta <= 0 else min(max(beta, 0.0), delta) / delta
    shrinkage = min(shrinkage, 0.999)
    return shrinkage / (1 - shrinkage)


def _warn_degenerate(cov: Tensor, n: int, classes: int, ridge: float, auto: bool) -> None:
    """Warn where the tied covariance `[D, D]` is degenerate. With `ridge="auto"`: only where
    there are fewer class-centred points than features (n − C < D: 4 points in 64 dimensions);
    the directions dead or constant features leave get the data's own floor (a feature constant
    at test time too changes no score; one that moves there scores its offset against the
    floor, as an unusual input should). With a ridge given: wherever the covariance is
    singular, those features included (the ridge given may be too small for them). In the
    directions val does not span only the ridge (the floor) is left, so a test point off them
    scores up to ~1/ridge times its offset² over the mean variance (≈ 1e8 for 4 points in 64
    dimensions at a ridge of 1e-6)."""
    dims = len(cov)
    why = []
    if n - classes < dims:
        why.append(f"{n} points in {classes} classes span at most {max(n - classes, 0)}")
    if auto:
        if not why:
            return
        rank = f"at most {max(n - classes, 0)}"
    else:
        variances = cov.diagonal()
        constant = int((variances <= 1e-12 * float(variances.mean().clamp_min(1e-300))).sum())
        eig = torch.linalg.eigvalsh(cov)
        found = int((eig > dims * 1e-12 * float(eig[-1].clamp_min(1e-300))).sum())
        if found == dims:
            return
        rank = str(found)
        if constant:
            why.append(f"{constant} features are constant on val (zero ones included)")
    kind = "floor, Ledoit-Wolf's level" if auto else "ridge"
    warnings.warn(
        f"val: the features' tied covariance has rank {rank} of {dims} ("
        + ("; ".join(why) or "features that are combinations of others")
        + f"): in the other directions only the {kind} ({ridge:.3g} of the mean variance) is "
        "left, so a test point off them scores up to ~1/ridge times its offset squared: the "
        "score measures that offset, not a distance to the classes; pass more validation "
        "points than features (n > D + C)"
        + ("" if auto else ", raise ridge (or 'auto')")
        + ", or use score='knn'",
        stacklevel=4,
    )
