"""Validation and conversion shared by the metrics: predictions, log-probabilities; labels
through the one checker of the data layer (`peg.source._values.check_labels`, re-exported).

`pred` is either probabilities `[N, C]` or member logits `[M, N, C]`; `y` is labels `[N]`.
Everything is computed in float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from peg.source._values import as_tensor, check_labels

PROB_ATOL = 1e-3  # how far a row of 2-D `pred` may sum from 1


def as_pred(pred: Any, name: str = "pred") -> Tensor:
    """Validate `pred` (probabilities `[N, C]` or member logits `[M, N, C]`) as float64.

    Rows of probabilities within the tolerance are renormalised exactly (divided by their
    float64 sums); member logits are returned as given, converted to float64.
    """
    t = checked_pred(pred, name)
    if t.ndim == 3:
        return t
    # float32 / float64 promotes to float64 in the division itself: no separate float64 copy
    return torch.div(t, prob_row_sums(t, name, member_axis(pred))[:, None])


def member_axis(pred: Any) -> str:
    """How a single model's logits `pred` `[N, C]` become member logits `[1, N, C]`, written for
    the type they came in (a tensor's method is not a NumPy array's)."""
    if isinstance(pred, Tensor):
        return "logits.unsqueeze(0)"
    return "logits[None] (np.expand_dims(logits, 0))"


def checked_pred(pred: Any, name: str = "pred") -> Tensor:
    """`pred` checked for shape and dtype; member logits `[M, N, C]` also for finite values.

    Member logits come back as float64; probabilities `[N, C]` keep a floating dtype (so that
    callers can avoid a float64 copy of them) and are checked by `prob_row_sums`.
    """
    t = as_tensor(pred, name)
    if t.ndim not in (2, 3):
        raise ValueError(
            f"{name}: expected probabilities [N, C] or member logits [M, N, C], "
            f"got shape {tuple(t.shape)}"
        )
    if t.is_complex():
        raise ValueError(f"{name}: expected real values, got dtype {t.dtype}")
    if t.ndim == 3 or not t.is_floating_point():
        t = t.double()
    for dim, size in zip("MNC"[3 - t.ndim :], t.shape, strict=True):
        if size == 0:
            raise ValueError(f"{name}: expected {dim} >= 1, got shape {tuple(t.shape)} (empty)")
    if t.ndim == 3:
        # one pass: a NaN or inf anywhere makes its row's sum non-finite (finite values
        # summing past 1e308 would too; such logits are not a model's)
        _check_finite(t.sum(-1), name)
    return t


def prob_row_sums(t: Tensor, name: str = "pred", fix: str = "logits.unsqueeze(0)") -> Tensor:
    """The float64 row sums `[N]` of probabilities `t` `[N, C]` (any floating dtype), checked:
    finite, non-negative, each within `PROB_ATOL` of 1. The probabilities are `t / sums`.
    `fix`: how the user's logits get a member axis (`member_axis` of what they passed)."""
    sums = by_blocks(t, lambda block, _: block.sum(-1, dtype=torch.float64))
    # one synchronisation for all three checks; NaN or inf anywhere makes its row's sum, so
    # the largest deviation, non-finite
    low, dev = torch.stack([t.amin().double(), (sums - 1).abs().max()]).tolist()
    if not math.isfinite(dev):
        raise ValueError(f"{name}: expected finite values, got NaN or inf")
    if low < 0 or dev > PROB_ATOL:
        problem = (
            f"has negative values (min {low:.3g})"
            if low < 0
            else f"rows do not sum to 1 (max |row sum - 1| = {dev:.3g})"
        )
        raise ValueError(
            f"{name}: expected probabilities [N, C] with non-negative rows summing to 1, but "
            f"it {problem}; pass logits as member logits [M, N, C], e.g. {fix}"
        )
    return sums


def by_blocks(t: Tensor, f: Callable[[Tensor, slice], Tensor]) -> Tensor:
    """`f(block, rows)` `[B]` for blocks of rows `rows` of `t` `[N, C]`, concatenated `[N]`.

    A block holds ~2¹⁸ values (2 MiB in float64; measured fastest on 10⁶ × 100), so that a
    float64 copy of it stays in cache and no whole-tensor float64 copy (slow to allocate) is
    made.
    """
    step = max(1, 2**18 // t.shape[-1])
    if t.shape[0] <= step:  # one block (a streamed batch, often): no split, no concatenation
        return f(t, slice(None))
    return torch.cat([f(t[lo : lo + step], slice(lo, lo + step)) for lo in range(0, len(t), step)])


def _check_finite(row_sums: Tensor, name: str) -> None:
    if not torch.isfinite(row_sums).all():
        raise ValueError(f"{name}: expected finite values, got NaN or inf")


def ensemble_log_probs(pred: Any) -> Tensor:
    """Log of the predictive distribution, `[N, C]` float64.

    Member logits `[M, N, C]`: log((1/M) Σ_m softmax(z_m)) computed as
    logsumexp_m(log_softmax(z_m)) - log M, which stays exact when softmax saturates.
    Probabilities `[N, C]`: log(p) (zeros give -inf).
    """
    return log_probs_of(as_pred(pred))


def log_probs_of(t: Tensor, normalized: bool = False) -> Tensor:
    """`ensemble_log_probs` of a `pred` already validated by `as_pred` (`normalized`: member
    logits already passed through log_softmax)."""
    if t.ndim == 2:
        return t.log()
    member_log = t if normalized else t.log_softmax(-1)
    return torch.logsumexp(member_log, dim=0) - math.log(t.shape[0])


def ensemble_probs(pred: Any) -> Tensor:
    """Predictive probabilities `[N, C]` float64: the mean of member softmaxes, or `pred` itself.

    2-D probabilities are returned unchanged (not via exp(log p)), so a confidence equal to a
    bin edge stays exactly equal to it.
    """
    t = as_pred(pred)
    return t if t.ndim == 2 else ensemble_log_probs(t).exp()


def pred_and_labels(pred: Any, y: Any, log: bool = True) -> tuple[Tensor, Tensor]:
    """`(log p̄ or p̄ [N, C] float64, y [N] int64)`, both validated; `y` on `pred`'s device."""
    p = ensemble_log_probs(pred) if log else ensemble_probs(pred)
    return p, check_labels(y, *p.shape, device=p.device)
