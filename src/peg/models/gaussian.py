"""Gaussian regression heads and the UCI regression MLP (their loss: `peg.losses`).

Output convention (shared with `peg.metrics.regression.split_gaussian`): a Gaussian model
returns `[B, 2]` with `[:, 0]` the mean and `[:, 1]` the **log-variance**, variance floor
included, so `var = exp(outputs[:, 1])` needs no further transform. Mean-only models return
`[B, 1]` and are evaluated with a fixed variance `1 / τ` (MC-dropout style precision).

    model = RegressionMLP(13)                                     # [B, 13] -> [B, 2]
    train(model, (X, y), Recipe(epochs=40, optimizer="adam", lr=1e-2), loss=gaussian_nll_loss)
    mean, var = peg.metrics.split_gaussian(model(X_test))
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from peg.losses import gaussian_nll_loss
from peg.models import _layers as L

#: Default variance floor, in the units of the (standardised) targets.
MIN_VAR = 1e-6


class GaussianHead(nn.Module):
    """Linear layer to a Gaussian's mean and log-variance: `[B, in_features] -> [B, 2]`.

    The raw second output r becomes the log-variance log(exp(r) + min_var): a smooth floor
    (variance > min_var, gradient everywhere) that keeps the NLL bounded when the model
    collapses onto a training point.

    Args:
        in_features: size of the features fed to the head.
        min_var: variance floor, > 0 (default 1e-6, for standardised targets).
    """

    def __init__(self, in_features: int, min_var: float = MIN_VAR) -> None:
        super().__init__()
        self.in_features = L.positive_int(in_features, "in_features")
        self.min_var = L.positive_number(min_var, "min_var")
        self.linear = L.linear(self.in_features, 2)

    def forward(self, x: Tensor) -> Tensor:
        """`[B, 2]`: mean and floored log-variance for features `[B, in_features]`."""
        out = self.linear(x)
        floor = torch.full_like(out[:, 1], math.log(self.min_var))
        return torch.stack([out[:, 0], torch.logaddexp(out[:, 1], floor)], dim=1)

    def extra_repr(self) -> str:
        return f"min_var={self.min_var:g}"


class RegressionMLP(nn.Module):
    """The MC-dropout / EMP UCI regression network: ReLU MLP with one hidden layer of 50 units.

    Layout: `body` = Dropout → (Linear → ReLU → Dropout) per hidden layer; `head` =
    `GaussianHead` (heteroscedastic, output `[B, 2]` mean and log-variance) or a Linear to the
    mean only (`[B, 1]`, evaluated with a fixed precision τ). Dropout sits before every linear
    layer as in Gal & Ghahramani's UCI code; with `dropout=0` there are no dropout modules.

    Args:
        in_features: number of input features D.
        hidden: hidden layer size(s); 50 in the protocol (100 for Protein and Year).
        heteroscedastic: predict a per-input variance (True) or the mean only (False).
        dropout: dropout probability in [0, 1).
        min_var: the variance floor of the Gaussian head.

    Input `[B, D]`; output `[B, 2]` or `[B, 1]` (see `out_features`).
    """

    def __init__(
        self,
        in_features: int,
        hidden: Sequence[int] | int = 50,
        heteroscedastic: bool = True,
        dropout: float = 0.0,
        min_var: float = MIN_VAR,
    ) -> None:
        super().__init__()
        self.in_features = L.positive_int(in_features, "in_features")
        if isinstance(hidden, int | np.integer) and not isinstance(hidden, bool):
            hidden = (int(hidden),)
        if not isinstance(hidden, Sequence) or isinstance(hidden, str):
            raise ValueError(f"hidden: expected a layer size or a sequence of them, got {hidden!r}")
        sizes = [L.positive_int(h, "hidden") for h in hidden]
        self.heteroscedastic = L.flag(heteroscedastic, "heteroscedastic")
        p = L.probability(dropout, "dropout")
        min_var = L.positive_number(min_var, "min_var")
        layers: list[nn.Module] = [L.dropout(p)]
        width = self.in_features
        for size in sizes:
            layers += [L.linear(width, size), nn.ReLU(), L.dropout(p)]
            width = size
        self.body = nn.Sequential(*layers)
        self.head: nn.Module = (
            GaussianHead(width, min_var) if self.heteroscedastic else L.linear(width, 1)
        )
        self.out_features = 2 if self.heteroscedastic else 1

    def forward(self, x: Tensor) -> Tensor:
        """`[B, 2]` (mean, log-variance) or `[B, 1]` (mean) for inputs `[B, in_features]`."""
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise ValueError(
                f"x: expected inputs [B, {self.in_features}], got shape {tuple(x.shape)}"
            )
        return self.head(self.body(x))


__all__ = ["MIN_VAR", "GaussianHead", "RegressionMLP", "gaussian_nll_loss"]  # the loss: peg.losses
