"""Out-of-distribution (OOD) detection: per-sample scores and detection metrics.

Sign convention, everywhere in this module: **a higher score means "more likely OOD"**, and
**OOD is the positive class** unless an argument says otherwise. Every dict output names its
positive class under the key "positive".

Scores take `pred`, probabilities `[N, C]` or member logits `[M, N, C]` (as everywhere in
`peg.metrics`; a single model's logits are `[1, N, C]`), and return a float64 tensor `[N]`:

- `max_softmax`: minus the largest predictive probability, -max_c p̄_c (negated MSP).
- `max_logit`: minus the largest mean logit, -max_c (1/M) Σ_m z_mc; needs logits.
- `energy`: the free energy -logsumexp_c z_c (Liu et al. 2020), the members' mean; needs logits.
- `entropy`: predictive entropy H[p̄] (nats) of the averaged distribution.
- `mutual_information`: H[p̄] - (1/M) Σ_m H[p_m] (epistemic part); needs members.
- `variation_ratio`: 1 - (votes for the modal class) / M; needs members.

Metrics take `scores_in` `[N_in]` and `scores_out` `[N_out]` (tensors or arrays, 1-D, finite,
non-empty) and return floats; a sample is flagged as OOD when its score is >= the threshold:

- `auroc`: area under the ROC curve (symmetric: the same whichever class is positive).
- `aupr(positive="ood"|"in")`: average precision with OOD ("AUPR-Out") or in-distribution
  ("AUPR-In", scores negated) as the positive class.
- `fpr_at_tpr(tpr=0.95)`: FPR95, the fraction of in-distribution samples flagged as OOD at the
  highest threshold that still flags >= 95% of the OOD samples.
- `ood_metrics(pred_in, pred_out, score)`: all of the above as one dict.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from peg.metrics._inputs import as_pred, ensemble_log_probs, ensemble_probs, member_axis
from peg.source._values import as_tensor

__all__ = [
    "OOD_SCORES",
    "aupr",
    "auroc",
    "energy",
    "entropy",
    "fpr_at_tpr",
    "max_logit",
    "max_softmax",
    "mutual_information",
    "ood_metrics",
    "variation_ratio",
]

Positive = Literal["ood", "in"]

# --- scores (higher = more likely OOD) -------------------------------------------------------


def _members(pred: Any, name: str, score: str) -> Tensor:
    """`pred` validated as member logits `[M, N, C]`; probabilities `[N, C]` are an error."""
    t = as_pred(pred, name)
    if t.ndim != 3:
        raise ValueError(
            f"{name}: {score} needs member logits [M, N, C], got probabilities of shape "
            f"{tuple(t.shape)}; pass a single model's logits as {member_axis(pred)}"
        )
    return t


def _entropy_from_log(log_p: Tensor) -> Tensor:
    """-Σ_c p log p over the last dim, from log-probabilities; p = 0 (log p = -inf) adds 0."""
    # exp(log p) * log p is exact for very negative log p (the product underflows to -0.0),
    # so only a true -inf needs masking to avoid 0 * -inf = NaN.
    plogp = torch.where(torch.isneginf(log_p), 0.0, log_p.exp() * log_p)
    return -plogp.sum(-1)


def max_softmax(pred: Any) -> Tensor:
    """Negated maximum softmax probability (MSP baseline, Hendrycks & Gimpel 2017), `[N]`.

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.

    Returns:
        -max_c p̄_c `[N]` float64, in [-1, -1/C]; higher = less confident = more likely OOD.
        For members, p̄ is the mean of member softmaxes.
    """
    return -ensemble_probs(as_pred(pred)).max(-1).values


def max_logit(pred: Any) -> Tensor:
    """Negated maximum logit (MaxLogit, Hendrycks et al. 2022), `[N]`.

    Args:
        pred: member logits `[M, N, C]` (a single model: `[1, N, C]`). Probabilities `[N, C]`
            are an error: logits cannot be recovered from them.

    Returns:
        -max_c (1/M) Σ_m z_mnc `[N]` float64: the maximum of the member-mean logit, negated so
        that higher = more likely OOD. Raw logits are used, as in the original method, so the
        score depends on each member's logit offset, unlike the softmax-based scores.
    """
    z = _members(pred, "pred", "max_logit")
    return -z.mean(0).max(-1).values


def energy(pred: Any) -> Tensor:
    """Free energy (Liu et al. 2020, T = 1), `[N]`: E(x) = -log Σ_c exp z_c.

    Args:
        pred: member logits `[M, N, C]` (a single model: `[1, N, C]`). Probabilities `[N, C]`
            are an error: the score reads the logits' scale, which softmax removes.

    Returns:
        -(1/M) Σ_m logsumexp_c z_mnc `[N]` float64: the members' energies averaged (for one
        model, Liu et al.'s score); higher (a smaller logsumexp) = more likely OOD. Like
        `max_logit`, it depends on each member's logit offset.
    """
    z = _members(pred, "pred", "energy")
    return -z.double().logsumexp(-1).mean(0)


def entropy(pred: Any) -> Tensor:
    """Predictive entropy H[p̄] = -Σ_c p̄_c log p̄_c in nats, `[N]` in [0, log C].

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.

    For members, log p̄ is computed in log space (`ensemble_log_probs`), so saturated logits
    give exact entropies (0 for agreeing one-hot members, not NaN).
    """
    return _entropy_from_log(ensemble_log_probs(pred))


def mutual_information(pred: Any) -> Tensor:
    """Mutual information between the label and the member, `[N]` in [0, log M].

    MI = H[p̄] - (1/M) Σ_m H[p_m]: total predictive entropy minus the expected member entropy
    (the "epistemic" part, BALD). 0 when all members agree exactly.

    Args:
        pred: member logits `[M, N, C]`. Probabilities `[N, C]` are an error (one
            distribution has no disagreement to measure).

    Returns:
        `[N]` float64, clamped at 0 (it is >= 0 by Jensen; rounding can give -1e-16).
    """
    z = _members(pred, "pred", "mutual_information")
    total = entropy(z)
    expected = _entropy_from_log(z.log_softmax(-1)).mean(0)
    return (total - expected).clamp(min=0.0)


def variation_ratio(pred: Any) -> Tensor:
    """Variation ratio 1 - f / M, with f the number of members voting for the modal class.

    Args:
        pred: member logits `[M, N, C]`; each member votes for its argmax class (the first one
            on exact ties). Probabilities `[N, C]` are an error (there are no votes).

    Returns:
        `[N]` float64 in [0, 1 - 1/M]; 0 when all members vote alike.
    """
    z = _members(pred, "pred", "variation_ratio")
    m, n, c = z.shape
    votes = z.argmax(-1).T  # [N, M]
    # Count votes per class with a scatter ([N, C]) rather than a one-hot [M, N, C].
    counts = torch.zeros(n, c, dtype=torch.float64, device=z.device)
    counts.scatter_add_(1, votes, torch.ones_like(votes, dtype=torch.float64))
    return 1.0 - counts.max(-1).values / m


OOD_SCORES: dict[str, Callable[[Any], Tensor]] = {
    "energy": energy,
    "entropy": entropy,
    "max_softmax": max_softmax,
    "max_logit": max_logit,
    "mutual_information": mutual_information,
    "variation_ratio": variation_ratio,
}
"""Score functions by name, as accepted by `ood_metrics(score=...)`."""

_NEEDS_MEMBERS = frozenset({"energy", "max_logit", "mutual_information", "variation_ratio"})

# --- metrics --------------------------------------------------------------------------------


def _as_scores(scores: Any, name: str) -> np.ndarray:
    """Validate 1-D, non-empty, real, finite scores; return them as a float64 numpy array."""
    t = as_tensor(scores, name)
    if t.ndim != 1:
        raise ValueError(f"{name}: expected 1-D scores [N], got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{name}: expected at least one score, got none (empty)")
    if t.is_complex():
        raise ValueError(f"{name}: expected real scores, got dtype {t.dtype}")
    t = t.double()
    if not torch.isfinite(t).all():
        raise ValueError(f"{name}: expected finite scores, got NaN or inf")
    return t.cpu().numpy()


def _check_positive(positive: str) -> None:
    if positive not in ("ood", "in"):
        raise ValueError(f"positive: expected 'ood' or 'in', got {positive!r}")


def _labelled(
    scores_in: Any, scores_out: Any, positive: str = "ood"
) -> tuple[np.ndarray, np.ndarray]:
    """Binary labels (1 = positive class) and scores ranking the positive class first.

    With positive="in" the scores are negated, so that in-distribution samples rank first.
    """
    _check_positive(positive)
    s_in = _as_scores(scores_in, "scores_in")
    s_out = _as_scores(scores_out, "scores_out")
    ood = np.concatenate([np.zeros(s_in.size), np.ones(s_out.size)])
    s = np.concatenate([s_in, s_out])
    return (ood, s) if positive == "ood" else (1.0 - ood, -s)


def auroc(scores_in: Any, scores_out: Any) -> float:
    """Area under the ROC curve of telling OOD from in-distribution samples, in [0, 1].

    Args:
        scores_in: scores `[N_in]` of in-distribution samples (higher = more likely OOD).
        scores_out: scores `[N_out]` of OOD samples.

    The probability that a random OOD sample scores higher than a random in-distribution one,
    ties counting 1/2: 1 = perfect, 0.5 = chance (or all scores equal), 0 = reversed. It is the
    same with either class as positive.
    """
    from sklearn.metrics import roc_auc_score  # here: `import peg` stays light

    y, s = _labelled(scores_in, scores_out)
    return float(roc_auc_score(y, s))


def aupr(scores_in: Any, scores_out: Any, positive: Positive = "ood") -> float:
    """Area under the precision-recall curve, as average precision (sklearn), in [0, 1].

    Args:
        scores_in: scores `[N_in]` of in-distribution samples (higher = more likely OOD).
        scores_out: scores `[N_out]` of OOD samples.
        positive: "ood" (AUPR-Out: OOD positive, ranked by score) or "in" (AUPR-In:
            in-distribution positive, ranked by -score).

    Average precision Σ_k (R_k - R_{k-1}) P_k is the step-wise area (no trapezoidal
    interpolation). Chance level is the positive class's share of all samples, so the value
    depends on N_out / N_in; report which positive class it used.
    """
    from sklearn.metrics import average_precision_score

    y, s = _labelled(scores_in, scores_out, positive)
    return float(average_precision_score(y, s))


def fpr_at_tpr(
    scores_in: Any, scores_out: Any, tpr: float = 0.95, positive: Positive = "ood"
) -> float:
    """False-positive rate at the first threshold reaching a true-positive rate of `tpr`.

    With OOD positive (the default; FPR95 for tpr=0.95): flag a sample as OOD when its
    score >= t, take the highest threshold t that flags at least a fraction `tpr` of the OOD
    samples, and return the fraction of in-distribution samples flagged at t. Lower is better;
    0 = perfect separation. Ties at t are flagged, so tied in/out scores count against it.

    Args:
        scores_in: scores `[N_in]` of in-distribution samples (higher = more likely OOD).
        scores_out: scores `[N_out]` of OOD samples.
        tpr: required detection rate, in (0, 1].
        positive: "ood" (above) or "in": in-distribution is positive and ranked by -score, so
            the result is the fraction of OOD samples accepted as in-distribution when `tpr` of
            the in-distribution samples are accepted (the convention of ODIN / energy-score
            papers). The two differ in general; say which one a table uses.
    """
    if not isinstance(tpr, numbers.Real) or isinstance(tpr, bool) or not 0.0 < tpr <= 1.0:
        raise ValueError(f"tpr: expected a number in (0, 1], got {tpr!r}")
    from sklearn.metrics import roc_curve

    y, s = _labelled(scores_in, scores_out, positive)
    # Keep every threshold: the first one with TPR >= tpr is then exact. TPR is non-decreasing
    # along the curve (thresholds decreasing) and ends at 1, so argmax finds it.
    fprs, tprs, _ = roc_curve(y, s, drop_intermediate=False)
    return float(fprs[np.argmax(tprs >= tpr)])


def ood_metrics(pred_in: Any, pred_out: Any, score: str = "entropy") -> dict[str, float | str]:
    """Score both sets with one OOD score and compute every detection metric.

    Args:
        pred_in: in-distribution predictions, probabilities `[N_in, C]` or member logits
            `[M, N_in, C]`.
        pred_out: OOD predictions, `[N_out, C]` or `[M', N_out, C]` (same C).
        score: a name in `OOD_SCORES`: "entropy", "max_softmax", "max_logit", "energy",
            "mutual_information" or "variation_ratio" (all but the first two need logits).

    Returns:
        {"auroc", "aupr_out" (OOD positive), "aupr_in" (in-distribution positive),
        "fpr95" (OOD positive, see `fpr_at_tpr`), "positive": "ood", "score": score}.
    """
    if score not in OOD_SCORES:
        raise ValueError(f"score: expected one of {sorted(OOD_SCORES)}, got {score!r}")
    p_in, p_out = as_pred(pred_in, "pred_in"), as_pred(pred_out, "pred_out")
    if p_in.shape[-1] != p_out.shape[-1]:
        raise ValueError(
            f"pred_out: expected C = {p_in.shape[-1]} classes (as pred_in), "
            f"got shape {tuple(p_out.shape)}"
        )
    if score in _NEEDS_MEMBERS:  # checked here so the error names pred_in / pred_out
        _members(p_in, "pred_in", score)
        _members(p_out, "pred_out", score)
    s_in, s_out = OOD_SCORES[score](p_in), OOD_SCORES[score](p_out)
    return {
        "auroc": auroc(s_in, s_out),
        "aupr_out": aupr(s_in, s_out, positive="ood"),
        "aupr_in": aupr(s_in, s_out, positive="in"),
        "fpr95": fpr_at_tpr(s_in, s_out, 0.95),
        "positive": "ood",
        "score": score,
    }
