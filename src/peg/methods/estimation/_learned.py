"""auto's learned combination: the base estimates read on shifted copies of the source.

When `PerformanceEstimator.fit` is given a model and images (or shifted sets of its own, as
`shifted=`), the source's validation points are read under known shifts, whose true accuracy
is known: corrupted copies of a subsample of the images (`corrupted_sets`: peg's own
corruptions, `peg.data.corruptions`, severities 1-5), each also resampled to Dirichlet class
priors (corruption + label shift), and the clean subsample resampled likewise (label shift
alone, `training_sets`). On each set the base estimators, fitted on the source points NOT in
the subsample (so every training set is out of sample, as a deployed target is), give a
feature vector (`features`); `combiner` (a ridge) learns the accuracy from it.

A learned estimate is only as good as the shifts it learned from: a target shifted unlike any
of them (another kind of corruption, a shift in p(y | x)) can be far off, which is why the
benchmark scores it only on corruption families it never saw (`FAMILIES`,
`benchmarks/label_free.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from peg.methods._predictors import scores_of
from peg.methods.estimation._shifts import resample
from peg.methods.estimation._stats import Summary
from peg.methods.estimation.estimators import ESTIMATORS, Auto, SourceFit, Target
from peg.source import is_pair
from peg.source._values import check_labels

#: CIFAR-10-C's four families (Hendrycks & Dietterich 2019), peg's extra corruptions placed by
#: kind: what a leave-one-family-out score holds out together
FAMILIES: dict[str, str] = {
    **dict.fromkeys(("gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise"), "noise"),
    **dict.fromkeys(
        ("defocus_blur", "glass_blur", "motion_blur", "zoom_blur", "gaussian_blur", "box_blur"),
        "blur",
    ),
    **dict.fromkeys(("snow", "frost", "fog", "spatter"), "weather"),
    **dict.fromkeys(
        ("contrast", "brightness", "saturate", "elastic_transform", "pixelate", "jpeg_compression"),
        "digital",
    ),
}
SEVERITIES = (1, 2, 3, 4, 5)
#: the Dirichlet concentrations of the resampled copies, taken in turn
ALPHAS = (0.3, 1.0)
LABEL_SHIFTS = 12
#: the base estimates the combiner reads (with the label-shift gap, its size and the
#: normalised entropies of EM's priors and of the predicted classes)
FEATURES = ("ac", "doc", "atc-mc", "atc-ne", "label-shift", "cot", "cott", "atc-ls", "cot-em")

ShiftedSet = tuple[str, Tensor, Tensor]  # (name, log-probabilities or logits [n, C], labels [n])


def family(name: str) -> str:
    """The corruption family of a set named "<corruption>…" ("other" when none is known)."""
    return next((f for c, f in FAMILIES.items() if name.startswith(c)), "other")


def corrupted_sets(
    predict: Callable[[Tensor], Tensor],
    X: Tensor,
    y: Tensor,
    corruptions: Iterable[str],
    seed: int,
) -> Iterator[ShiftedSet]:
    """("clean", …) then ("<corruption> <severity>", scores `[n, C]`, labels `[n]`) for each
    corruption × severity of the images `X` `[n, ch, H, W]`; `predict` maps images to scores."""
    from peg.data import corruptions as cc

    yield "clean", predict(X), y
    for name in corruptions:
        for severity in SEVERITIES:
            yield f"{name} {severity}", predict(cc.corrupt(X, name, severity, seed=seed)), y


def training_sets(sets: Iterable[ShiftedSet], seed: int) -> Iterator[ShiftedSet]:
    """Each set as given and resampled to one Dirichlet draw of class priors (the clean set
    `LABEL_SHIFTS` times): covariate shift, covariate + label shift, label shift alone."""
    rng = np.random.default_rng(seed)
    for k, (name, scores, labels) in enumerate(sets):
        yield name, scores, labels
        draws = LABEL_SHIFTS if name == "clean" else 1
        for d in range(draws):
            idx = torch.from_numpy(_resample(rng, labels.numpy(), ALPHAS[(k + d) % len(ALPHAS)]))
            yield f"{name} + label shift {d}", scores[idx], labels[idx]


def _resample(rng: np.random.Generator, y: np.ndarray, alpha: float) -> np.ndarray:
    """Indices `[n]` drawn with replacement to Dirichlet(alpha) priors over the classes of `y`."""
    classes = np.unique(y)
    return resample(rng, y, classes, rng.dirichlet(np.full(len(classes), alpha)))


def combiner(features: np.ndarray, accuracy: np.ndarray) -> Any:
    """Ridge regression (alpha 1) of the accuracies `[S]` on the standardised features
    `[S, K]`: scikit-learn's, imported on use (`import peg` loads no sklearn). `.predict(F)`
    `[S, K]` → `[S]`."""
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), Ridge(alpha=1.0)).fit(features, accuracy)


class Learned:
    """auto's learned mode: where the gate (`Auto`'s, fitted on `source`) stays shut, its
    label-shift branch mean("ac", "atc-ls"); where it opens with weight g,
    (1 − g) · that + g · `combiner`'s reading of the features (`features`), the combiner
    learned on the shifted sets that opened the gate (`fit`). `errors_`: the leave-one-
    family-out errors over those sets (what the interval's width is taken from)."""

    def __init__(self, source: SourceFit, reservoir: int, seed: int) -> None:
        self.source, self.reservoir, self.seed = source, reservoir, seed
        self.fitted = {k: ESTIMATORS[k]().fit(source) for k in FEATURES}
        self.gate = Auto().fit(source)

    def features(self, target: Target) -> np.ndarray:
        """`[len(FEATURES) + 4]`: each base estimate, the label-shift gap, its size, the
        entropies (/ log C) of EM's priors and of the predicted class shares."""
        values = [float(np.clip(e.estimate(target), 0.0, 1.0)) for e in self.fitted.values()]
        gap = target.label_shift_gap
        shares = target.summary.pred_counts / max(target.summary.n, 1)
        return np.asarray([*values, gap, abs(gap), _entropy(target.priors), _entropy(shares)])

    def _label(self, target: Target) -> float:
        return float(np.mean([self.fitted[k].estimate(target) for k in ("ac", "atc-ls")]))

    def fit(self, sets: Iterable[ShiftedSet]) -> Learned:
        """Learn from (name, calibrated log-probabilities `[n, C]`, labels `[n]`) sets."""
        rows, accuracy, families, weights, label = [], [], [], [], []
        for name, log_probs, labels in sets:
            summary = Summary(self.source.classes, self.reservoir, self.seed)
            summary.add(log_probs)
            target = Target(summary, self.source)
            rows.append(self.features(target))
            weights.append(self.gate.weight(target))
            label.append(self._label(target))
            accuracy.append(float((log_probs.argmax(-1) == labels).double().mean()))
            families.append(family(name))
        self.features_, self.accuracy_ = np.stack(rows), np.asarray(accuracy)
        self.families_, self.weights_ = np.asarray(families), np.asarray(weights)
        self.label_ = np.asarray(label)
        return self.refit(None)

    def _combiner(self, keep: np.ndarray) -> Any:
        """Fitted on the kept sets that opened the gate (all kept ones when under 3 did)."""
        rows = keep & (self.weights_ > 0)
        rows = rows if rows.sum() >= 3 else keep
        return combiner(self.features_[rows], self.accuracy_[rows])

    def _soft(self, fitted: Any, rows: np.ndarray) -> np.ndarray:
        g = self.weights_[rows]
        return (1 - g) * self.label_[rows] + g * fitted.predict(self.features_[rows])

    def refit(self, without: str | None) -> Learned:
        """The combiner refitted on the sets of every family but `without` (None: all): a
        leave-one-family-out score's learner never sees the held-out family. Returns self."""
        keep = self.families_ != without
        self.combiner = self._combiner(keep)
        errors = []
        for held in set(self.families_[keep]) - {"other"}:  # out of family: the width
            rows = keep & (self.families_ == held)
            predicted = self._soft(self._combiner(keep & ~rows), rows)
            errors.extend(predicted - self.accuracy_[rows])
        fallback = self._soft(self.combiner, keep) - self.accuracy_[keep]
        self.errors_ = np.asarray(errors) if errors else fallback
        return self

    def estimate(self, summary: Summary) -> float:
        target = Target(summary, self.source)
        g, label = self.gate.weight(target), self._label(target)
        if g == 0:  # the transports are computed only when the combiner counts
            return label
        value = (1 - g) * label + g * float(self.combiner.predict(self.features(target)[None])[0])
        return float(np.clip(value, 0.0, 1.0))


def _entropy(p: np.ndarray) -> float:
    """The entropy of a distribution `[C]` divided by log C, in [0, 1]."""
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-12, 1.0)
    return float(-(p * np.log(p)).sum() / np.log(max(len(p), 2)))


# ---------------------------------------------------------------- what the learned mode reads
def images_of(val: Any) -> Tensor | None:
    """val's inputs when they are images `[N, 1 or 3, H, W]` (a pair of tensors), else None."""
    X = val[0] if is_pair(val) else None
    if isinstance(X, Tensor) and X.ndim == 4 and X.shape[1] in (1, 3) and X.is_floating_point():
        return X
    return None


def check_range(images: Tensor | None) -> None:
    """The corruptions take images in [0, 1]: one clear error before any long work."""
    if images is None or len(images) == 0:
        return
    lo, hi = float(images.min()), float(images.max())
    if not (lo >= 0.0 and hi <= 1.0):  # NaN fails too
        raise ValueError(
            f"val: shift_points > 0 corrupts val's images, which must be in [0, 1] "
            f"(peg.data.corruptions), got range [{lo}, {hi}]; pass shift_points=0 or shifted="
        )


def corruptions(channels: int) -> tuple[str, ...]:
    from peg.data import corruptions as cc

    return cc.applicable(channels)


def checked_sets(shifted: Iterable, classes: int) -> list[tuple[str, Tensor, Tensor]]:
    """`shifted` as (name, scores `[n, C]` float64 log p, labels `[n]`) triples, or one
    ValueError naming it."""
    expected = f"(name, logits [n, {classes}], labels [n]) triples"
    sets = []
    for i, item in enumerate(shifted):
        if not (isinstance(item, (tuple, list)) and len(item) == 3 and isinstance(item[0], str)):
            raise ValueError(f"shifted: expected {expected}, item {i} is not one")
        name, logits, labels = item
        logits = torch.as_tensor(logits)
        if logits.ndim != 2 or logits.shape[1] != classes or len(logits) == 0:
            raise ValueError(
                f"shifted: expected {expected}, item {i} ({name!r}) has logits of shape "
                f"{tuple(logits.shape)}"
            )
        scores = scores_of(logits[None], "log_probs", f"shifted[{i}]").cpu()
        y = check_labels(torch.as_tensor(labels), *scores.shape, name=f"shifted[{i}] labels")
        sets.append((name, scores, y.cpu()))
    if not sets:
        raise ValueError(f"shifted: expected {expected}, got none")
    return sets
