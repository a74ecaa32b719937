"""Packed-Ensembles-(α, M, γ) (Laurent et al. 2023): the training loss and the predictor.

A packed model (`models.build("resnet18", packed=(2, 4, 1))`, see `peg.models._packed`) holds
M subnetworks in grouped layers and runs them in one forward pass. Training it is an ordinary
`peg.train.train` run with `loss=packed_loss` (defined in `peg.losses`, importable from here
too), which trains every subnetwork on its own cross-entropy (§3: the subnetworks are trained
independently, in parallel):

    model = models.build("resnet18", packed=(2, 4, 1))
    train(model, (X, y), recipe, loss=packed_loss)
    ens = PackedEnsemble().fit(model)     # member_logits(X) -> [M, N, C]

Like `MCDropout`, `PackedEnsemble` is not a stacked-weights `Ensemble`: the members share one
module and come out of one forward pass, with the same `member_logits -> [M, N, C]` interface.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from peg._forward import diagnose
from peg.losses import packed_gaussian_nll, packed_loss
from peg.methods.base import ModulePredictor, store_arguments
from peg.source import Data, Source
from peg.source._devices import move
from peg.source.batches import BatchFn, call_model


class PackedEnsemble(ModulePredictor):
    """The M subnetworks of a trained packed model as an ensemble predictor (Laurent et al.
    2023, "Packed-Ensembles for Efficient Uncertainty Estimation", ICLR).

    Args:
        batch_size: rows per forward pass when predicting a tensor.
        progress: show a progress bar over batches (None: only on a terminal).
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches that are neither
            `(x, y, ...)` nor a mapping with "labels" (`peg.source.batches`); None: those
            conventions.

    After `fit(model)`: `model_` (a deep copy in eval mode: BatchNorm running statistics,
    dropout off; the caller's model is never changed), `n_members_` (M, from the model's
    packing), `meta_`, `member_logits(X) -> [M, N, C]`, `predict_proba(X) -> [N, C]`,
    `predict(X) -> [N]`, `len(self) == M`.
    """

    method = "packed_ensemble"
    label = "Packed-Ensembles"

    def __init__(
        self,
        *,
        batch_size: int = 512,
        progress: bool | None = None,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

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
        self._check_params()  # as the constructor did: catches an attribute set directly
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
            X = Source(val, self.batch_fn, "val").probe(self._device())
            with torch.no_grad():
                diagnose(self._members, move(X, self._device(), "val"), "val")
        self.meta_: dict[str, Any] = {
            "method": self.method,
            "n_members": self.n_members_,
            "alpha": model.packing.alpha,
            "gamma": model.packing.gamma,
            "architecture": type(model).__name__,
        }
        return self

    def _members(self, x: Any) -> Tensor:
        """Member logits `[M, B, C]` of one batch."""
        out = call_model(self.model_.member_forward, move(x, self._device(), "X"))
        if out.ndim != 3 or out.shape[0] != self.n_members_:
            raise ValueError(
                f"model: member_forward must return [M={self.n_members_}, B, C], "
                f"got shape {tuple(out.shape)}"
            )
        return out

    def _batch_logits(self, x: Any, j: int) -> Tensor:
        return self._members(x)

    def __len__(self) -> int:
        self._check_fitted()
        return self.n_members_


__all__ = ["PackedEnsemble", "packed_gaussian_nll", "packed_loss"]
