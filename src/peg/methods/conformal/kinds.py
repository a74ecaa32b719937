"""Conformal prediction for the other kinds of output, fitted on probabilities (a calibrator's
`predict_proba` of that kind, or any model's): `ConformalBinary` (sets {0}, {1} or {0, 1} from
P(y = 1)), `ConformalMultilabel` (label sets of expected recall >= 1 - α, by conformal risk
control of the false-negative rate) and `ConformalDense` (a set per position). The pure
functions they are made of are `_kinds.py`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from torch import Tensor

from peg.errors import NotFittedError
from peg.methods import _constraints as checks
from peg.methods.base import Params, store_arguments
from peg.methods.conformal._kinds import (
    BINARY_SCORES,
    binary_quantile,
    binary_sets,
    dense_quantile,
    dense_sets,
    fnr_threshold,
    multilabel_sets,
)
from peg.methods.conformal._split import ALPHA
from peg.metrics.binary import IGNORE_INDEX
from peg.source._kinds import read_kind
from peg.source._namespace import like_input
from peg.source._values import as_tensor
from peg.source.batches import as_array

FOR_KIND = {
    "binary": "ConformalBinary",
    "multilabel": "ConformalMultilabel",
    "dense": "ConformalDense",
}


def refuse_other_kinds(logits: Any, labels: Any) -> None:
    """A ValueError naming the conformal predictor of their kind for saved logits that are not
    multiclass (`read_kind`: binary scores, a multi-label head, dense maps), which
    `peg.ConformalClassifier` cannot make sets of; nothing for anything else (multiclass logits
    `[N, C]` with labels `[N]`, models, data its own checks refuse)."""
    z, y = as_array(logits), as_array(labels)
    arrays = (Tensor, np.ndarray)
    if not isinstance(z, arrays) or not isinstance(y, arrays) or y.dtype == object:
        return
    if isinstance(y, np.ndarray) and y.dtype.kind in "US":
        return
    shape = tuple(z.shape)
    if len(shape) == 2 and shape[1] >= 2 and y.ndim == 1:
        return
    try:
        kind = read_kind(shape, y)
    except ValueError:
        return  # the multiclass path says what is wrong
    if kind.kind != "multiclass":
        raise ValueError(
            f"predictor: {kind.describe()} are not multiclass logits [N, C], whose classes "
            f"ConformalClassifier makes sets of; for this kind use "
            f"peg.methods.conformal.kinds.{FOR_KIND[kind.kind]} on their probabilities (a "
            "calibrator's predict_proba)"
        )


def _check_ignore_index(value: Any, name: str = "ignore_index") -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name}: expected an integer label, got {value!r}")
    return value


IGNORE = checks.described(_check_ignore_index, "an integer label (default -100)")


class _FittedOnProbabilities(Params):
    """What the three share: fitted once `n_calib_` is set (last, by `fit`); `_kept` counts
    the labels that are not `ignore_index`."""

    def __sklearn_is_fitted__(self) -> bool:
        return "n_calib_" in self.__dict__

    def _check_fitted(self) -> None:
        if not self.__sklearn_is_fitted__():
            raise NotFittedError(f"{type(self).__name__}: call fit(p, y) before predict_set")

    def _kept(self, y: Any) -> int:
        return int((as_tensor(y, "y") != self.ignore_index).sum())


class ConformalBinary(_FittedOnProbabilities):
    """Split conformal prediction sets for a binary scorer: from P(y = 1) `p` `[N]`, the sets
    {0}, {1} or {0, 1} (`[N, 2]` bool, column c for class c) that hold the label with
    probability >= 1 − α over exchangeable data: the multi-class sets (`peg.ConformalClassifier`'s
    scores and quantile) on the two columns (1 − p, p).

    Args:
        alpha: the miscoverage level in (0, 1).
        score: "lac" (1 − P(y)) or "aps" (the mass of the classes ranked up to y).
        ignore_index: labels left out of the calibration.

    After `fit(p, y)`: `quantile_` (q̂), `n_calib_`; `predict_set(p) -> bool [N, 2]`.

    Examples:
        >>> import torch
        >>> from peg.methods.conformal.kinds import ConformalBinary
        >>> p = torch.rand(500, generator=torch.Generator().manual_seed(0))
        >>> y = (torch.rand(500, generator=torch.Generator().manual_seed(1)) < p).long()
        >>> sets = ConformalBinary(alpha=0.1).fit(p[:400], y[:400]).predict_set(p[400:])
        >>> sets.shape
        torch.Size([100, 2])
    """

    def __init__(
        self, *, alpha: float = 0.1, score: str = "lac", ignore_index: int = IGNORE_INDEX
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "alpha": ALPHA,
        "score": checks.one_of(*BINARY_SCORES),
        "ignore_index": IGNORE,
    }

    def fit(self, p: Any, y: Any) -> ConformalBinary:
        """Fit q̂ on calibration probabilities P(y = 1) `p` `[n]` and labels `y` `[n]` (0/1);
        returns self."""
        self._check_params()
        self.quantile_ = binary_quantile(p, y, self.alpha, self.score, self.ignore_index)
        self.n_calib_ = self._kept(y)
        return self

    def predict_set(self, p: Any) -> Any:
        """Prediction sets `[N, 2]` bool of P(y = 1) `p` `[N]` (NumPy for NumPy input)."""
        self._check_fitted()
        return like_input(binary_sets(p, self.quantile_, self.score), p)


class ConformalMultilabel(_FittedOnProbabilities):
    """Label sets for a multi-label head by conformal risk control of the false-negative rate
    (Angelopoulos, Bates, Fisch, Lei & Schuster 2022, "Conformal Risk Control"): the sets
    {k : p_k >= 1 − λ̂}, λ̂ = inf{λ : (n/(n+1)) R̂_n(λ) + 1/(n+1) <= α}, R̂_n the mean
    false-negative rate of the calibration points' sets, so that a new point's expected recall
    (the fraction of its labels in its set) is >= 1 − α over exchangeable data.

    Args:
        alpha: the false-negative rate to control, in (0, 1); needs n >= 1/α − 1 points.
        ignore_index: label entries left out (neither a label nor a miss).

    After `fit(p, y)`: `threshold_` (t̂ = 1 − λ̂: label k is in where p_k >= t̂), `lambda_`
    (λ̂), `n_calib_`; `predict_set(p) -> bool [N, K]`.
    """

    def __init__(self, *, alpha: float = 0.1, ignore_index: int = IGNORE_INDEX) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "alpha": ALPHA,
        "ignore_index": IGNORE,
    }

    def fit(self, p: Any, y: Any) -> ConformalMultilabel:
        """Fit λ̂ on calibration probabilities `p` `[n, K]` and multi-hot labels `y` `[n, K]`;
        returns self."""
        self._check_params()
        self.threshold_ = fnr_threshold(p, y, self.alpha, self.ignore_index)
        self.lambda_ = 1.0 - self.threshold_
        self.n_calib_ = int(as_tensor(y, "y").shape[0])
        return self

    def predict_set(self, p: Any) -> Any:
        """The labels of each point, `[N, K]` bool, of probabilities `p` `[N, K]`."""
        self._check_fitted()
        return like_input(multilabel_sets(p, self.threshold_), p)


class ConformalDense(_FittedOnProbabilities):
    """A split conformal set per position for dense predictions (segmentation maps, token
    sequences): probabilities `[B, C, *S]` (softmax over dim 1), labels `[B, *S]`; LAC,
    {c : 1 − p_c <= q̂}, q̂ from the positions not ignored. The coverage >= 1 − α holds over
    positions of exchangeable images, on average (the positions of one image are not
    exchangeable with each other); `fit` keeps one score per position.

    Args:
        alpha: the miscoverage level in (0, 1).
        ignore_index: the label of positions left out (255 in Cityscapes and VOC).

    After `fit(probs, y)`: `quantile_`, `n_calib_` (positions); `predict_set(probs) -> bool
    [B, C, *S]`.
    """

    def __init__(self, *, alpha: float = 0.1, ignore_index: int = IGNORE_INDEX) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "alpha": ALPHA,
        "ignore_index": IGNORE,
    }

    def fit(self, probs: Any, y: Any) -> ConformalDense:
        """Fit q̂ on calibration probabilities `[B, C, *S]` and labels `[B, *S]`; returns
        self."""
        self._check_params()
        self.quantile_ = dense_quantile(probs, y, self.alpha, self.ignore_index)
        self.n_calib_ = self._kept(y)
        return self

    def predict_set(self, probs: Any) -> Tensor | Any:
        """A set per position, `[B, C, *S]` bool (class c of position s in the set where
        `sets[b, c, s]`)."""
        self._check_fitted()
        return like_input(dense_sets(probs, self.quantile_), probs)
