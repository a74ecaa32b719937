"""The metrics of member logits of a kind read by `peg.source._kinds.read_kind` (what
`peg.evaluate` reports for saved logits, and for a calibrator fitted on them, that are not
multiclass), batch by batch (`KindMetrics`) or at once (`kind_metrics`):

- binary (scores `[M, N]` or `[M, N, 1]`, labels 0/1) and multilabel (`[M, N, K]`, multi-hot):
  the metrics of `peg.metrics.binary` on P(y = 1), the members' sigmoids averaged
  (`Kind.proba`); the NLL from the logits themselves, the multi-class NLL of the canonical rows
  `[0, s]` (`Kind.rows`; log-softmax: finite where sigmoid(s) rounds to 0 or 1 in float64,
  |s| > 37; the members averaged in probability, as every ensemble NLL of peg). AUROC needs
  every score's rank: P(y = 1) and the label of each entry are kept, O(N·K) scalars;
- dense (`[M, B, C, *S]` or `[M, B, *S, C]`, labels `[B, *S]`): `peg.metrics.dense.DenseMetrics`,
  O(bins) numbers.

Labels equal to the kind's `ignore_index` are left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from peg.metrics.binary import (
    BINARY_METRICS,
    MULTILABEL_METRICS,
    binary_metrics,
    check_keys,
    multilabel_metrics,
)
from peg.metrics.dense import DenseMetrics
from peg.metrics.streaming import StreamingMetrics
from peg.source._kinds import Kind
from peg.source._values import as_tensor, check_finite_logits
from peg.utils.scalars import check_positive_int


class KindMetrics:
    """The metrics of `kind` over batches: `update(member logits [M, *shape], labels)`, then
    `compute()` (binary `peg.metrics.BINARY_METRICS`, multilabel `MULTILABEL_METRICS` with
    "label_ece" a tensor `[K]`, dense `DENSE_METRICS`; or `metrics`, the kind's keys)."""

    def __init__(
        self,
        kind: Kind,
        bins: int = 15,
        min_count: int = 1,
        metrics: str | Iterable[str] | None = None,
    ) -> None:
        if kind.kind == "multiclass":
            raise ValueError("kind: multiclass logits are StreamingMetrics'")
        self.kind, self.bins, self.min_count = kind, bins, min_count
        self.dense, self.nll = None, None
        if kind.kind == "dense":
            self.dense = DenseMetrics(
                bins, min_count, metrics, kind.ignore_index, members=True, class_dim=kind.class_dim
            )
            return
        known = BINARY_METRICS if kind.kind == "binary" else MULTILABEL_METRICS
        self.metrics = check_keys(metrics, known)  # before any batch is read
        # P(y = 1) and labels per batch (AUROC ranks them); the rows' NLL, summed
        self.probs: list[Tensor] = []
        self.labels: list[Tensor] = []
        if "nll" in self.metrics:
            self.nll = StreamingMetrics(bins, min_count, ["nll"], kind.ignore_index)

    def update(self, logits: Any, labels: Any) -> None:
        """Add a batch: member logits `[M, *shape]` (`shape` the kind's), labels in the kind's
        shape (`[B]`, `[B, 1]`, `[B, K]` or `[B, *S]`)."""
        z = as_tensor(logits, "logits")
        self.kind.check(tuple(z.shape[1:]), "logits")
        check_finite_logits(z, "logits")
        y = as_tensor(labels, "labels", z.device, owner="pred")
        if self.dense is not None:
            self.dense.update(z, y)
            return
        shape = (-1,) if self.kind.kind == "binary" else (-1, self.kind.outputs)
        self.probs.append(self.kind.proba(z.double()).reshape(shape).cpu())
        self.labels.append(y.reshape(shape).cpu())
        if self.nll is not None:  # ignored rows left out there
            self.nll.update(self.kind.rows(z.double()), self.kind.row_labels(y))

    def compute(self) -> dict[str, Any]:
        if self.dense is not None:
            return self.dense.compute()
        if not self.probs:
            raise ValueError("logits: no batches were added (0 samples)")
        score = binary_metrics if self.kind.kind == "binary" else multilabel_metrics
        p, y = torch.cat(self.probs), torch.cat(self.labels)
        out = score(p, y, self.bins, self.min_count, self.metrics, self.kind.ignore_index)
        if self.nll is not None:
            out["nll"] = self.nll.compute()["nll"]
        return out


def kind_metrics(
    logits: Any,
    labels: Any,
    kind: Kind,
    bins: int = 15,
    min_count: int = 1,
    metrics: str | Iterable[str] | None = None,
    batch_size: int = 512,
) -> dict[str, Any]:
    """The metrics of one model's `logits` (in `kind`'s shape) on `labels`, by key
    (`KindMetrics` fed `batch_size` rows at a time: a float64 copy of one chunk at a time)."""
    batch_size = check_positive_int(batch_size, "batch_size")
    z = as_tensor(logits, "logits")
    y = as_tensor(labels, "labels", z.device, owner="pred")
    stream = KindMetrics(kind, bins, min_count, metrics)
    for start in range(0, max(len(z), 1), batch_size):
        stream.update(z[None, start : start + batch_size], y[start : start + batch_size])
    return stream.compute()
