"""Metrics of binary scorers and multi-label heads, on P(y = 1): pure functions, in float64.

A binary scorer gives `p` `[N]` (or `[N, 1]`), the probability of class 1, with labels `y` of
the same shape, 0 or 1; a multi-label head gives independent probabilities `p` `[N, K]` with
multi-hot labels `y` `[N, K]`. Labels equal to `ignore_index` (default -100, torch's
`cross_entropy` default) are left out, entry by entry. Every multi-label metric is the binary
one over every label entry (N·K of them, pooled), so the two share one implementation:

- `binary_nll`: mean of -log P(y) (= -[y log p + (1 - y) log(1 - p)]); +inf where the label's
  probability is 0;
- `binary_brier`: mean of (p - y)², in [0, 1] (the multi-class `brier` of the two columns
  (1 - p, p) is twice this);
- `binary_reliability` / `binary_ece` / `binary_mce`: p against the fraction of 1s, binned
  as every ECE of peg is (`peg.metrics.calibration.bin_sums`: equal width, right-closed),
  the dict as `peg.metrics.reliability`'s ("accuracy" is the fraction of labels 1 in a bin);
- `binary_error`: the fraction misclassified by p > 1/2 (p = 1/2 predicts 0, as the argmax of
  (1 - p, p) does);
- `binary_auroc`: the probability that a random 1 scores above a random 0, ties counting 1/2
  (scikit-learn's `roc_auc_score`);
- `binary_metrics`: the selected ones by key (`BINARY_METRICS`);
- multi-label: `multilabel_nll`, `multilabel_brier`, `multilabel_ece` (pooled over entries),
  `label_ece` (`[K]`, each label's own), `multilabel_reliability` (pooled, or per label),
  `multilabel_metrics` (`MULTILABEL_METRICS`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from peg.metrics.calibration import bin_sums, binned_ece, binned_mce, reliability_of_sums
from peg.metrics.ood import auroc
from peg.source._values import as_tensor
from peg.utils.scalars import check_positive_int

IGNORE_INDEX = -100  # torch's cross_entropy default
BINARY_METRICS = ("nll", "brier", "ece", "mce", "error", "auroc")
MULTILABEL_METRICS = ("nll", "brier", "ece", "mce", "error", "label_ece")


class Entries(NamedTuple):
    """The entries kept (labels not `ignore_index`): P(y = 1) `[E]` float64, labels `[E]`
    bool, each entry's label (column) `[E]` int64 (0 for a binary scorer), and the number of
    labels K (1 for a binary scorer)."""

    p: Tensor
    y: Tensor
    label: Tensor
    labels: int


def entries(p: Any, y: Any, ignore_index: int = IGNORE_INDEX, multilabel: bool = False) -> Entries:
    """`p` and `y` checked (`checked`) and flattened to the entries kept."""
    t, labels = checked(p, y, ignore_index, multilabel)
    keep = labels != ignore_index
    if not bool(keep.any()):
        raise ValueError(f"y: every label is ignore_index ({ignore_index}): nothing to score")
    k = t.shape[1] if t.ndim == 2 else 1
    column = torch.arange(k, device=t.device).expand_as(t)
    return Entries(t[keep], labels[keep] == 1, column[keep], k)


def checked(
    p: Any, y: Any, ignore_index: int = IGNORE_INDEX, multilabel: bool = False
) -> tuple[Tensor, Tensor]:
    """(`p` float64, `y` int64 on `p`'s device), both of `p`'s shape, checked: binary `p`
    `[N]` or `[N, 1]`, multi-label `[N, K]`, probabilities in [0, 1]; `y` of `p`'s shape, its
    values 0, 1 or `ignore_index` (integers, whole floats or bools)."""
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise ValueError(f"ignore_index: expected an integer label, got {ignore_index!r}")
    t = check_probs(p, multilabel)
    return t, _labels(y, t, ignore_index)


def check_probs(p: Any, multilabel: bool = False) -> Tensor:
    """`p` as float64, checked: binary `[N]` or `[N, 1]`, multi-label `[N, K]`, each a
    probability of class 1 in [0, 1]."""
    t = as_tensor(p, "p")
    want = "[N, K]" if multilabel else "[N] (or [N, 1])"
    ok = t.ndim == 2 if multilabel else t.ndim == 1 or (t.ndim == 2 and t.shape[1] == 1)
    if not ok or t.numel() == 0:
        raise ValueError(
            f"p: expected probabilities of class 1 {want}, got shape {tuple(t.shape)}"
            + ("" if multilabel or t.ndim != 2 else "; for a multi-label head, multilabel_*")
        )
    if t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"p: expected real probabilities, got dtype {t.dtype}")
    t = t.double()
    lo, hi = torch.stack(torch.aminmax(t)).tolist()  # NaN makes both NaN
    if lo != lo:
        raise ValueError("p: expected finite probabilities, got NaN")
    if not (lo >= 0.0 and hi <= 1.0):
        raise ValueError(
            f"p: expected probabilities of class 1 in [0, 1], got values in [{lo:g}, {hi:g}]; "
            "for scores (logits) pass torch.sigmoid(scores)"
        )
    return t


def _labels(y: Any, p: Tensor, ignore_index: int) -> Tensor:
    """`y` as int64 on `p`'s device, of `p`'s shape, each 0, 1 or `ignore_index`."""
    t = as_tensor(y, "y", p.device, owner="pred")
    if t.shape != p.shape:
        raise ValueError(
            f"y: expected labels of the shape of p {tuple(p.shape)}, got {tuple(t.shape)}"
        )
    if t.is_complex():
        raise ValueError(f"y: expected labels 0 or 1, got dtype {t.dtype}")
    if t.is_floating_point() and not bool((t == t.round()).all()):  # NaN is not whole
        raise ValueError("y: expected labels 0 or 1, got non-integer values")
    t = t.long()
    bad = (t != 0) & (t != 1) & (t != ignore_index)
    if bool(bad.any()):
        raise ValueError(
            f"y: expected labels 0 or 1 (or ignore_index={ignore_index}), got {int(t[bad][0])}"
        )
    return t


def nll_of(e: Entries) -> float:
    """Mean -log P(y) of the entries."""
    return float(torch.where(e.y, -e.p.log(), -torch.log1p(-e.p)).mean())


def brier_of(e: Entries) -> float:
    """Mean (p - y)² of the entries."""
    return float((e.p - e.y.double()).square().mean())


def error_of(e: Entries) -> float:
    """The fraction of entries misclassified by p > 1/2."""
    return float(((e.p > 0.5) != e.y).double().mean())


def reliability_of(e: Entries, bins: int, per_label: bool = False) -> dict[str, Tensor]:
    """Per bin of p: mean p ("confidence"), fraction of 1s ("accuracy"), count; pooled, or
    per label `[K, bins]` (`per_label`)."""
    if not per_label:
        return reliability_of_sums(*bin_sums(e.p, e.y, bins))
    return reliability_of_sums(*bin_sums(e.p, e.y, bins, e.label, e.labels))


def ece_of(e: Entries, bins: int, min_count: int) -> float:
    r = reliability_of(e, bins)
    return binned_ece(r["confidence"], r["accuracy"], r["count"], min_count)


def mce_of(e: Entries, bins: int, min_count: int) -> float:
    r = reliability_of(e, bins)
    return binned_mce(r["confidence"], r["accuracy"], r["count"], min_count)


def label_ece_of(e: Entries, bins: int, min_count: int) -> Tensor:
    """Each label's ECE `[K]` float64 (NaN for a label whose every entry is ignored)."""
    r = reliability_of(e, bins, per_label=True)
    out = torch.full((e.labels,), float("nan"), dtype=torch.float64)
    for k in range(e.labels):
        if int(r["count"][k].sum()) > 0:
            out[k] = binned_ece(r["confidence"][k], r["accuracy"][k], r["count"][k], min_count)
    return out


def auroc_of(e: Entries) -> float:
    if bool(e.y.all()) or not bool(e.y.any()):
        only = int(e.y[0])
        raise ValueError(
            f"y: AUROC needs labels of both classes among the entries not ignored; all are {only}"
        )
    return auroc(e.p[~e.y], e.p[e.y])  # class 1 ranked first (OOD's positive side)


def binary_nll(p: Any, y: Any, ignore_index: int = IGNORE_INDEX) -> float:
    """Mean binary NLL, -[y log p + (1 - y) log(1 - p)], of P(y = 1) `p` `[N]` on `y` `[N]`."""
    return nll_of(entries(p, y, ignore_index))


def binary_brier(p: Any, y: Any, ignore_index: int = IGNORE_INDEX) -> float:
    """Mean (p - y)² of P(y = 1) `p` `[N]` on labels `y` `[N]` (0/1), in [0, 1]."""
    return brier_of(entries(p, y, ignore_index))


def binary_error(p: Any, y: Any, ignore_index: int = IGNORE_INDEX) -> float:
    """The fraction of `y` `[N]` misclassified by p > 1/2 (`p` `[N]`: P(y = 1))."""
    return error_of(entries(p, y, ignore_index))


def binary_reliability(
    p: Any, y: Any, bins: int = 15, ignore_index: int = IGNORE_INDEX
) -> dict[str, Tensor]:
    """Per equal-width bin of P(y = 1) `p` `[N]`: "edges" `[bins + 1]`, "confidence" (mean p)
    and "accuracy" (fraction of labels 1) `[bins]` (NaN in empty bins), "count" `[bins]`: the
    data of `peg.plots.reliability_diagram`."""
    bins = check_positive_int(bins, "bins")
    return reliability_of(entries(p, y, ignore_index), bins)


def binary_ece(
    p: Any, y: Any, bins: int = 15, min_count: int = 1, ignore_index: int = IGNORE_INDEX
) -> float:
    """ECE of P(y = 1): Σ_b (n_b / N) |fraction of 1s_b - mean p_b|, equal-width bins of p
    (`min_count` as `peg.metrics.ece`)."""
    min_count = check_positive_int(min_count, "min_count")
    bins = check_positive_int(bins, "bins")
    return ece_of(entries(p, y, ignore_index), bins, min_count)


def binary_mce(
    p: Any, y: Any, bins: int = 15, min_count: int = 1, ignore_index: int = IGNORE_INDEX
) -> float:
    """MCE of P(y = 1): the largest |fraction of 1s_b - mean p_b| over bins of p."""
    min_count = check_positive_int(min_count, "min_count")
    bins = check_positive_int(bins, "bins")
    return mce_of(entries(p, y, ignore_index), bins, min_count)


def binary_auroc(p: Any, y: Any, ignore_index: int = IGNORE_INDEX) -> float:
    """Area under the ROC curve of `p` `[N]` ranking labels 1 above labels 0 (ties 1/2)."""
    return auroc_of(entries(p, y, ignore_index))


def check_keys(metrics: str | Iterable[str] | None, known: tuple[str, ...]) -> tuple[str, ...]:
    if metrics is None:
        return known
    keys = (metrics,) if isinstance(metrics, str) else tuple(dict.fromkeys(metrics))
    unknown = [k for k in keys if k not in known]
    if unknown or not keys:
        problem = f"unknown {unknown}" if unknown else "an empty selection"
        raise ValueError(f"metrics: {problem}; known: {list(known)}")
    return keys


def binary_metrics(
    p: Any,
    y: Any,
    bins: int = 15,
    min_count: int = 1,
    metrics: str | Iterable[str] | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> dict[str, float]:
    """The selected metrics of P(y = 1) `p` `[N]` on labels `y` `[N]`, by key
    (`BINARY_METRICS`: "nll", "brier", "ece", "mce", "error", "auroc"; None: all)."""
    keys = check_keys(metrics, BINARY_METRICS)
    bins = check_positive_int(bins, "bins")
    min_count = check_positive_int(min_count, "min_count")
    e = entries(p, y, ignore_index)
    compute: dict[str, Callable[[], float]] = {
        "nll": lambda: nll_of(e),
        "brier": lambda: brier_of(e),
        "ece": lambda: ece_of(e, bins, min_count),
        "mce": lambda: mce_of(e, bins, min_count),
        "error": lambda: error_of(e),
        "auroc": lambda: auroc_of(e),
    }
    return {k: compute[k]() for k in keys}


def multilabel_nll(p: Any, y: Any, ignore_index: int = IGNORE_INDEX) -> float:
    """Mean binary NLL over every label entry of `p` `[N, K]` on multi-hot `y` `[N, K]`."""
    return nll_of(entries(p, y, ignore_index, multilabel=True))


def multilabel_brier(p: Any, y: Any, ignore_index: int = IGNORE_INDEX) -> float:
    """Mean (p_nk - y_nk)² over every label entry of `p` `[N, K]` on `y` `[N, K]`."""
    return brier_of(entries(p, y, ignore_index, multilabel=True))


def multilabel_ece(
    p: Any, y: Any, bins: int = 15, min_count: int = 1, ignore_index: int = IGNORE_INDEX
) -> float:
    """ECE of the label entries of `p` `[N, K]` on `y` `[N, K]`, pooled (one set of bins)."""
    min_count = check_positive_int(min_count, "min_count")
    bins = check_positive_int(bins, "bins")
    return ece_of(entries(p, y, ignore_index, multilabel=True), bins, min_count)


def label_ece(
    p: Any, y: Any, bins: int = 15, min_count: int = 1, ignore_index: int = IGNORE_INDEX
) -> Tensor:
    """Each label's ECE `[K]` float64 of `p` `[N, K]` on `y` `[N, K]` (label k's column binned
    on its own; NaN for a label whose every entry is ignored)."""
    min_count = check_positive_int(min_count, "min_count")
    bins = check_positive_int(bins, "bins")
    return label_ece_of(entries(p, y, ignore_index, multilabel=True), bins, min_count)


def multilabel_reliability(
    p: Any, y: Any, bins: int = 15, per_label: bool = False, ignore_index: int = IGNORE_INDEX
) -> dict[str, Tensor]:
    """`binary_reliability` of every label entry of `p` `[N, K]` on `y` `[N, K]`, pooled
    (`[bins]`), or per label (`per_label=True`: each key but "edges" `[K, bins]`)."""
    bins = check_positive_int(bins, "bins")
    return reliability_of(entries(p, y, ignore_index, multilabel=True), bins, bool(per_label))


def multilabel_metrics(
    p: Any,
    y: Any,
    bins: int = 15,
    min_count: int = 1,
    metrics: str | Iterable[str] | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> dict[str, Any]:
    """The selected metrics of `p` `[N, K]` on multi-hot `y` `[N, K]`, by key
    (`MULTILABEL_METRICS`: "nll", "brier", "ece", "mce", "error" over every label entry,
    "label_ece" each label's ECE `[K]` (a tensor); None: all)."""
    keys = check_keys(metrics, MULTILABEL_METRICS)
    bins = check_positive_int(bins, "bins")
    min_count = check_positive_int(min_count, "min_count")
    e = entries(p, y, ignore_index, multilabel=True)
    compute: dict[str, Callable[[], Any]] = {
        "nll": lambda: nll_of(e),
        "brier": lambda: brier_of(e),
        "ece": lambda: ece_of(e, bins, min_count),
        "mce": lambda: mce_of(e, bins, min_count),
        "error": lambda: error_of(e),
        "label_ece": lambda: label_ece_of(e, bins, min_count),
    }
    return {k: compute[k]() for k in keys}
