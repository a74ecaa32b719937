"""What patching costs: the L2 term of Eq. (6) (`patch_regularizer`), the training loss that adds
it (`emp_loss`), and the parameters it adds (`overhead`, §3.3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg.layers.patched_module import patched_modules
from peg.utils.scalars import check_number


def patch_regularizer(model: nn.Module, shared: bool = True) -> Tensor:
    """The L2 term of Eq. (6) without its precisions: a scalar to add to the loss × τ.

    Σ_patched Σ_k p_k/2 ‖M_k‖² over the components of every patched layer, plus, with
    `shared=True`, Σ ½‖θ‖² over every other trainable parameter (the shared layers' term of
    Eq. 6). All precisions τ_i, ρ_j are taken equal (App. B.5), so `weight × this` is Eq. (6).
    With `shared=True` train with the optimiser's weight decay at 0, or the shared weights are
    regularised twice; `shared=False` leaves them to the optimiser's weight decay.
    """
    found = patched_modules(model)
    first = next(model.parameters(), None)
    total = torch.zeros((), device=first.device if first is not None else None)
    patched_ids = set()
    for module in found.values():
        total = total + module.regularizer()
        patched_ids.update(id(c) for c in module.components().values())
    if shared:
        for p in model.parameters():
            if p.requires_grad and id(p) not in patched_ids:
                total = total + 0.5 * p.pow(2).sum()
    return total


def emp_loss(
    model: nn.Module,
    weight: float,
    shared: bool = True,
    base: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy,
) -> Callable[[Tensor, Tensor], Tensor]:
    """A `loss(logits, y)` for `peg.train.train`: `base(logits, y) + weight × regulariser`.

    The negative ELBO of §3.2 with one MC draw per step (the training forward pass samples):
    the mean cross-entropy plus `weight × patch_regularizer(model, shared)`
    `weight` plays the role of the prior precision τ divided by the
    number of training points.
    """
    weight = check_number(weight, "weight", allow_zero=True)

    def loss(logits: Tensor, y: Tensor) -> Tensor:
        return base(logits, y) + weight * patch_regularizer(model, shared)

    return loss


def overhead(model: nn.Module) -> dict[str, Any]:
    """Parameters added by patching (§3.3), per patched layer and in total.

    Each patched layer adds (K-1) × its plain parameter count: 2(K-1)N₂ for a BatchNorm over
    N₂ channels, (K-1)(I+1)O for a Linear layer with bias (so (K-1)((I₁+1)O₁ + (I_L+1)O_L)
    for the input and output layers), (K-1)k²IO for a k×k convolution without bias
    ((K-1)(k²I+1)O with one; I/groups for grouped ones).

    Returns `{"per_layer": {name: added}, "total": added, "base": parameters of the plain
    model, "ratio": total / base}`.
    """
    per_layer = {n: m.added_parameters() for n, m in patched_modules(model).items()}
    total = sum(per_layer.values())
    base = sum(p.numel() for p in model.parameters()) - total
    return {
        "per_layer": per_layer,
        "total": total,
        "base": base,
        "ratio": total / base if base else float("nan"),
    }
