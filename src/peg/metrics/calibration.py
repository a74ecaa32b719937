"""Calibration of the top-class confidence: reliability diagram, ECE and MCE.

Bins are equal-width on [0, 1] and right-closed, (lo, hi], except that the first bin also
holds confidence 0; confidence 1 is in the last bin. Edges are i / bins (correctly rounded),
so a float64 confidence equal to an edge such as 0.2 goes to the bin below it.

`bin_sums` gathers the per-bin statistics and `binned_ece` / `binned_mce` compute ECE and MCE
from them; `ece`, `mce`, `peg.metrics.StreamingMetrics` and the reliability diagrams of
`peg.plots` all go through them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from peg._inputs import check_positive_int
from peg.metrics._predictive import Predictive


def reliability(pred: Any, y: Any, bins: int = 15) -> dict[str, Tensor]:
    """Per-bin confidence, accuracy and count of the top-class prediction.

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.
        bins: number of equal-width bins.

    Returns:
        "edges" `[bins + 1]` (0 to 1), "confidence" `[bins]` (mean max-probability),
        "accuracy" `[bins]` (fraction correct), both NaN in empty bins, and "count" `[bins]`
        (int64, summing to N).
    """
    bins = check_positive_int(bins, "bins")
    return reliability_of(Predictive(pred, y), bins)


def reliability_of(pp: Predictive, bins: int) -> dict[str, Tensor]:
    """`reliability` of validated predictions."""
    conf = pp.top[0]
    count, conf_sum, correct_sum = bin_sums(conf, pp.correct, bins)
    nonempty = count > 0
    nan = torch.tensor(float("nan"), dtype=torch.float64, device=conf.device)
    denom = count.clamp(min=1).double()
    return {
        "edges": bin_edges(bins, conf.device),
        "confidence": torch.where(nonempty, conf_sum / denom, nan),
        "accuracy": torch.where(nonempty, correct_sum / denom, nan),
        "count": count,
    }


def bin_edges(bins: int, device: torch.device | None = None) -> Tensor:
    """The bin edges i / bins, i = 0 .. bins, `[bins + 1]` float64 (each correctly rounded)."""
    return torch.arange(bins + 1, dtype=torch.float64, device=device) / bins


def bin_sums(conf: Tensor, correct: Tensor, bins: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-bin count (int64), sum of confidences and number correct (float64), each `[bins]`,
    of confidences `conf` `[N]` float64 and correctness `correct` `[N]` bool: the sufficient
    statistics of the reliability diagram, ECE and MCE (one-shot and streaming)."""
    # right=False: a value equal to an inner edge gets the lower bin; 1.0 gets the last bin.
    idx = torch.bucketize(conf, bin_edges(bins, conf.device)[1:-1], right=False)
    count = torch.bincount(idx, minlength=bins)
    conf_sum = torch.bincount(idx, conf, minlength=bins)
    return count, conf_sum, torch.bincount(idx, correct.double(), minlength=bins)


def _bin_gaps(
    confidence: Any, accuracy: Any, count: Any, min_count: int
) -> tuple[Tensor, Tensor, Tensor]:
    """|accuracy - confidence| and count of the bins with >= `min_count` points, and N."""
    min_count = check_positive_int(min_count, "min_count")
    confidence, accuracy, count = (torch.as_tensor(t) for t in (confidence, accuracy, count))
    keep = count >= min_count
    gaps = (accuracy - confidence).abs()
    return gaps[keep], count[keep], count.sum()


def binned_ece(confidence: Any, accuracy: Any, count: Any, min_count: int = 1) -> float:
    """ECE from per-bin statistics (as `reliability` returns them): Σ_b (n_b / N) |acc_b - conf_b|.

    `ece` is this applied to `reliability(pred, y, bins)`, and reliability diagrams
    (`peg.plots.reliability_diagram`) title their panels with it, so the two always agree.

    Args:
        confidence, accuracy: per-bin mean confidence and accuracy `[B]` (NaN in empty bins).
        count: points per bin `[B]`; N is their sum.
        min_count: bins with fewer points are dropped from the sum (N stays the total).
    """
    gaps, count, n = _bin_gaps(confidence, accuracy, count, min_count)
    return float((count.double() * gaps).sum() / n)


def ece(pred: Any, y: Any, bins: int = 15, min_count: int = 1) -> float:
    """Expected calibration error, Σ_b (n_b / N) |acc_b - conf_b|, a fraction in [0, 1].

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.
        bins: number of equal-width bins.
        min_count: bins with fewer points are dropped from the sum; N stays the total number
            of points, so dropped bins contribute 0 rather than being renormalised away.
    """
    check_positive_int(min_count, "min_count")  # before binning, so a bad value fails first
    bins = check_positive_int(bins, "bins")
    return ece_of(Predictive(pred, y), bins, min_count)


def ece_of(pp: Predictive, bins: int, min_count: int) -> float:
    """`ece` of validated predictions."""
    r = reliability_of(pp, bins)
    return binned_ece(r["confidence"], r["accuracy"], r["count"], min_count)


def binned_mce(confidence: Any, accuracy: Any, count: Any, min_count: int = 1) -> float:
    """MCE from per-bin statistics (as `reliability` returns them): max_b |acc_b - conf_b| over
    bins with >= `min_count` points, 0.0 if there is none (`mce` is this on `reliability`)."""
    gaps, _, _ = _bin_gaps(confidence, accuracy, count, min_count)
    return float(gaps.max()) if gaps.numel() else 0.0


def mce(pred: Any, y: Any, bins: int = 15, min_count: int = 1) -> float:
    """Maximum calibration error, max_b |acc_b - conf_b| over bins with >= `min_count` points.

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.
        bins: number of equal-width bins.
        min_count: smallest bin counted; 0.0 if no bin has that many points.
    """
    check_positive_int(min_count, "min_count")  # before binning, so a bad value fails first
    bins = check_positive_int(bins, "bins")
    return mce_of(Predictive(pred, y), bins, min_count)


def mce_of(pp: Predictive, bins: int, min_count: int) -> float:
    """`mce` of validated predictions."""
    r = reliability_of(pp, bins)
    return binned_mce(r["confidence"], r["accuracy"], r["count"], min_count)
