"""How to train: the `Recipe`, the optimizer it names (`make_optimizer`) and the learning-rate
schedules of one run (`swa_lr_factor`, `Schedules`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.optim.swa_utils import SWALR

from peg.utils.scalars import check_number, check_positive_int

Schedule = Literal["constant", "cosine", "swa"]


@dataclass(frozen=True)
class Recipe:
    """How to train: optimizer, rates, schedule, epochs, batch size.

    Defaults are those of the SWA/SWAG reference experiments scaled to this library's small
    models: SGD with momentum 0.9 and weight decay 5e-4, batch 128. `swa_start` (epochs) and
    `swa_lr` are used by the "swa" schedule and by the SWA/SWAG collectors. `augment` applies
    the standard CIFAR augmentation (`peg.data.transforms`) to each `[B, C, H, W]` batch, drawn
    from the run's data-order generator so a resumed run augments identically. `patience`
    stops the run early ("until the validation loss rises"): `train(..., val=(X, y))` then
    stops after `patience` epochs without a lower validation NLL and returns the best epoch's
    weights (`peg.train.callbacks.EarlyStopping`); `epochs` is the most it trains.
    """

    epochs: int = 10
    lr: float = 0.05
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = 0.9
    weight_decay: float = 5e-4
    batch_size: int = 128
    schedule: Schedule = "cosine"
    swa_start: int | None = None
    swa_lr: float | None = None
    augment: bool = False  # random crop (padding 4) + horizontal flip of image batches
    patience: int | None = None  # early stopping on validation NLL (`train(val=...)`)

    def __post_init__(self) -> None:
        check_positive_int(self.epochs, "epochs")
        check_positive_int(self.batch_size, "batch_size")
        check_number(self.lr, "lr")
        check_number(self.momentum, "momentum", allow_zero=True)
        check_number(self.weight_decay, "weight_decay", allow_zero=True)
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer: expected 'sgd' or 'adam', got {self.optimizer!r}")
        if self.schedule not in ("constant", "cosine", "swa"):
            raise ValueError(
                f"schedule: expected 'constant', 'cosine' or 'swa', got {self.schedule!r}"
            )
        if self.swa_start is not None:
            check_positive_int(self.swa_start, "swa_start", minimum=0)
            if self.swa_start > self.epochs:
                raise ValueError(
                    f"swa_start: {self.swa_start} is past the last epoch (epochs={self.epochs}); "
                    "weights are collected from epoch swa_start to epochs"
                )
        if self.swa_lr is not None:
            check_number(self.swa_lr, "swa_lr")
        if self.patience is not None:
            check_positive_int(self.patience, "patience")
        if not isinstance(self.augment, bool):
            raise ValueError(f"augment: expected True or False, got {self.augment!r}")
        if self.schedule == "swa" and (self.swa_start is None or self.swa_lr is None):
            raise ValueError("schedule='swa' needs swa_start (an epoch) and swa_lr")

    def replace(self, **changes: Any) -> Recipe:
        """A copy with some fields changed (unknown names are a clear error)."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(f"Recipe: unknown field(s) {unknown}; known: {sorted(known)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def make_optimizer(model: nn.Module, recipe: Recipe) -> torch.optim.Optimizer:
    """SGD with (Nesterov-free) momentum and weight decay, or Adam."""
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(
            model.parameters(),
            lr=recipe.lr,
            momentum=recipe.momentum,
            weight_decay=recipe.weight_decay,
        )
    return torch.optim.Adam(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)


def swa_lr_factor(epoch: int, recipe: Recipe) -> float:
    """The SWA reference schedule's rate at `epoch` (0-based) as a multiple of `recipe.lr`."""
    assert recipe.swa_start is not None and recipe.swa_lr is not None
    ratio = recipe.swa_lr / recipe.lr
    if recipe.swa_start == 0:  # averaging from the first epoch: the SWA rate throughout
        return ratio
    t = epoch / recipe.swa_start
    if t <= 0.5:
        return 1.0
    if t <= 0.9:
        return 1.0 - (1.0 - ratio) * (t - 0.5) / 0.4
    return ratio


class Schedules:
    """The learning-rate schedulers of one run; stepped per batch (cosine) or per epoch."""

    def __init__(self, opt: torch.optim.Optimizer, recipe: Recipe, steps_per_epoch: int) -> None:
        self.recipe = recipe
        self.opt = opt
        self.swalr: SWALR | None = None
        if recipe.schedule == "cosine":
            total = recipe.epochs * steps_per_epoch
            self.main = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        elif recipe.schedule == "swa":
            self.main = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: swa_lr_factor(e, recipe))
        else:
            self.main = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)

    def start_epoch(self, epoch: int) -> None:
        """Hand over to SWALR at swa_start (created then, so it anneals from the current rate)."""
        r = self.recipe
        if r.schedule == "swa" and epoch == r.swa_start and self.swalr is None:
            assert r.swa_lr is not None
            self.swalr = SWALR(self.opt, swa_lr=r.swa_lr, anneal_epochs=1, anneal_strategy="linear")

    def after_batch(self) -> None:
        if self.recipe.schedule == "cosine":
            self.main.step()

    def after_epoch(self) -> None:
        if self.swalr is not None:
            self.swalr.step()
        elif self.recipe.schedule == "swa":
            self.main.step()

    def state_dict(self) -> dict[str, Any]:
        state = {"main": self.main.state_dict()}
        if self.swalr is not None:
            state["swalr"] = self.swalr.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.main.load_state_dict(state["main"])
        if "swalr" in state:
            assert self.recipe.swa_lr is not None
            self.swalr = SWALR(self.opt, swa_lr=self.recipe.swa_lr, anneal_epochs=1)
            self.swalr.load_state_dict(state["swalr"])
