"""Calibration: reliability diagram, ECE and MCE of the top-class confidence; adaptive
(equal-mass) ECE; classwise ECE.

Bins are equal-width on [0, 1] and right-closed, (lo, hi], except that the first bin also
holds confidence 0; confidence 1 is in the last bin. Edges are i / bins (correctly rounded),
so a float64 confidence equal to an edge such as 0.2 goes to the bin below it. The adaptive
ECE's bins are equal-mass instead (`adaptive_ece`); the classwise ECE bins every class's
probability with the equal-width bins above (`classwise_ece`).

`bin_sums` gathers the per-bin statistics and `binned_ece` / `binned_mce` compute ECE and MCE
from them; `ece`, `mce`, `peg.metrics.streaming.StreamingMetrics` and the reliability diagrams of
`peg.plots` all go through them (`adaptive_bin_sums` and `classwise_bin_sums` likewise for the
other two).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from peg.metrics._predictive import Predictive, Ranked
from peg.utils.scalars import check_positive_int


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
    return reliability_from(pp.top[0], pp.correct, bins)


def reliability_from(conf: Tensor, correct: Tensor, bins: int) -> dict[str, Tensor]:
    """`reliability` from the top-class confidences `conf` `[N]` (float64) and whether each
    prediction is right, `correct` `[N]` (bool): what a diagram needs of predictions kept
    without their probabilities (AutoSelect's cross-fitted ones)."""
    return reliability_of_sums(*bin_sums(conf, correct, bins))


def reliability_of_sums(count: Tensor, conf_sum: Tensor, correct_sum: Tensor) -> dict[str, Tensor]:
    """`reliability` from the per-bin sums of `bin_sums` (`[bins]`, or `[G, bins]` per group:
    each key but "edges" then `[G, bins]`)."""
    nonempty = count > 0
    nan = torch.tensor(float("nan"), dtype=torch.float64, device=count.device)
    denom = count.clamp(min=1).double()
    return {
        "edges": bin_edges(count.shape[-1], count.device),
        "confidence": torch.where(nonempty, conf_sum / denom, nan),
        "accuracy": torch.where(nonempty, correct_sum / denom, nan),
        "count": count,
    }


def bin_edges(bins: int, device: torch.device | None = None) -> Tensor:
    """The bin edges i / bins, i = 0 .. bins, `[bins + 1]` float64 (each correctly rounded)."""
    return torch.arange(bins + 1, dtype=torch.float64, device=device) / bins


def bin_sums(
    conf: Tensor, correct: Tensor, bins: int, group: Tensor | None = None, groups: int = 1
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-bin count (int64), sum of confidences and number correct (float64), each `[bins]`,
    of confidences `conf` `[N]` float64 and correctness `correct` `[N]` bool: the sufficient
    statistics of the reliability diagram, ECE and MCE (one-shot and streaming). With `group`
    `[N]` (int64 in `[0, groups)`: a multi-label head's label), the same per group, each
    `[groups, bins]`."""
    # right=False: a value equal to an inner edge gets the lower bin; 1.0 gets the last bin.
    idx = torch.bucketize(conf, bin_edges(bins, conf.device)[1:-1], right=False)
    if group is not None:
        idx = idx + group * bins  # group g's bins start at g·bins
    cells = bins * groups
    sums = (
        torch.bincount(idx, minlength=cells),
        torch.bincount(idx, conf, minlength=cells),
        torch.bincount(idx, correct.double(), minlength=cells),
    )
    if group is None:
        return sums
    return sums[0].view(groups, bins), sums[1].view(groups, bins), sums[2].view(groups, bins)


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


def adaptive_ece(pred: Any, y: Any, bins: int = 15) -> float:
    """ECE with equal-mass bins of the top-class confidence, Σ_b (n_b / N) |acc_b - conf_b|.

    The points sorted by confidence are cut into `bins` runs of (nearly) equal size: bin b
    holds the sorted positions ⌊bN/B⌋ <= i < ⌊(b+1)N/B⌋ (sizes differ by at most one; with
    more bins than points some are empty and count 0). Tied confidences do not depend on the
    order of the points: a tie group cut by a bin boundary is shared between the bins in
    proportion to the positions it covers, each share carrying the group's accuracy (the bin
    statistics averaged over the orders of the tied points). The adaptive ECE of Nixon et al.
    2019 ("Measuring calibration in deep learning") restricted to the top label, as
    torch-uncertainty's `AdaptiveCalibrationError`; see docs/metrics.md for how libraries
    differ.

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.
        bins: number of equal-mass bins.
    """
    bins = check_positive_int(bins, "bins")
    return adaptive_ece_of(Predictive(pred, y).ranked, bins)


def adaptive_ece_of(r: Ranked, bins: int) -> float:
    """`adaptive_ece` of ranked points (`peg.metrics._predictive.ranked`)."""
    count, conf_sum, correct_sum = adaptive_bin_sums(r, bins)
    denom = count.clamp(min=1).double()  # empty bins (NaN-free here) are left out by count 0
    return binned_ece(conf_sum / denom, correct_sum / denom, count)


def adaptive_bin_sums(r: Ranked, bins: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per equal-mass bin (`adaptive_ece`) the count (int64), the sum of confidences and the
    number correct (float64), each `[bins]`, from lowest to highest confidence.

    Cumulative sums over the sorted points, read at the bin boundaries; within a tie group they
    grow linearly (the group's confidence, and its accuracy, per position)."""
    value, size = r.threshold.flip(0), r.count.flip(0)  # increasing confidence
    hits = (r.count - r.errors).flip(0)
    ends = size.cumsum(0)  # the position after each group
    n = int(ends[-1])
    bounds = torch.arange(bins + 1, device=ends.device) * n // bins  # [bins + 1] positions
    done = torch.searchsorted(ends, bounds, right=True)  # groups wholly before each boundary
    zero = ends.new_zeros(1)
    start = torch.cat([zero, ends])[done]
    part = (bounds - start).double()  # positions of the cut group before the boundary
    g = done.clamp(max=len(size) - 1)
    conf = torch.cat([zero.double(), (value * size).cumsum(0)])[done] + part * value[g]
    hit = torch.cat([zero, hits.cumsum(0)])[done].double() + part * hits[g] / size[g]
    return bounds.diff(), conf.diff(), hit.diff()


def classwise_ece(pred: Any, y: Any, bins: int = 15) -> float:
    """Classwise ECE (Kull et al. 2019, "Beyond temperature scaling", Sec. 5): for each class c,
    the equal-width binned calibration error of p̄_c against 1[y = c] over all N points,
    averaged over the C classes: (1/C) Σ_c Σ_b (n_cb / N) |freq_cb - conf_cb|, with freq_cb
    the fraction of bin (c, b) labelled c and conf_cb its mean p̄_c. Bins as `ece` (equal
    width, right-closed); a fraction in [0, 1].

    Args:
        pred: probabilities `[N, C]` or member logits `[M, N, C]`.
        y: labels `[N]`.
        bins: equal-width bins per class.
    """
    bins = check_positive_int(bins, "bins")
    return binned_classwise_ece(*classwise_bin_sums(Predictive(pred, y), bins))


def classwise_bin_sums(pp: Predictive, bins: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per class and bin the count, the sum of p̄_c and the number labelled c, `[C, bins]`
    each (int64, float64, int64): the sufficient statistics of `classwise_ece`, gathered a
    block of rows at a time (`Predictive.blocks`, no `[N, C]` float64 copy)."""
    c = pp.num_classes
    inner = bin_edges(bins, pp.labels.device)[1:-1]
    offset = torch.arange(c, device=pp.labels.device) * bins  # class c's bins start at c·bins
    count = torch.zeros(c * bins, dtype=torch.int64, device=pp.labels.device)
    conf, hits = count.double(), count.clone()
    for rows, p in pp.blocks():
        idx = torch.bucketize(p, inner, right=False) + offset  # as `bin_sums`
        count += torch.bincount(idx.flatten(), minlength=c * bins)
        conf += torch.bincount(idx.flatten(), p.flatten(), minlength=c * bins)
        labelled = idx.gather(1, pp.labels[rows, None]).squeeze(1)  # the bin of p̄_y, class y
        hits += torch.bincount(labelled, minlength=c * bins)
    return count.view(c, bins), conf.view(c, bins), hits.view(c, bins)


def binned_classwise_ece(count: Tensor, conf_sum: Tensor, hits: Tensor) -> float:
    """`classwise_ece` from per-class bin sums `[C, B]` (`classwise_bin_sums`):
    (n_cb / N) |hits_cb / n_cb - conf_cb / n_cb| = |hits_cb - conf_cb| / N, averaged over C."""
    n = count[0].sum()  # every class bins all N points
    return float((hits.double() - conf_sum).abs().sum() / (n * count.shape[0]))
