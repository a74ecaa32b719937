"""Selective classification: the risk–coverage curve, AURC, AUGRC and the risk at a coverage.

A selective classifier predicts on the points whose confidence is at least a threshold t and
abstains on the others (Geifman & El-Yaniv 2017, "Selective classification for deep neural
networks"). Over the N points, at threshold t:

- coverage c(t): the fraction accepted (confidence >= t);
- selective risk r(t): the fraction wrong among the accepted;
- generalised risk g(t) = c(t) r(t): the fraction of all points that are wrong *and* accepted,
  P(wrong, accepted) (Traub et al. 2024, "Overcoming common flaws in the evaluation of
  selective classification systems", NeurIPS).

AURC = ∫₀¹ r dc and AUGRC = ∫₀¹ g dc, fractions in [0, 1], lower is better. The confidence is
the ensemble's max averaged probability unless a score is given (`confidence=` `[N]`, higher =
more confident, e.g. minus the predictive entropy); only its order matters.

Ties never depend on the order of the points: points of equal confidence are accepted or
rejected together, so the curve has one point per distinct confidence (K <= N points,
`peg.metrics._predictive.ranked`), as in Traub et al.'s reference implementation (fd-shifts).
Between two points (and from (0, 0) to the first) the number of errors accepted grows linearly
with the number accepted: what accepting part of a tie group gives on average over the orders
of its points. So g is piecewise linear and AUGRC is the trapezoidal rule over (0, 0) and the
curve's points; r = g / c, and AURC is its exact integral (a logarithm per segment: fd-shifts'
"non-linear" interpolation), r being constant, r₁, below the first point;
`interpolation="linear"` takes the trapezoidal rule over the points' selective risks instead
(fd-shifts' default AURC). `risk_at_coverage(c)` is that r(c). Consequences, tested:
AUGRC = acc·err·(1 − AUROC_f) + err²/2 exactly (AUROC_f: the AUROC of the confidence separating
correct from wrong points, ties counted ½; Traub et al. 2024); an oracle (every correct point
above every error) has AURC = err + (1 − err)·ln(1 − err) exactly, AUGRC = err²/2; AURC is the
average over the orders of tied points of the per-point AURC. Ties are exact ties of the float64
confidence: rows of probabilities are renormalised by their float64 sums (`Predictive`), so
equal maxima of rows whose sums differ in the last bits are not tied (`confidence=
probs.max(-1).values` ranks by the raw values).

`peg.metrics.streaming.StreamingMetrics` computes AURC and AUGRC (and the adaptive ECE) from the
same ranks, keeping each point's confidence and correctness (O(N) scalars, never `[N, C]`),
since they need a global sort.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from peg.metrics._predictive import Predictive, Ranked, ranked
from peg.source._values import as_tensor


def risk_coverage_curve(pred: Any, y: Any, confidence: Any = None) -> dict[str, Tensor]:
    """The risk–coverage curve: one point per distinct confidence, by decreasing threshold.

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]` (the prediction is the
            argmax of the averaged probabilities).
        y: labels `[N]`.
        confidence: scores `[N]` (higher = more confident); None: max_c p̄_c.

    Returns:
        `[K]` tensors (K distinct confidences): "threshold" (float64, decreasing), "coverage",
        "risk" (selective), "generalized_risk" (float64, coverage increasing to 1), and the
        counts behind them: "accepted" and "errors" (int64, cumulative).
    """
    return curve_of(_ranked(pred, y, confidence))


def curve_of(r: Ranked) -> dict[str, Tensor]:
    """`risk_coverage_curve` of ranked points."""
    accepted, errors = r.count.cumsum(0), r.errors.cumsum(0)
    n = float(accepted[-1])
    wrong = errors.double()
    return {
        "threshold": r.threshold,
        "coverage": accepted.double() / n,
        "risk": wrong / accepted.double(),
        "generalized_risk": wrong / n,
        "accepted": accepted,
        "errors": errors,
    }


def aurc(pred: Any, y: Any, confidence: Any = None, interpolation: str = "exact") -> float:
    """Area under the risk–coverage curve, ∫₀¹ r(c) dc, a fraction in [0, 1] (module docstring).

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.
        confidence: scores `[N]` (higher = more confident); None: max_c p̄_c.
        interpolation: "exact": the integral of r = g / c with g linear between the curve's
            points (an oracle gets err + (1 − err) ln(1 − err) exactly); "linear": the
            trapezoidal rule over the points' selective risks, from (0, r₁) (fd-shifts'
            default; an oracle whose errors tie gets err²/2 instead).
    """
    if interpolation not in ("exact", "linear"):
        raise ValueError(f"interpolation: expected 'exact' or 'linear', got {interpolation!r}")
    r = _ranked(pred, y, confidence)
    return aurc_of(r) if interpolation == "exact" else _linear_aurc(r)


def _linear_aurc(r: Ranked) -> float:
    """The trapezoidal rule over (0, r₁) and the curve's points (c_k, r_k)."""
    curve = curve_of(r)
    coverage = torch.cat([curve["coverage"].new_zeros(1), curve["coverage"]])
    risk = torch.cat([curve["risk"][:1], curve["risk"]])
    return float(torch.trapezoid(risk, coverage))


def aurc_of(r: Ranked) -> float:
    """`aurc` of ranked points: from the counts, with the cumulative errors E linear in the
    number accepted n between points, ∫ E/n dn over a segment from (n₀, E₀) to (n₁, E₁) with
    slope s = (E₁ − E₀)/(n₁ − n₀) is (E₁ − E₀) + (E₀ − s n₀) ln(n₁/n₀); the first segment,
    from (0, 0), gives E₁. Summed, the E terms telescope to the total number of errors."""
    n, e = r.count[1:], r.errors[1:]  # each later group: its size and errors
    before_n, before_e = r.count.cumsum(0)[:-1], r.errors.cumsum(0)[:-1]
    intercept = (before_e * n - e * before_n).double() / n  # E₀ − s n₀, from exact integers
    logs = torch.log1p(n.double() / before_n)  # ln(n₁/n₀)
    total = int(r.count.sum())
    return (float(r.errors.sum()) + float((intercept * logs).sum())) / total


def augrc(pred: Any, y: Any, confidence: Any = None) -> float:
    """Area under the generalised risk–coverage curve, ∫₀¹ g(c) dc, g = P(wrong, accepted), a
    fraction in [0, 0.5] (Traub et al. 2024; module docstring).

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.
        confidence: scores `[N]` (higher = more confident); None: max_c p̄_c.
    """
    return augrc_of(_ranked(pred, y, confidence))


def augrc_of(r: Ranked) -> float:
    """`augrc` of ranked points: the trapezoidal rule over (0, 0) and the curve's points,
    Σ_k n_k (E_k + E_{k-1}) / (2 N²), summed in integers."""
    errors = r.errors.cumsum(0)
    twice = (r.count * (2 * errors - r.errors)).sum()  # E_k + E_{k-1} = 2 E_k - e_k
    total = int(r.count.sum())
    return float(twice) / (2.0 * total * total)


def risk_at_coverage(pred: Any, y: Any, coverage: float, confidence: Any = None) -> float:
    """The selective risk when the most confident fraction `coverage` of the points is accepted.

    With no tie at the cut and `coverage * N` whole, the error rate of the `coverage * N` most
    confident points; otherwise the tie group at the cut is accepted in part, each of its points
    counting its group's error rate (the average over the orders of the tied points), and a
    fractional point likewise. This is the r(c) whose integral is `aurc`.

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.
        coverage: in (0, 1].
        confidence: scores `[N]` (higher = more confident); None: max_c p̄_c.
    """
    coverage = check_coverage(coverage)
    return risk_at_coverage_of(_ranked(pred, y, confidence), coverage)


def risk_at_coverage_of(r: Ranked, coverage: float) -> float:
    """`risk_at_coverage` of ranked points."""
    accepted, errors = r.count.cumsum(0), r.errors.cumsum(0)
    x = coverage * float(accepted[-1])  # points accepted, <= N
    cut = torch.tensor([x], dtype=torch.float64, device=accepted.device)
    k = int(torch.searchsorted(accepted.double(), cut))  # the group at the cut
    before_n = float(accepted[k - 1]) if k else 0.0
    before_e = float(errors[k - 1]) if k else 0.0
    wrong = before_e + float(r.errors[k]) * (x - before_n) / float(r.count[k])
    return wrong / x


def check_coverage(coverage: Any) -> float:
    """`coverage` as a float in (0, 1], or a ValueError naming it."""
    ok = isinstance(coverage, (int, float)) and not isinstance(coverage, bool)
    if not ok or not (0 < coverage <= 1) or math.isnan(coverage):
        raise ValueError(f"coverage: expected a number in (0, 1], got {coverage!r}")
    return float(coverage)


def _ranked(pred: Any, y: Any, confidence: Any) -> Ranked:
    pp = Predictive(pred, y)
    if confidence is None:
        return pp.ranked
    given = len(pp.labels) if pp.kept is None else len(pp.kept)
    scores = check_confidence(confidence, given, pp.labels.device)
    return ranked(scores if pp.kept is None else scores[pp.kept.to(scores.device)], pp.correct)


def check_confidence(confidence: Any, n: int, device: torch.device) -> Tensor:
    """Scores `[n]` (real, finite) as float64 on `device`, or an error naming `confidence`."""
    t = as_tensor(confidence, "confidence", device, owner="pred")
    if t.ndim != 1 or t.shape[0] != n:
        raise ValueError(
            f"confidence: expected one score per point, shape [{n}] (N of pred), got shape "
            f"{tuple(t.shape)}"
        )
    if t.is_complex():
        raise ValueError(f"confidence: expected real scores, got dtype {t.dtype}")
    t = t.to(device=device, dtype=torch.float64)
    if not torch.isfinite(t).all():
        raise ValueError("confidence: expected finite scores, got NaN or inf")
    return t


__all__ = ["augrc", "aurc", "risk_at_coverage", "risk_coverage_curve"]
