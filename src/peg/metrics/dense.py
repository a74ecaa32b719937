"""Metrics of dense predictions (segmentation maps, volumes, token sequences): one prediction
per position, logits `[B, C, *S]` against labels `[B, *S]`, positions whose label is
`ignore_index` (default -100, torch's `cross_entropy` default; 255 in Cityscapes and VOC) left
out.

Every position is a row of the multi-class metrics (logits `[B, C, *S]` -> rows `[R, C]`, C
moved last, the positions kept): NLL, error, Brier, ECE and MCE per position are those of
`peg.metrics` on the rows, computed by the same code, streamed (`DenseMetrics`: batch by batch,
its state the sums of `peg.metrics.streaming.StreamingMetrics`, O(bins) numbers, whatever the
number of positions). `dense_metrics` is the one-shot form: the stream fed once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from peg.metrics.streaming import StreamingMetrics
from peg.source._values import as_tensor, check_labels

IGNORE_INDEX = -100  # torch's cross_entropy default
DENSE_METRICS = ("nll", "error", "brier", "ece", "mce")


def dense_rows(
    logits: Any,
    y: Any,
    ignore_index: int = IGNORE_INDEX,
    members: bool = False,
    class_dim: int = 1,
) -> tuple[Tensor, Tensor]:
    """The positions kept as rows: (logits `[M, R, C]`, labels `[R]` int64 in `[0, C)`).

    Args:
        logits: `[B, C, *S]` (one model: M = 1), or member logits `[M, B, C, *S]` with
            `members=True`; any floating dtype, kept (the metrics compute in float64).
        y: labels `[B, *S]`: class indices in `[0, C)`, or `ignore_index`.
        ignore_index: the label of positions left out.
        class_dim: where the classes are: 1 (`[B, C, *S]`, torch's layout) or -1
            (`[B, *S, C]`, a language model's `[B, T, V]`).

    R may be 0 (every position ignored): the caller decides whether that is an error.
    """
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise ValueError(f"ignore_index: expected an integer label, got {ignore_index!r}")
    if class_dim not in (1, -1):
        raise ValueError(f"class_dim: expected 1 or -1, got {class_dim!r}")
    z = as_tensor(logits, "logits")
    lead = 1 if members else 0
    if z.ndim < 2 + lead or not z.is_floating_point():
        layout = "[B, C, *S]" if class_dim == 1 else "[B, *S, C]"
        want = f"member logits [M, {layout[1:]}" if members else f"logits {layout}"
        raise ValueError(
            f"logits: expected floating-point {want}, got shape {tuple(z.shape)} ({z.dtype})"
        )
    dim = 1 + lead if class_dim == 1 else z.ndim - 1
    classes = z.shape[dim]
    t = as_tensor(y, "y", z.device, owner="pred")
    want_shape = (*z.shape[lead:dim], *z.shape[dim + 1 :])
    if tuple(t.shape) != want_shape:
        raise ValueError(
            f"y: expected labels [B, *S] = {list(want_shape)} for logits of shape "
            f"{tuple(z.shape)} (C = {classes} in dim {dim}), got {tuple(t.shape)}"
        )
    keep = t != ignore_index
    labels = check_labels(t[keep], None, classes, "y", z.device) if bool(keep.any()) else None
    rows = z.movedim(dim, -1)  # [M?, B, *S, C]: a view, the kept rows copied once below
    rows = rows[:, keep] if members else rows[keep][None]
    if labels is None:
        return rows, torch.zeros(0, dtype=torch.int64, device=z.device)
    return rows, labels


class DenseMetrics:
    """NLL, error, Brier, ECE and MCE per position of dense predictions, batch by batch.

        stream = DenseMetrics()
        for x, y in loader:                 # y [B, H, W], 255 where unlabelled
            stream.update(model(x), y)      # logits [B, C, H, W]
        stream.compute()                    # {"nll", "error", "brier", "ece", "mce"}

    Args:
        bins, min_count: the ECE/MCE binning (as `peg.metrics.ece`).
        metrics: keys of `peg.metrics.CLASSIFICATION_METRICS` (None: `DENSE_METRICS`);
            "adaptive_ece", "aurc" and "augrc" keep two scalars per position (a global
            sort), the others O(bins) numbers.
        ignore_index: the label of positions left out.
        members: `update` takes member logits `[M, B, C, *S]` (an ensemble) instead of
            `[B, C, *S]`.
        class_dim: 1 (`[B, C, *S]`) or -1 (the classes last, `[B, *S, C]`: a language
            model's `[B, T, V]`).
    """

    def __init__(
        self,
        bins: int = 15,
        min_count: int = 1,
        metrics: str | Iterable[str] | None = None,
        ignore_index: int = IGNORE_INDEX,
        members: bool = False,
        class_dim: int = 1,
    ) -> None:
        self.stream = StreamingMetrics(
            bins, min_count, DENSE_METRICS if metrics is None else metrics
        )
        self.ignore_index, self.members, self.class_dim = ignore_index, bool(members), class_dim

    def update(self, logits: Any, y: Any) -> None:
        """Add a batch: logits `[B, C, *S]` (member logits `[M, B, C, *S]` with `members`),
        labels `[B, *S]`; a batch whose every position is ignored adds nothing."""
        rows, labels = dense_rows(logits, y, self.ignore_index, self.members, self.class_dim)
        if len(labels):
            self.stream.update(rows, labels)

    def compute(self) -> dict[str, float]:
        """The selected metrics of every position added so far, not ignored."""
        if self.stream.n == 0:
            raise ValueError(
                f"y: no position to score (no batch added, or every label is ignore_index="
                f"{self.ignore_index})"
            )
        return self.stream.compute()


def dense_metrics(
    logits: Any,
    y: Any,
    bins: int = 15,
    min_count: int = 1,
    metrics: str | Iterable[str] | None = None,
    ignore_index: int = IGNORE_INDEX,
    class_dim: int = 1,
) -> dict[str, float]:
    """NLL, error, Brier, ECE and MCE (or `metrics`) per position of logits `[B, C, *S]` (or
    `[B, *S, C]` with `class_dim=-1`) on labels `[B, *S]`, over the positions whose label is
    not `ignore_index` (`DenseMetrics` fed once)."""
    stream = DenseMetrics(bins, min_count, metrics, ignore_index, class_dim=class_dim)
    stream.update(logits, y)
    return stream.compute()
