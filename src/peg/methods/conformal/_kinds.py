"""Conformal prediction for binary scorers, multi-label heads and dense predictions, as pure
functions of probabilities and labels (the classes are in `kinds.py`).

- Binary: split conformal on the two columns (1 - p, p) of P(y = 1) `p` `[N]`, the scores and
  the quantile of the multi-class sets (`_split.class_scores`, `conformal_quantile`,
  `class_sets`): sets `[N, 2]` bool, {0}, {1}, {0, 1} (or, rarely, empty), holding y with
  probability >= 1 - α. `binary_quantile`, `binary_sets`.
- Multi-label: conformal risk control of the false-negative rate (Angelopoulos, Bates, Fisch,
  Lei & Schuster 2022, "Conformal Risk Control", Sec. 2): sets C_λ(x) = {k : p_k >= 1 - λ},
  loss L_i(λ) = the fraction of x_i's labels that C_λ(x_i) misses (0 for a point without
  labels; bounded by B = 1, non-increasing in λ), and

      λ̂ = inf{λ : (n / (n + 1)) R̂_n(λ) + B / (n + 1) <= α},   R̂_n(λ) = (1/n) Σ_i L_i(λ),

  so that E[L_{n+1}(λ̂)] <= α: the expected recall of a new point's set is >= 1 - α.
  `fnr_threshold` gives the threshold t̂ = 1 - λ̂ of the sets {k : p_k >= t̂} (the sets are
  made by comparing with t̂ itself, so no rounding of 1 - λ̂ moves an entry in or out);
  `multilabel_sets`, `false_negative_rate`.
- Dense: split conformal over the positions not ignored, LAC (score 1 - p_y per position);
  a set per position `[B, C, *S]`. Positions of one image are not exchangeable with each other,
  so the guarantee is over positions of exchangeable images, on average (`dense_quantile`,
  `dense_sets`). The calibration keeps one score per position: O(positions) floats, C times
  less than the probabilities.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from peg.methods.conformal._split import (
    check_alpha,
    class_scores,
    class_sets,
    conformal_quantile,
    min_points,
    sets_from_scores,
)
from peg.metrics.binary import IGNORE_INDEX, check_probs, checked
from peg.source._values import as_tensor, check_labels

BINARY_SCORES = ("lac", "aps")


def two_columns(p: Tensor) -> Tensor:
    """P(y = 1) `[N]` as the probabilities of both classes, (1 - p, p), `[N, 2]` float64."""
    p = p.double().reshape(-1)
    return torch.stack([1 - p, p], -1)


def binary_quantile(
    p: Any, y: Any, alpha: float, score: str = "lac", ignore_index: int = IGNORE_INDEX
) -> float:
    """q̂ of split conformal on P(y = 1) `p` `[N]` (or `[N, 1]`) and labels `y` 0/1: the
    ⌈(n + 1)(1 − α)⌉-th smallest score of the labels (`score` "lac" or "aps", the multi-class
    scores on (1 - p, p)); labels equal to `ignore_index` left out."""
    alpha, score = check_alpha(alpha), check_score(score)
    t, labels = checked(p, y, ignore_index)
    keep = (labels != ignore_index).reshape(-1)
    if not bool(keep.any()):
        raise ValueError(f"y: every label is ignore_index ({ignore_index}): nothing to calibrate")
    probs = two_columns(t)[keep]
    scores = class_scores(probs, score).gather(1, labels.reshape(-1)[keep, None])[:, 0]
    return conformal_quantile(scores, alpha)


def binary_sets(p: Any, q: float, score: str = "lac") -> Tensor:
    """Prediction sets `[N, 2]` bool of P(y = 1) `p` `[N]` at the threshold `q` (column c: class
    c is in the set)."""
    return class_sets(two_columns(check_probs(p)), q, check_score(score))


def check_score(score: Any) -> str:
    """`score` if it is one of `BINARY_SCORES`, else a ValueError naming it."""
    if score not in BINARY_SCORES:
        raise ValueError(f"score: expected one of {list(BINARY_SCORES)}, got {score!r}")
    return score


def fnr_threshold(p: Any, y: Any, alpha: float, ignore_index: int = IGNORE_INDEX) -> float:
    """The threshold t̂ = 1 − λ̂ of conformal risk control of the false-negative rate (module
    doc) from a multi-label head's probabilities `p` `[n, K]` and multi-hot labels `y`
    `[n, K]` (entries equal to `ignore_index` left out: neither a label nor a miss).

    With W the number of points with a label and w_ik = 1 / (labels of point i) for each label
    entry, n R̂(t) = W − Σ_{labels with p_ik >= t} w_ik, so the condition reads
    Σ_{p_ik >= t} w_ik >= W + B − α(n + 1): t̂ is the largest p_ik that reaches it (1 when
    t = 1 does already, λ̂ = 0)."""
    alpha = check_alpha(alpha)
    t, labels = checked(p, y, ignore_index, multilabel=True)
    n = t.shape[0]
    slack = alpha * (n + 1) - 1.0  # α(n + 1) − B, B = 1
    if slack < 0:
        raise ValueError(
            f"p: {n} calibration points are too few for alpha={alpha:g}: conformal risk "
            f"control needs n >= 1/alpha - 1 = {min_points(alpha)} (B / (n + 1) <= alpha)"
        )
    positive = labels == 1
    count = positive.sum(1, keepdim=True)
    weight = positive.double() / count.clamp(min=1).double()  # w_ik on labels, 0 elsewhere
    total = float((count > 0).sum())  # W
    need = total - slack
    at_one = float(weight[t >= 1].sum())
    if need <= at_one:  # λ = 0 meets the condition already
        return 1.0
    values = t[positive]
    order = values.argsort(descending=True)
    reached = weight[positive][order].cumsum(0)
    # the sums of the weights differ from W by rounding (a few ulps): met within 1e-9
    first = int(torch.searchsorted(reached, torch.tensor(need - 1e-9, dtype=torch.float64)))
    return float(values[order][min(first, len(order) - 1)])


def multilabel_sets(p: Any, threshold: float) -> Tensor:
    """The labels predicted for each point, `[N, K]` bool: {k : p_k >= `threshold`}."""
    return check_probs(p, multilabel=True) >= threshold


def false_negative_rate(sets: Any, y: Any, ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Per point, the fraction of its labels (y = 1) that its set misses, `[N]` float64 (0 for
    a point without labels); 1 − this is the point's recall."""
    s = as_tensor(sets, "sets")
    if s.dtype != torch.bool or s.ndim != 2:
        raise ValueError(f"sets: expected label sets [N, K] bool, got {s.dtype} {tuple(s.shape)}")
    labels = checked(s.double(), y, ignore_index, multilabel=True)[1]
    positive = labels == 1
    missed = (positive & ~s).sum(1).double()
    return missed / positive.sum(1).clamp(min=1).double()


def dense_label_scores(probs: Any, y: Any, ignore_index: int = IGNORE_INDEX) -> Tensor:
    """LAC scores 1 − p_y `[R]` float64 of the positions not ignored, from probabilities
    `[B, C, *S]` (softmax over dim 1) and labels `[B, *S]`."""
    t = as_tensor(probs, "probs")
    if t.ndim < 2 or not t.is_floating_point():
        raise ValueError(
            f"probs: expected probabilities [B, C, *S], got shape {tuple(t.shape)} ({t.dtype})"
        )
    labels = as_tensor(y, "y", t.device, owner="pred")
    if labels.shape != (t.shape[0], *t.shape[2:]):
        raise ValueError(
            f"y: expected labels [B, *S] = {[t.shape[0], *t.shape[2:]]} for probabilities of "
            f"shape {tuple(t.shape)}, got {tuple(labels.shape)}"
        )
    keep = labels != ignore_index
    if not bool(keep.any()):
        raise ValueError(f"y: every label is ignore_index ({ignore_index}): nothing to calibrate")
    kept = check_labels(labels[keep], None, t.shape[1], "y", t.device)
    return 1 - t.movedim(1, -1)[keep].gather(1, kept[:, None])[:, 0].double()


def dense_quantile(probs: Any, y: Any, alpha: float, ignore_index: int = IGNORE_INDEX) -> float:
    """q̂ of split conformal over the positions not ignored (LAC): the ⌈(n + 1)(1 − α)⌉-th
    smallest 1 − p_y."""
    alpha = check_alpha(alpha)
    return conformal_quantile(dense_label_scores(probs, y, ignore_index), alpha)


def dense_sets(probs: Any, q: float) -> Tensor:
    """A set per position, `[B, C, *S]` bool: class c is in where 1 − p_c <= q̂."""
    t = as_tensor(probs, "probs")
    if t.ndim < 2:
        raise ValueError(f"probs: expected probabilities [B, C, *S], got shape {tuple(t.shape)}")
    return sets_from_scores(1 - t.double(), q)  # LAC: the multi-class sets, per position
