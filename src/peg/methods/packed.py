"""Packed-Ensembles-(α, M, γ) (Laurent et al. 2023): the training loss and the predictor.

A packed model (`models.build("resnet18", packed=(2, 4, 1))`, see `peg.models._packed`) holds
M subnetworks in grouped layers and runs them in one forward pass. Training it is an ordinary
`peg.train.train` run with `loss=packed_loss`, which trains every subnetwork on its own
cross-entropy (§3: the subnetworks are trained independently, in parallel):

    model = models.build("resnet18", packed=(2, 4, 1))
    train(model, (X, y), recipe, loss=packed_loss)
    ens = PackedEnsemble().fit(model)     # member_logits(X) -> [M, N, C]

Like `MCDropout`, `PackedEnsemble` is not a stacked-weights `Ensemble`: the members share one
module and come out of one forward pass, with the same `member_logits -> [M, N, C]` interface.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg._inputs import Data, as_xy, check_positive_int, diagnose, to_device
from peg.methods.base import ModulePredictor, store_arguments


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


def packed_gaussian_nll(output: Tensor, y: Tensor, min_var: float = 1e-6) -> Tensor:
    """Regression with Packed-Ensembles: the mean over members of each one's Gaussian NLL.

    A packed model built with `num_classes=2` has Gaussian heads: member outputs `[M, B, 2]`
    are (mean, log-variance), the convention of `peg.models.gaussian`; the log-variance is
    floored at log(min_var) (softly, as `GaussianHead` does). Its `forward` output (log p̄) is
    meaningless for regression: predict with `PackedEnsemble().fit(model).member_logits(X)`.
    """
    from peg.models.gaussian import gaussian_nll_loss

    members = _members_of(output)
    if members.shape[-1] != 2:
        raise ValueError(
            f"output: expected Gaussian member outputs [M, B, 2], got {tuple(members.shape)}"
        )
    floor = torch.full_like(members[..., 1], math.log(min_var))
    heads = torch.stack([members[..., 0], torch.logaddexp(members[..., 1], floor)], -1)
    return gaussian_nll_loss(heads.flatten(0, 1), y.repeat(members.shape[0]))


class PackedEnsemble(ModulePredictor):
    """The M subnetworks of a trained packed model as an ensemble predictor.

    Args:
        batch_size: rows per forward pass when predicting a tensor.
        progress: show a progress bar over batches (None: only on a terminal).

    After `fit(model)`: `model_` (a deep copy in eval mode: BatchNorm running statistics,
    dropout off; the caller's model is never changed), `n_members_` (M, from the model's
    packing), `meta_`, `member_logits(X) -> [M, N, C]`, `predict_proba(X) -> [N, C]`,
    `predict(X) -> [N]`, `len(self) == M`.
    """

    method = "packed_ensemble"
    label = "Packed-Ensembles"

    def __init__(self, *, batch_size: int = 512, progress: bool | None = None) -> None:
        store_arguments(self, locals())

    def _check_params(self) -> None:
        check_positive_int(self.batch_size, "batch_size")

    def fit(
        self, model: nn.Module, val: Data | None = None, *, bn_data: Data | None = None
    ) -> PackedEnsemble:
        """Take (a copy of) a trained packed model.

        Args:
            model: an nn.Module with `member_forward(x) -> [M, B, C]` and a `packing`
                (the architectures of `peg.models` built with `packed=...`).
            val: optional inputs; only used to check, on two rows, that the model accepts them.
            bn_data: unused (accepted as by every post-hoc method): BatchNorm keeps the
                model's running statistics.
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
        if not callable(getattr(model, "member_forward", None)) or (
            getattr(model, "packing", None) is None
        ):
            raise ValueError(
                f"model: {type(model).__name__} is not a packed model; build it with "
                "packed=(alpha, num_estimators, gamma), e.g. models.build('resnet18', "
                "packed=(2, 4, 1))"
            )
        self.model_ = copy.deepcopy(model).eval()
        self.n_members_ = int(model.packing.num_estimators)
        if val is not None:
            X, _ = as_xy(val, "val", need_labels=False, device=self._device())
            with torch.no_grad():
                diagnose(self._members, to_device(X, self._device(), "val"), "val")
        self.meta_: dict[str, Any] = {
            "method": self.method,
            "n_members": self.n_members_,
            "alpha": model.packing.alpha,
            "gamma": model.packing.gamma,
            "architecture": type(model).__name__,
        }
        return self

    def _members(self, x: Tensor) -> Tensor:
        """Member logits `[M, B, C]` of one batch."""
        out = self.model_.member_forward(to_device(x, self._device(), "X"))
        if out.ndim != 3 or out.shape[0] != self.n_members_:
            raise ValueError(
                f"model: member_forward must return [M={self.n_members_}, B, C], "
                f"got shape {tuple(out.shape)}"
            )
        return out

    def _batch_logits(self, x: Tensor, j: int) -> Tensor:
        return self._members(x)

    def __len__(self) -> int:
        self._check_fitted()
        return self.n_members_
