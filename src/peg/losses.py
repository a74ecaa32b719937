"""Training losses: every loss peg trains or steps with, in one module.

Names say what comes back: `*_per_point` a tensor `[B]` (one value per row, reduced by the
caller), `*_elementwise` a tensor of the inputs' broadcast shape, `*_loss` (and the packed
losses) one scalar, the mean over the batch, ready for `peg.train.train`. The float metrics of
a fitted model live in `peg.metrics` (e.g. `peg.metrics.gaussian_nll`, computed in float64
with the formula of `gaussian_nll_elementwise`).

Classification:
- `cross_entropy_per_point(logits, y) -> [B]`: PEG's default step loss.
- `packed_loss(output, y)`: Packed-Ensembles, every subnetwork's cross-entropy.

Regression (Gaussian heads `[B, 2]`: mean and log-variance, see `peg.models.gaussian`):
- `gaussian_nll_elementwise(mean, log_var, y)`: the Gaussian NLL formula, the one place it is.
- `gaussian_nll_per_point(outputs, y) -> [B]`: PEG's default step loss for regression.
- `gaussian_nll_loss(outputs, y) -> []`: the mean, for `train` (also fixed-variance `[B, 1]`).
- `packed_gaussian_nll(output, y)`: Packed-Ensembles with Gaussian heads.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from peg.utils.scalars import check_number

_LOG_2PI = math.log(2 * math.pi)


# ---------------------------------------------------------------- classification
def cross_entropy_per_point(logits: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy of each row, `[B]` (PEG's default loss for classification)."""
    return F.cross_entropy(logits, y, reduction="none")


def packed_loss(output: Tensor, y: Tensor, reduction: Literal["mean", "sum"] = "mean") -> Tensor:
    """Cross-entropy of every subnetwork on the same labels, combined over the members.

    Args:
        output: a packed model's forward output (log p̄ `[B, C]` carrying `.member_logits`
            `[M, B, C]`, which is what `train` passes on), or member logits `[M, B, C]`.
        y: labels `[B]`.
        reduction: "mean" (default, as torch-uncertainty's training: the mean over the M
            members of each one's mean cross-entropy) or "sum" (their sum: each subnetwork gets
            exactly the gradient it would get trained alone, i.e. M times the "mean" one).

    Returns a scalar. The subnetworks share no weights, so either way subnetwork m's gradient
    comes from its own cross-entropy only.
    """
    members = _members_of(output)
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction: expected 'mean' or 'sum', got {reduction!r}")
    m = members.shape[0]
    # One call over [M·B, C] with the labels repeated = mean over members of each member's mean.
    loss = F.cross_entropy(members.flatten(0, 1), y.repeat(m))
    return loss * m if reduction == "sum" else loss


def _members_of(output: Tensor) -> Tensor:
    """Member outputs `[M, B, C]` from a packed model's output (or given directly)."""
    members = getattr(output, "member_logits", None)
    if members is None:
        if output.ndim != 3:
            raise ValueError(
                "output: expected member outputs [M, B, C] or the output of a packed model "
                f"(built with packed=...), got shape {tuple(output.shape)}"
            )
        members = output
    return members


def gaussian_nll_elementwise(
    mean: Tensor, log_var: Tensor | float, y: Tensor, var: Tensor | float | None = None
) -> Tensor:
    """Negative log density of `y` under N(mean, exp(log_var)), elementwise, log(2π)/2 included.

    0.5 · (log 2π + log σ² + (y − μ)² / σ²), in the inputs' broadcast shape and dtype, from the
    log-variance directly (no exp then log), so it stays exact for very small or large
    variances. `var` is σ² when the caller has it (the squared error is then divided by it);
    without it the squared error is multiplied by exp(−log_var). Either way the value is the
    same up to rounding; callers keep the one they have always used, so results do not move.
    """
    sq = (y - mean).pow(2)
    # a float log-variance as a 0-d tensor (torch.exp takes tensors only), which broadcasts
    scaled = sq / var if var is not None else sq * torch.exp(-torch.as_tensor(log_var))
    return 0.5 * (_LOG_2PI + log_var + scaled)


def gaussian_nll_per_point(outputs: Tensor, y: Tensor) -> Tensor:
    """Gaussian NLL of each row, `[B]`, for heads `[B, 2]` (mean, log-variance).

    PEG's default loss for regression (floating-point targets). Includes log(2π)/2, which
    moves the value but not the gradient.
    """
    log_var = outputs[:, 1]
    return gaussian_nll_elementwise(outputs[:, 0], log_var, y, var=log_var.exp())


def gaussian_nll_loss(outputs: Tensor, y: Tensor, var: float = 1.0) -> Tensor:
    """Mean Gaussian NLL of targets `y [B]`, constant log(2π)/2 included (a loss for `train`).

    Args:
        outputs: `[B, 2]` (mean, log-variance) from a Gaussian head, or mean-only `[B, 1]`.
        y: targets `[B]` (or `[B, 1]`).
        var: the fixed variance used for mean-only outputs (1 / τ); ignored for `[B, 2]`.

    Computed from the log-variance directly (no exp then log), so it is exact for very small or
    large variances. With `[B, 1]` outputs it is MSE / (2 var) plus a constant.
    """
    if outputs.ndim != 2 or outputs.shape[1] not in (1, 2):
        raise ValueError(
            f"outputs: expected [B, 2] (mean, log-variance) or [B, 1] (mean), got shape "
            f"{tuple(outputs.shape)}"
        )
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    # Exact shape check: [B] against [B, 1] would silently broadcast to [B, B].
    if y.shape != outputs.shape[:1]:
        raise ValueError(f"y: expected targets [{outputs.shape[0]}], got shape {tuple(y.shape)}")
    y = y.to(outputs.dtype)
    mean = outputs[:, 0]
    if outputs.shape[1] == 2:
        nll = gaussian_nll_elementwise(mean, outputs[:, 1], y)
    else:
        var = check_number(var, "var")
        nll = gaussian_nll_elementwise(mean, math.log(var), y, var=var)
    return nll.mean()


def packed_gaussian_nll(output: Tensor, y: Tensor, min_var: float = 1e-6) -> Tensor:
    """Regression with Packed-Ensembles: the mean over members of each one's Gaussian NLL.

    A packed model built with `num_classes=2` has Gaussian heads: member outputs `[M, B, 2]`
    are (mean, log-variance), the convention of `peg.models.gaussian`; the log-variance is
    floored at log(min_var) (softly, as `GaussianHead` does). Its `forward` output (log p̄) is
    meaningless for regression: predict with `PackedEnsemble(model).member_logits(X)`.
    """
    members = _members_of(output)
    if members.shape[-1] != 2:
        raise ValueError(
            f"output: expected Gaussian member outputs [M, B, 2], got {tuple(members.shape)}"
        )
    floor = torch.full_like(members[..., 1], math.log(min_var))
    heads = torch.stack([members[..., 0], torch.logaddexp(members[..., 1], floor)], -1)
    return gaussian_nll_loss(heads.flatten(0, 1), y.repeat(members.shape[0]))


__all__ = [
    "cross_entropy_per_point",
    "gaussian_nll_elementwise",
    "gaussian_nll_loss",
    "gaussian_nll_per_point",
    "packed_gaussian_nll",
    "packed_loss",
]
