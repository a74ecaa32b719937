"""Metrics accumulated batch by batch, equal to the one-shot ones.

    stream = StreamingMetrics(bins=15)                   # metrics=[...] selects others
    for x, y in loader:
        stream.update(ensemble.member_logits(x), y)     # or probabilities [B, C]
    stream.compute()   # {"nll", "error", "brier", "ece", "mce"} (+ "gibbs_nll" for members)

The state is sums (NLL, Brier, errors, Gibbs NLL, count) and, per confidence bin, the count, the
sum of confidences and the number correct — the sufficient statistics of the one-shot
`peg.metrics` functions, computed by the same code (`peg.metrics._predictive.Predictive` per
row, `peg.metrics.calibration.bin_sums` per bin): O(bins) numbers. The classwise ECE streams
exactly too, from per-class bin sums (`[C, bins]`, `classwise_bin_sums`). The adaptive ECE,
AURC and AUGRC need a global sort by confidence: when selected, each point's confidence
(float64) and correctness (bool) are kept, O(N) scalars (9 bytes a point), never `[N, C]`, and
`compute` ranks them with the one-shot code (`ranked`), so they equal the one-shot values.
OOD scores are kept per sample (`StreamingOOD`), since AUROC/AUPR need their ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from peg.metrics._inputs import as_pred
from peg.metrics._keys import RANKED, check_metrics
from peg.metrics._predictive import NothingKept, Predictive, ranked
from peg.metrics.calibration import (
    adaptive_ece_of,
    bin_sums,
    binned_classwise_ece,
    binned_ece,
    binned_mce,
    classwise_bin_sums,
)
from peg.metrics.ood import OOD_SCORES, aupr, auroc, fpr_at_tpr
from peg.metrics.selective import augrc_of, aurc_of
from peg.utils.scalars import check_positive_int


class StreamingMetrics:
    """The classification metrics of `peg.metrics.classification_metrics` over batches.

    Args:
        bins: the bins of the ECE, MCE (equal width), adaptive ECE (equal mass) and classwise
            ECE (as `peg.metrics.ece`, `adaptive_ece`, `classwise_ece`).
        min_count: bins with fewer points are left out of ECE/MCE (as `peg.metrics.ece`).
        metrics: keys of `peg.metrics.CLASSIFICATION_METRICS` (None: `DEFAULT_METRICS`,
            "nll", "error", "brier", "ece", "mce", "gibbs_nll"; "gibbs_nll" for member logits
            only). "adaptive_ece", "aurc" and "augrc" keep O(N) scalars (module docstring).
        ignore_index: points labelled so are left out (default -100, torch's).
    """

    def __init__(
        self,
        bins: int = 15,
        min_count: int = 1,
        metrics: str | Iterable[str] | None = None,
        ignore_index: int = -100,
    ) -> None:
        self.ignore_index = ignore_index
        self.bins = check_positive_int(bins, "bins")
        self.min_count = check_positive_int(min_count, "min_count")
        self.metrics = check_metrics(metrics)
        self.reset()

    def reset(self) -> None:
        self.n = 0
        self.num_classes: int | None = None
        self.sums = {"nll": 0.0, "errors": 0.0, "brier": 0.0, "gibbs_nll": 0.0}
        self.members = False
        self.bin_count = torch.zeros(self.bins, dtype=torch.float64)
        self.bin_conf = torch.zeros(self.bins, dtype=torch.float64)
        self.bin_correct = torch.zeros(self.bins, dtype=torch.float64)
        self.classwise: list[Tensor] = []  # [C, bins] count, sum of p̄_c, labelled c
        self.confidence: list[Tensor] = []  # per batch [B] float64 (the ranked metrics)
        self.correct: list[Tensor] = []  # per batch [B] bool

    def update(self, pred: Any, y: Any) -> None:
        """Add a batch: probabilities `[B, C]` or member logits `[M, B, C]`, labels `[B]`."""
        try:  # validated; the one-shot metrics' per-row quantities
            pp = Predictive(pred, y, ignore_index=self.ignore_index)
        except NothingKept:  # a batch of ignored labels only (padding): nothing to add
            return
        if self.num_classes is None:
            self.num_classes, self.members = pp.num_classes, pp.members
        elif self.num_classes != pp.num_classes or pp.members != self.members:
            raise ValueError(
                f"pred: every batch must have the same kind and classes; first [.., "
                f"{self.num_classes}], members={self.members}; got shape {tuple(pp.shape)}"
            )
        keys = self.metrics
        if pp.members and "gibbs_nll" in keys:
            self.sums["gibbs_nll"] += float(-pp.member_true_log.mean(0).sum())
        if "nll" in keys:
            self.sums["nll"] += float(-pp.true_log_prob.sum())
        self.sums["errors"] += float((~pp.correct).sum())
        if "brier" in keys:
            self.sums["brier"] += float(pp.squared_error.sum())
        if "ece" in keys or "mce" in keys:
            count, conf_sum, correct_sum = (
                s.cpu() for s in bin_sums(pp.top[0], pp.correct, self.bins)
            )
            self.bin_count += count.double()
            self.bin_conf += conf_sum
            self.bin_correct += correct_sum
        if "classwise_ece" in keys:
            sums = [s.cpu() for s in classwise_bin_sums(pp, self.bins)]
            old = self.classwise or [torch.zeros_like(s) for s in sums]
            self.classwise = [a + b for a, b in zip(old, sums, strict=True)]
        if RANKED.intersection(keys):
            self.confidence.append(pp.top[0].cpu())
            self.correct.append(pp.correct.cpu())
        self.n += len(pp.labels)

    def compute(self) -> dict[str, float]:
        """The selected metrics of everything added so far (as
        `peg.metrics.classification_metrics`)."""
        if self.n == 0:
            raise ValueError("pred: no batches were added (0 samples)")
        bins = (  # per-bin confidence, accuracy (NaN in empty bins, left out) and count
            self.bin_conf / self.bin_count,
            self.bin_correct / self.bin_count,
            self.bin_count,
        )
        r = None
        if RANKED.intersection(self.metrics):
            r = ranked(torch.cat(self.confidence), torch.cat(self.correct))
        compute: dict[str, Callable[[], float]] = {
            "nll": lambda: self.sums["nll"] / self.n,
            "error": lambda: self.sums["errors"] / self.n,
            "brier": lambda: self.sums["brier"] / self.n,
            "ece": lambda: binned_ece(*bins, self.min_count),
            "mce": lambda: binned_mce(*bins, self.min_count),
            "gibbs_nll": lambda: self.sums["gibbs_nll"] / self.n,
            "adaptive_ece": lambda: adaptive_ece_of(r, self.bins),
            "classwise_ece": lambda: binned_classwise_ece(*self.classwise),
            "aurc": lambda: aurc_of(r),
            "augrc": lambda: augrc_of(r),
        }
        return {k: compute[k]() for k in self.metrics if k != "gibbs_nll" or self.members}


class StreamingOOD:
    """OOD scores gathered batch by batch (kept per sample: AUROC and AUPR need their ranks)."""

    def __init__(self, score: str = "entropy") -> None:
        if score not in OOD_SCORES:
            raise ValueError(f"score: expected one of {sorted(OOD_SCORES)}, got {score!r}")
        self.score = score
        self.scores: dict[str, list[Tensor]] = {"in": [], "out": []}
        self.num_classes: int | None = None

    def update(self, pred: Any, ood: bool) -> None:
        """Add a batch of in-distribution (`ood=False`) or OOD (`ood=True`) predictions."""
        C = as_pred(pred).shape[-1]
        if self.num_classes is not None and self.num_classes != C:
            raise ValueError(
                f"pred: every batch must have the same number of classes; first {self.num_classes}"
                f", got {C}"
            )
        self.num_classes = C
        self.scores["out" if ood else "in"].append(OOD_SCORES[self.score](pred).cpu())

    def compute(self) -> dict[str, float | str]:
        """AUROC, AUPR (OOD and in-distribution positive) and FPR95; OOD is the positive class."""
        if not self.scores["in"] or not self.scores["out"]:
            raise ValueError("scores: add both in-distribution and OOD batches first")
        s_in, s_out = torch.cat(self.scores["in"]), torch.cat(self.scores["out"])
        return {
            "auroc": auroc(s_in, s_out),
            "aupr_out": aupr(s_in, s_out, "ood"),
            "aupr_in": aupr(s_in, s_out, "in"),
            "fpr95": fpr_at_tpr(s_in, s_out, 0.95),
            "positive": "ood",
            "score": self.score,
        }


__all__ = ["StreamingMetrics", "StreamingOOD"]
