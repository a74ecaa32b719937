"""Proper scoring rules and error for classifiers: NLL, Gibbs NLL, error, accuracy, Brier.

`pred` is probabilities `[N, C]` or member logits `[M, N, C]` (the ensemble averages member
probabilities); `y` is integer labels `[N]`. Results are Python floats, computed in float64.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from peg.metrics._inputs import as_pred, check_labels, pred_and_labels


def nll(pred: Any, y: Any) -> float:
    """Mean negative log-likelihood of the predictive distribution.

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.

    For member logits the ensemble probability is the mean of member softmaxes, evaluated in
    log space (stable when logits saturate). A zero probability on the true class gives +inf.
    """
    log_p, y = pred_and_labels(pred, y)
    return float(-log_p.gather(1, y[:, None]).mean())


def member_nll(member_logits: Any, y: Any) -> Tensor:
    """Per-member mean NLL, `[M]` float64, for member logits `[M, N, C]` and labels `[N]`."""
    z = as_pred(member_logits, "member_logits")
    if z.ndim != 3:
        raise ValueError(
            f"member_logits: expected member logits [M, N, C], got shape {tuple(z.shape)} "
            f"(probabilities [N, C] have no members; use nll)"
        )
    y = check_labels(y, z.shape[1], z.shape[2], device=z.device)
    log_p = z.log_softmax(-1)
    return -log_p.gather(2, y.expand(z.shape[0], -1)[..., None]).squeeze(-1).mean(1)


def gibbs_nll(member_logits: Any, y: Any) -> float:
    """Mean over members of each member's NLL (the Gibbs / expected-member NLL).

    Args:
        member_logits: `[M, N, C]`.
        y: labels `[N]`.

    By Jensen's inequality this is >= the ensemble `nll`, with equality for identical members.
    """
    return float(member_nll(member_logits, y).mean())


def error(pred: Any, y: Any) -> float:
    """Fraction of points misclassified (in [0, 1]) by the argmax of the predictive distribution.

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.
    """
    log_p, y = pred_and_labels(pred, y)
    return float((log_p.argmax(-1) != y).double().mean())


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
    p, y = pred_and_labels(pred, y, log=False)
    onehot = torch.nn.functional.one_hot(y, p.shape[1]).to(p.dtype)
    score = (p - onehot).pow(2).sum(-1).mean()
    return float(score / p.shape[1] if normalize else score)
