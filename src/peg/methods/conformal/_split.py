"""What split conformal prediction is made of, as pure functions of tensors (Vovk et al. 2005;
Angelopoulos & Bates 2021), and the one pass over labelled data that fitting takes.

- `check_alpha`, `quantile_rank(n, alpha)`: the finite-sample rank k = ⌈(n + 1)(1 − α)⌉,
  computed exactly on α as written (the shortest decimal of the float, `fractions.Fraction`),
  so that n = 99, α = 0.45 gives k = 55 (the float product 100 · 0.55 is 55.00000000000001,
  whose ceiling is 56);
- `conformal_quantile(scores, alpha)`: the k-th smallest score (k / n as a quantile level);
- `class_scores(probs, score, ...)`: the nonconformity score of every class `[N, C]`, float64:
  LAC 1 − p̂_c, APS the probability mass of the classes more probable than c plus p̂_c (times
  u, the randomised variant's uniform draw), RAPS the APS score plus λ·(rank − k_reg)⁺; a set
  is `{c : score_c ≤ q̂}` (`sets_from_scores`; `class_sets` computes the same sets ranking only
  the classes that can be in one), so a label is in its set exactly when its score, the
  calibration score of that point, is at most q̂, which is what the guarantee needs;
- `labelled_batches(predictor, data, ...)`: `(member logits [M, B, C], labels [B])` batch by
  batch, one pass, the inputs never gathered (loaders through a `peg.source.Tapped` source).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from torch import Tensor

from peg.methods._constraints import described
from peg.methods._predictors import (
    labelled_batches as labelled_batches,
)

SCORES = ("lac", "aps", "raps")


def check_alpha(alpha: Any, name: str = "alpha") -> float:
    """`alpha` as a float if it is a number in (0, 1), else a ValueError naming `name`."""
    ok = isinstance(alpha, (int, float, np.integer, np.floating)) and not isinstance(alpha, bool)
    if not ok or not math.isfinite(float(alpha)) or not 0 < float(alpha) < 1:
        raise ValueError(f"{name}: expected a miscoverage level in (0, 1), got {alpha!r}")
    return float(alpha)


ALPHA = described(check_alpha, "a miscoverage level in (0, 1)")


def quantile_rank(n: int, alpha: float, what: str = "val") -> int:
    """k = ⌈(n + 1)(1 − α)⌉, exactly; a ValueError naming `what` when k > n (n < 1/α − 1:
    too few points for a finite quantile)."""
    k = math.ceil((n + 1) * (1 - _decimal(alpha)))
    if k > n:
        need = min_points(alpha)
        raise ValueError(
            f"{what}: {n} calibration points are too few for alpha={alpha:g}: split conformal "
            f"needs n >= 1/alpha - 1 = {need} (the ⌈(n+1)(1-alpha)⌉-th score must exist)"
        )
    return max(k, 1)


def _decimal(alpha: float) -> Fraction:
    """α exactly as written: the shortest decimal that gives the float back (0.1 is 1/10)."""
    return Fraction(repr(float(alpha)))


def min_points(alpha: float) -> int:
    """The fewest points the quantile at level α exists for: ⌈1/α − 1⌉ (at least 1)."""
    return max(1, math.ceil(1 / _decimal(alpha) - 1))


def conformal_quantile(scores: Tensor, alpha: float, what: str = "val") -> float:
    """The ⌈(n + 1)(1 − α)⌉-th smallest of `scores` `[n]` (a selection, O(n))."""
    k = quantile_rank(int(scores.numel()), alpha, what)
    return float(torch.kthvalue(scores.double().cpu(), k).values)


def ensemble_probs(logits: Tensor) -> Tensor:
    """The averaged probabilities `[B, C]` of member logits `[M, B, C]`, float64, computed as
    every peg predictor's `predict_proba` does (softmax, then the mean over members)."""
    return logits.softmax(-1).mean(0).double()


def _ranked_scores(v: Tensor, score: str, k_reg: int, lam: float, u: Tensor | None) -> Tensor:
    """APS/RAPS scores `[B, K]` of probabilities sorted in decreasing order `v` `[B, K]` (the
    first K of a row: a prefix of its sorted values). The mass before a class is that of the
    classes strictly more probable (equal ones share it, and a rank), so the scores depend on
    the sorted values only, never on how a sort orders ties."""
    cum = v.cumsum(-1)
    start = torch.ones_like(v, dtype=torch.bool)
    start[:, 1:] = v[:, 1:] != v[:, :-1]  # the first of each run of equal values
    index = torch.arange(v.shape[-1], device=v.device).expand_as(v)
    first = torch.where(start, index, 0).cummax(-1).values
    s = (cum - v).gather(-1, first) + (v if u is None else u.double()[:, None] * v)
    if score == "raps" and lam > 0:
        s = s + lam * (first + 1 - k_reg).clamp_min(0).double()
    return s


def class_scores(
    probs: Tensor, score: str, k_reg: int = 1, lam: float = 0.0, u: Tensor | None = None
) -> Tensor:
    """The nonconformity score of every class, `[B, C]` float64, from probabilities `[B, C]`
    (see the module doc); `u` `[B]`, uniform in [0, 1), randomises APS/RAPS (None: u = 1)."""
    p = probs.double()
    if score == "lac":
        return 1 - p
    v, order = p.sort(dim=-1, descending=True)
    return torch.empty_like(v).scatter_(-1, order, _ranked_scores(v, score, k_reg, lam, u))


def class_sets(
    probs: Tensor,
    q: Tensor | float,
    score: str,
    k_reg: int = 1,
    lam: float = 0.0,
    u: Tensor | None = None,
) -> Tensor:
    """`sets_from_scores(class_scores(probs, ...), q)` `[B, C]` bool, without sorting the
    classes that cannot be in a set: an APS/RAPS score is at least 1 − C·p̂_c (the classes
    after c hold at most p̂_c each), so only the classes with p̂_c >= (1 − q̂)/C (a margin
    for rows summing to 1 in float32) are ranked, by `topk`, when they are fewer than C."""
    p = probs.double()
    if score == "lac":
        return sets_from_scores(1 - p, q)
    classes = p.shape[-1]
    top = float(q.max()) if isinstance(q, Tensor) else float(q)
    bound = (1 - top - 1e-5) / classes
    k = int((p >= bound).sum(-1).max()) if bound > 0 and len(p) else classes
    if k >= classes:
        v, order = p.sort(dim=-1, descending=True)
    else:
        v, order = p.topk(max(k, 1), dim=-1, sorted=True)
    s = _ranked_scores(v, score, k_reg, lam, u)
    limit = q.to(p.device)[order] if isinstance(q, Tensor) else q
    inside = s <= limit
    return torch.zeros(p.shape, dtype=torch.bool, device=p.device).scatter_(-1, order, inside)


def check_scores(scores: Tensor, what: str) -> None:
    """A ValueError naming `what` when scores are NaN (the predictor gave NaN probabilities)."""
    if torch.isnan(scores).any():
        bad = int(torch.isnan(scores).reshape(len(scores), -1).any(-1).sum())
        raise ValueError(
            f"{what}: NaN nonconformity scores for {bad} points (the predictor's probabilities "
            "are NaN there)"
        )


def sets_from_scores(scores: Tensor, q: Tensor | float) -> Tensor:
    """Prediction sets `[B, C]` bool: class c is in when its score is at most q̂ (a number, or
    `[C]` per class for class-conditional quantiles)."""
    return scores <= (q.to(scores.device) if isinstance(q, Tensor) else q)
