"""Plain, seeded training loops with progress bars (used to make the base models)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg._inputs import Data, as_xy, check_positive_int
from peg._progress import bar

Schedule = Literal["constant", "cosine"]


def make_optimizer(
    model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float
) -> torch.optim.Optimizer:
    """SGD with (Nesterov-free) momentum and weight decay, or Adam."""
    if name == "sgd":
        return torch.optim.SGD(
            model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay
        )
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    raise ValueError(f"optimizer: expected 'sgd' or 'adam', got {name!r}")


def train(
    model: nn.Module,
    data: Data,
    epochs: int = 10,
    lr: float = 0.05,
    optimizer: Literal["sgd", "adam"] = "sgd",
    momentum: float = 0.9,
    weight_decay: float = 5e-4,
    batch_size: int = 128,
    schedule: Schedule = "cosine",
    seed: int = 0,
    loss: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy,
    progress: bool | None = None,
) -> tuple[nn.Module, list[dict[str, float]]]:
    """Train `model` in place on `data` ((X, y), Dataset or DataLoader; materialised once).

    Mini-batches are shuffled by a generator seeded with `seed`, so a run is reproducible.
    Returns the model (in eval mode) and its history: one dict per epoch with the mean
    training loss, training accuracy and learning rate.
    """
    epochs = check_positive_int(epochs, "epochs")
    batch_size = check_positive_int(batch_size, "batch_size")
    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr: expected a learning rate > 0, got {lr!r}")
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule: expected 'constant' or 'cosine', got {schedule!r}")
    X, y = as_xy(data, "data")
    assert y is not None
    opt = make_optimizer(model, optimizer, lr, momentum, weight_decay)
    steps_per_epoch = math.ceil(len(X) / batch_size)
    total = epochs * steps_per_epoch
    sched = (
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        if schedule == "cosine"
        else torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    )
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    history = []
    for epoch in bar(range(epochs), "train", enabled=progress):
        model.train()
        perm = torch.randperm(len(X), generator=gen)
        seen = correct = 0
        loss_sum = 0.0
        lr_now = opt.param_groups[0]["lr"]
        for start in range(0, len(X), batch_size):
            idx = perm[start : start + batch_size]
            xb, yb = X[idx].to(device), y[idx].to(device)
            out = model(xb)
            batch_loss = loss(out, yb)
            opt.zero_grad(set_to_none=True)
            batch_loss.backward()
            opt.step()
            sched.step()
            if not math.isfinite(batch_loss.item()):
                raise FloatingPointError(
                    f"training diverged at epoch {epoch} (loss {batch_loss.item()}); lower lr"
                )
            loss_sum += batch_loss.item() * len(idx)
            correct += int((out.argmax(-1) == yb).sum())
            seen += len(idx)
        history.append(
            {"epoch": epoch + 1, "loss": loss_sum / seen, "accuracy": correct / seen, "lr": lr_now}
        )
    return model.eval(), history
