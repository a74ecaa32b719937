"""`Predictive`: validated predictions and labels, and the per-row quantities the metrics need.

Every classification metric (`nll`, `error`, `brier`, `reliability` / `ece` / `mce`, one-shot
and `StreamingMetrics`) reads these `[N]` float64 quantities, each computed once per object:

- probabilities `[N, C]` are not copied to float64. p̄ = p / s with s the float64 row sums, and
  the division is applied to the `[N]` quantities only (max, true class) or a block of rows at
  a time (Brier). Dividing by s > 0 is correctly rounded and monotone, so max_c p_c / s equals
  max_c (p_c / s) exactly: the values are those of the renormalised float64 matrix.
- member logits `[M, N, C]` go through log space in float64: log p̄ = logsumexp_m(log_softmax
  (z_m)) - log M (`log_probs_of`), p̄ = exp(log p̄).

`ranked` groups the points by their confidence (distinct values, each with its count and
errors): what the rank-based metrics read (`peg.metrics.selective`, `adaptive_ece`).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property
from typing import Any, NamedTuple

import torch
from torch import Tensor

from peg.metrics._inputs import (
    by_blocks,
    checked_pred,
    log_probs_of,
    member_axis,
    prob_row_sums,
)
from peg.source._values import as_tensor, check_labels

IGNORE_INDEX = -100  # torch's cross_entropy default: the label of points left out

_SAME_SIZE_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


class NothingKept(ValueError):
    """Every label is `ignore_index` (a streamed batch so is skipped)."""


def _without_ignored(t: Tensor, y: Any, ignore_index: int) -> tuple[Tensor, Any, Tensor | None]:
    """`(pred, labels, kept)` without the points labelled `ignore_index` (`kept` None when none
    is: `pred` and `y` as given). Labels of another shape are left to `check_labels`."""
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise ValueError(f"ignore_index: expected an integer label, got {ignore_index!r}")
    labels = as_tensor(y, "y", t.device, owner="pred")
    if labels.ndim != 1 or len(labels) != t.shape[-2] or labels.dtype == torch.bool:
        return t, y, None
    keep = labels != ignore_index
    if bool(keep.all()):
        return t, labels, None
    if not bool(keep.any()):
        raise NothingKept(f"y: every label is ignore_index ({ignore_index}): nothing to score")
    rows = keep.to(t.device)  # labels may sit elsewhere until check_labels moves them
    return (t[:, rows] if t.ndim == 3 else t[rows]), labels[keep], keep


class Ranked(NamedTuple):
    """Points grouped by confidence: the distinct values in decreasing order `[K]` (float64)
    and, per value, the number of points `[K]` and of errors `[K]` (int64). Tied points form
    one group, so everything computed from it is the same whatever order the points came in."""

    threshold: Tensor
    count: Tensor
    errors: Tensor


def ranked(confidence: Tensor, correct: Tensor) -> Ranked:
    """`Ranked` of confidences `[N]` (any real dtype, finite; -0.0 ties with 0.0) and
    correctness `[N]` bool."""
    values, group, count = torch.unique(confidence, return_inverse=True, return_counts=True)
    errors = torch.bincount(group[~correct], minlength=len(values))
    return Ranked(values.double().flip(0), count.flip(0), errors.flip(0))


class Predictive:
    """Validated `pred` (probabilities `[N, C]` or member logits `[M, N, C]`) and labels `y` `[N]`.

    Points whose label is `ignore_index` (default -100, torch's `cross_entropy` default) are
    left out, as torch's losses leave them out: `kept` `[N]` bool says which points stay (None
    when every point does), and everything below is of those points only.

    Attributes: `members` (member logits given), `labels` `[N]` int64 on `pred`'s device,
    `shape` (of `pred`, the points kept), `num_classes`, `kept`; the cached properties below
    are computed on first use.
    """

    def __init__(
        self, pred: Any, y: Any, name: str = "pred", ignore_index: int = IGNORE_INDEX
    ) -> None:
        t = checked_pred(pred, name)
        t, y, self.kept = _without_ignored(t, y, ignore_index)
        self.members = t.ndim == 3
        if self.members:
            self.member_log = t.log_softmax(-1)  # [M, N, C], shared by the NLL and Gibbs NLL
            self._probs, self._sums = None, None
        else:
            self._probs, self._sums = t, prob_row_sums(t, name, member_axis(pred))
        self.shape, self.num_classes = tuple(t.shape), t.shape[-1]
        self.labels = check_labels(y, t.shape[-2], self.num_classes, device=t.device)

    @cached_property
    def log_probs(self) -> Tensor:
        """Member logits only: log p̄ `[N, C]` float64, in log space."""
        return log_probs_of(self.member_log, normalized=True)

    @property
    def probs(self) -> Tensor:
        """p̄ `[N, C]` up to each row's scale (see `_scaled`): the given probabilities (any
        float dtype) or exp(log p̄) of members (float64, exact)."""
        return self._member_probs if self.members else self._probs

    @cached_property
    def _member_probs(self) -> Tensor:
        return self.log_probs.exp()

    def _scaled(self, v: Tensor, rows: slice = slice(None)) -> Tensor:
        """`v` (values of `probs`, `[N]` or `[B, C]` for rows `rows`) as values of p̄, in a new
        float64 tensor (the caller may change it in place)."""
        if self._sums is None:
            return v.to(torch.float64, copy=True)
        sums = self._sums[rows]
        return torch.div(v, sums if v.ndim == 1 else sums[:, None])  # promoted to float64

    @cached_property
    def top(self) -> tuple[Tensor, Tensor]:
        """(confidence max_c p̄_c `[N]` float64, predicted class `[N]` int64, the first on ties)."""
        p = self.probs
        # Non-negative floats order as their bits read as integers (-0.0 reads as the smallest
        # but is never a row's maximum: rows sum to ~1), and an argmax of integers is ~2 x
        # faster than one of floats or `max` on the CPU.
        cls = p.view(_SAME_SIZE_INT[p.element_size()]).argmax(-1)
        return self._scaled(p.gather(1, cls[:, None]).squeeze(1)), cls

    @cached_property
    def correct(self) -> Tensor:
        """Whether the predicted class is the label, `[N]` bool."""
        return self.top[1] == self.labels

    @cached_property
    def ranked(self) -> Ranked:
        """`ranked` of the confidence max_c p̄_c and the correctness."""
        return ranked(self.top[0], self.correct)

    def blocks(self) -> Iterator[tuple[slice, Tensor]]:
        """(rows, p̄ of those rows `[B, C]` in a new float64 tensor), a block of ~2¹⁸ values
        at a time (as `by_blocks`), covering every row once."""
        step = max(1, 2**18 // self.num_classes)
        for lo in range(0, self.shape[-2], step):
            rows = slice(lo, lo + step)
            yield rows, self._scaled(self.probs[rows], rows)

    @cached_property
    def true_log_prob(self) -> Tensor:
        """log p̄_y `[N]` float64 (-inf where p̄_y = 0)."""
        y = self.labels[:, None]
        if self.members:
            return self.log_probs.gather(1, y).squeeze(1)
        return self._scaled(self._probs.gather(1, y).squeeze(1)).log()

    @cached_property
    def member_true_log(self) -> Tensor:
        """Member logits only: log softmax(z_m)_y `[M, N]` float64."""
        m = self.member_log.shape[0]
        index = self.labels.expand(m, -1)[..., None]
        return self.member_log.gather(2, index).squeeze(-1)

    @cached_property
    def squared_error(self) -> Tensor:
        """Σ_c (p̄_c - 1[c = y])² `[N]` float64, a block of rows at a time (`by_blocks`; exact
        near 0, unlike Σ p̄² - 2 p̄_y + 1)."""
        return by_blocks(self.probs, self._block_squared_error)

    def _block_squared_error(self, block: Tensor, rows: slice) -> Tensor:
        q = self._scaled(block, rows)
        minus_one = q.new_full((q.shape[0], 1), -1.0)
        q.scatter_add_(1, self.labels[rows, None], minus_one)  # p̄_y - 1
        return q.mul_(q).sum(-1)
