"""Proper scoring rules and error for classifiers: NLL, Gibbs NLL, error, accuracy, Brier.

`pred` is probabilities `[N, C]` or member logits `[M, N, C]` (the ensemble averages member
probabilities); `y` is integer labels `[N]`. Results are Python floats, computed in float64.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from peg.metrics._inputs import checked_pred
from peg.metrics._predictive import Predictive


def nll(pred: Any, y: Any) -> float:
    """Mean negative log-likelihood of the predictive distribution.

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.

    For member logits the ensemble probability is the mean of member softmaxes, evaluated in
    log space (stable when logits saturate). A zero probability on the true class gives +inf.
    """
    return nll_of(Predictive(pred, y))


def nll_of(pp: Predictive) -> float:
    """`nll` of validated predictions."""
    return float(-pp.true_log_prob.mean())


def member_nll(member_logits: Any, y: Any) -> Tensor:
    """Per-member mean NLL, `[M]` float64, for member logits `[M, N, C]` and labels `[N]`."""
    return member_nll_of(_members(member_logits, y))


def _members(member_logits: Any, y: Any) -> Predictive:
    """`Predictive` of `member_logits`, which must be member logits `[M, N, C]`."""
    z = checked_pred(member_logits, "member_logits")
    if z.ndim != 3:
        raise ValueError(
            f"member_logits: expected member logits [M, N, C], got shape {tuple(z.shape)} "
            f"(probabilities [N, C] have no members; use nll)"
        )
    return Predictive(z, y, "member_logits")


def member_nll_of(pp: Predictive) -> Tensor:
    """`member_nll` of validated member logits."""
    return -pp.member_true_log.mean(1)


def gibbs_nll(member_logits: Any, y: Any) -> float:
    """Mean over members of each member's NLL (the Gibbs / expected-member NLL).

    Args:
        member_logits: `[M, N, C]`.
        y: labels `[N]`.

    By Jensen's inequality this is >= the ensemble `nll`, with equality for identical members.
    """
    return gibbs_nll_of(_members(member_logits, y))


def gibbs_nll_of(pp: Predictive) -> float:
    """`gibbs_nll` of validated member logits."""
    return float(member_nll_of(pp).mean())


def error(pred: Any, y: Any) -> float:
    """Fraction of points misclassified (in [0, 1]) by the argmax of the predictive distribution.

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.
    """
    return error_of(Predictive(pred, y))


def error_of(pp: Predictive) -> float:
    """`error` of validated predictions."""
    return float((~pp.correct).double().mean())


def accuracy(pred: Any, y: Any) -> float:
    """Fraction of points classified correctly, `1 - error(pred, y)`."""
    return 1.0 - error(pred, y)


def brier(pred: Any, y: Any, normalize: bool = False) -> float:
    """Brier score: mean over points of Σ_c (p_c - 1[y = c])², in [0, 2].

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.
        normalize: divide by C, as in the PEG paper (1/N Σ_n 1/C Σ_c (...)²), range [0, 2/C].
    """
    return brier_of(Predictive(pred, y), normalize)


def brier_of(pp: Predictive, normalize: bool = False) -> float:
    """`brier` of validated predictions."""
    score = pp.squared_error.mean()
    return float(score / pp.num_classes if normalize else score)
