"""Plain, seeded, resumable training loops with progress bars.

`train(model, data, Recipe(...))` trains in place and returns `(model, history)`. A `Recipe`
holds everything that defines a run except the model, data and seed, so training-time methods
(SWA, SWAG, Deep Ensembles) take one and record it. Schedules:

- ``"constant"``: the initial rate throughout.
- ``"cosine"``: cosine annealing to 0 over all steps.
- ``"swa"``: the SWA/SWAG papers' schedule (Izmailov et al. 2018, reference code): with
  t = epoch / swa_start, the rate is `lr` for t ≤ 0.5, decays linearly to `swa_lr` by t = 0.9,
  and stays there; from `swa_start` on, `torch.optim.swa_utils.SWALR` holds it at `swa_lr`.
  Like the reference, the rate changes once per epoch.

`callbacks` are called as `callback(epoch, model)` after every epoch (epoch counts from 1);
a callback with `state_dict()` / `load_state_dict()` is saved in the checkpoint with the model.
With `checkpoint=path`, the complete state (model, optimizer, schedulers, data-order generator,
global RNG for dropout, history, callbacks) is written atomically after every epoch; running
the same call again resumes from it and ends with the same weights as an uninterrupted run.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.swa_utils import SWALR

from peg._inputs import (
    Data,
    as_xy,
    check_number,
    check_positive_int,
    diagnose,
    eval_mode,
    model_device,
    to_device,
    weights_device,
)
from peg._io import load_tree, save_tree
from peg._progress import bar
from peg.data.transforms import random_crop, random_hflip
from peg.losses import packed_loss
from peg.output import model_output

Schedule = Literal["constant", "cosine", "swa"]
Callback = Callable[[int, nn.Module], None]
ModelSource = nn.Module | Callable[[], nn.Module]
CHECKPOINT_FORMAT = "peg-train-checkpoint"


@dataclass(frozen=True)
class Recipe:
    """How to train: optimizer, rates, schedule, epochs, batch size.

    Defaults are those of the SWA/SWAG reference experiments scaled to this library's small
    models: SGD with momentum 0.9 and weight decay 5e-4, batch 128. `swa_start` (epochs) and
    `swa_lr` are used by the "swa" schedule and by the SWA/SWAG collectors. `augment` applies
    the standard CIFAR augmentation (`peg.data.transforms`) to each `[B, C, H, W]` batch, drawn
    from the run's data-order generator so a resumed run augments identically.
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


def load_checked(path: Path, identity: dict[str, Any], argument: str) -> dict[str, Any]:
    """A saved run state, after checking it belongs to the run `identity` describes.

    Recipe fields added to `Recipe` after the file was written count at their defaults.
    """
    state = load_tree(path)
    saved = {k: state.get(k) for k in identity}
    if isinstance(saved.get("recipe"), dict):
        saved["recipe"] = {**Recipe().to_dict(), **saved["recipe"]}
    if saved != identity:
        raise ValueError(
            f"{argument}: {path} belongs to another run ({saved}) than this one ({identity}); "
            f"delete it or pass another {argument}"
        )
    return state


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


class _Schedules:
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


def instantiate(model: ModelSource, seed: int, reinit: bool = False) -> nn.Module:
    """A fresh model from a factory (called under `torch.manual_seed(seed)`) or a module copy.

    With `reinit=True` a module's copy has `reset_parameters()` called on every submodule that
    has one, under the same seed, so M calls with M seeds give M different initialisations.
    The caller's module is never modified.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if isinstance(model, nn.Module):
            fresh = copy.deepcopy(model)
            if reinit:
                for module in fresh.modules():
                    if callable(getattr(module, "reset_parameters", None)):
                        module.reset_parameters()
            return fresh
        if callable(model):
            fresh = model()
            if not isinstance(fresh, nn.Module):
                raise TypeError(
                    f"model: the factory must return an nn.Module, got {type(fresh).__name__}"
                )
            return fresh
    raise TypeError(f"model: expected an nn.Module or a factory, got {type(model).__name__}")


def train(
    model: nn.Module,
    data: Data,
    recipe: Recipe | None = None,
    *,
    seed: int = 0,
    loss: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy,
    callbacks: Sequence[Callback] = (),
    checkpoint: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
    **recipe_fields: Any,
) -> tuple[nn.Module, list[dict[str, float]]]:
    """Train `model` in place on `data` ((X, y), Dataset or DataLoader; materialised once).

    Before the first epoch the data are checked (no NaN/inf, labels present) and the model is
    run once on two rows (`check_training_data`), so inputs it cannot take, labels out of
    range or a forward that returns no logits fail at once. Batches are moved to the model's
    device (`peg._inputs.model_device`).

    Args:
        recipe: how to train (default `Recipe()`); keyword fields override it, e.g.
            `train(model, data, epochs=5, lr=0.1)`.
        seed: seeds the data order and the global RNG inside the run (dropout), so a run is
            reproducible; the caller's global RNG state is restored afterwards.
        loss: `loss(logits, y)`, mean over the batch.
        callbacks: `callback(epoch, model)` after each epoch (epoch counts from 1).
        checkpoint: a file to save the run to after every epoch and resume from.

    Returns the model (in eval mode) and its history: one dict per epoch with the mean
    training loss, training accuracy and the learning rate used.
    """
    recipe = (recipe or Recipe()).replace(**recipe_fields) if recipe_fields else recipe or Recipe()
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe: expected a peg.train.Recipe, got {type(recipe).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    if not callable(loss):
        raise TypeError(f"loss: expected a callable loss(outputs, y), got {type(loss).__name__}")
    X, y = as_xy(data, "data", device=weights_device(model))
    if y is None:
        raise ValueError("data: training needs labels, got inputs only")
    if len(X) == 0:
        raise ValueError("data: the training set is empty")
    device = model_device(model, "model", ("data", X))
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("model: has no trainable parameters (requires_grad=True) to train")
    check_training_data(model, X, y, loss, device)
    opt = make_optimizer(model, recipe)
    steps_per_epoch = math.ceil(len(X) / recipe.batch_size)
    schedules = _Schedules(opt, recipe, steps_per_epoch)
    gen = torch.Generator().manual_seed(seed)
    history: list[dict[str, float]] = []
    ckpt = Path(checkpoint) if checkpoint is not None else None
    if ckpt is not None and ckpt.is_dir():
        raise ValueError(f"checkpoint: {ckpt} is a folder; expected a file path")
    identity = {"format": CHECKPOINT_FORMAT, "recipe": recipe.to_dict(), "seed": seed}

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        start = 0
        if ckpt is not None and ckpt.exists():
            start, history = _resume(ckpt, identity, model, opt, schedules, gen, callbacks)
        for epoch in bar(range(start, recipe.epochs), "train", recipe.epochs - start, progress):
            schedules.start_epoch(epoch)
            lr_now = opt.param_groups[0]["lr"]
            loss_mean, accuracy = _epoch(model, X, y, recipe, opt, schedules, gen, loss, device)
            history.append(
                {"epoch": epoch + 1, "loss": loss_mean, "accuracy": accuracy, "lr": lr_now}
            )
            schedules.after_epoch()
            for callback in callbacks:
                callback(epoch + 1, model)
            if ckpt is not None:
                _save(ckpt, identity, epoch + 1, history, model, opt, schedules, gen, callbacks)
    return model.eval(), history


CLASSIFICATION_LOSSES: tuple[Callable[..., Tensor], ...] = (
    F.cross_entropy,
    F.nll_loss,
    packed_loss,
)


def check_training_data(
    model: nn.Module, X: Tensor, y: Tensor, loss: Callable[..., Tensor], device: torch.device
) -> None:
    """Before the first epoch: the model runs on two rows of `X` (eval mode, no gradient, the
    global RNG untouched) and, for the classification losses (the default cross-entropy and
    `packed_loss`), returns logits `[B, C]` for integer labels in [0, C)."""
    with eval_mode(model), torch.no_grad(), torch.random.fork_rng(devices=[]):
        out = diagnose(model, to_device(X[:2], device, "data"), "data")
    if loss not in CLASSIFICATION_LOSSES:
        return  # a custom loss: its outputs and targets are its own business
    out = model_output(out, "model")
    if y.ndim != 1:
        if torch.is_floating_point(y) and y.shape == (len(X), out.shape[1]):
            return  # class probabilities (soft labels) for cross-entropy
        raise ValueError(f"data: expected class labels [N], got shape {tuple(y.shape)}")
    if torch.is_floating_point(y):
        raise ValueError(
            "data: floating-point labels with a classification loss; pass integer class labels "
            "(e.g. y.long()), or a regression loss such as "
            "peg.models.gaussian.gaussian_nll_loss for real-valued targets"
        )
    C = out.shape[1]
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= C:
        raise ValueError(
            f"data: labels must lie in [0, {C}) for a model with {C} outputs, got min {lo}, "
            f"max {hi}"
        )


def _epoch(
    model: nn.Module,
    X: Tensor,
    y: Tensor,
    recipe: Recipe,
    opt: torch.optim.Optimizer,
    schedules: _Schedules,
    gen: torch.Generator,
    loss: Callable[[Tensor, Tensor], Tensor],
    device: torch.device,
) -> tuple[float, float]:
    """One pass over shuffled mini-batches; returns (mean loss, accuracy)."""
    model.train()
    perm = torch.randperm(len(X), generator=gen)
    seen = correct = 0
    loss_sum = 0.0
    for start in range(0, len(X), recipe.batch_size):
        idx = perm[start : start + recipe.batch_size]
        xb, yb = X[idx], y[idx]
        if recipe.augment:
            xb = random_hflip(random_crop(xb, 4, gen), 0.5, gen)
        xb, yb = xb.to(device), yb.to(device)
        out = model(xb)
        batch_loss = loss(out, yb)
        value = batch_loss.item()
        if not math.isfinite(value):
            raise FloatingPointError(
                f"training diverged (loss {value}) after {seen} samples of this epoch; lower lr"
            )
        opt.zero_grad(set_to_none=True)
        batch_loss.backward()
        opt.step()
        schedules.after_batch()
        loss_sum += value * len(idx)
        correct += int((out.argmax(-1) == yb).sum())
        seen += len(idx)
    return loss_sum / seen, correct / seen


def _stateful(callbacks: Sequence[Callback]) -> list[Any]:
    return [c for c in callbacks if hasattr(c, "state_dict") and hasattr(c, "load_state_dict")]


def _save(
    path: Path,
    identity: dict[str, Any],
    epoch: int,
    history: list[dict[str, float]],
    model: nn.Module,
    opt: torch.optim.Optimizer,
    schedules: _Schedules,
    gen: torch.Generator,
    callbacks: Sequence[Callback],
) -> None:
    save_tree(
        path,
        {
            **identity,
            "epoch": epoch,
            "history": history,
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "schedules": schedules.state_dict(),
            "generator": gen.get_state(),
            "rng": torch.get_rng_state(),
            "callbacks": [c.state_dict() for c in _stateful(callbacks)],
        },
    )


def _resume(
    path: Path,
    identity: dict[str, Any],
    model: nn.Module,
    opt: torch.optim.Optimizer,
    schedules: _Schedules,
    gen: torch.Generator,
    callbacks: Sequence[Callback],
) -> tuple[int, list[dict[str, float]]]:
    state = load_checked(path, identity, "checkpoint")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    schedules.load_state_dict(state["schedules"])
    gen.set_state(state["generator"])
    torch.set_rng_state(state["rng"])
    stateful = _stateful(callbacks)
    if len(stateful) != len(state["callbacks"]):
        raise ValueError(
            f"checkpoint: {path} saved {len(state['callbacks'])} callback states, "
            f"this run has {len(stateful)} stateful callbacks"
        )
    for callback, cb_state in zip(stateful, state["callbacks"], strict=True):
        callback.load_state_dict(cb_state)
    return int(state["epoch"]), list(state["history"])


class Snapshots:
    """Callback keeping copies of the model's state dict along a training run (in memory).

    Args:
        after: keep epochs > `after` only (e.g. the last iterates for subspace samplers).
        keep_last: keep at most this many, dropping the oldest.

    `states` is the list of kept state dicts, `epochs` their epoch numbers. Resumable: a run
    checkpointed with `train(checkpoint=...)` stores and restores them.
    """

    def __init__(self, after: int = 0, keep_last: int | None = None) -> None:
        self.after = check_positive_int(after, "after", minimum=0)
        self.keep_last = None if keep_last is None else check_positive_int(keep_last, "keep_last")
        self.states: list[dict[str, Tensor]] = []
        self.epochs: list[int] = []

    def __call__(self, epoch: int, model: nn.Module) -> None:
        if epoch <= self.after:
            return
        self.states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        self.epochs.append(epoch)
        if self.keep_last is not None and len(self.states) > self.keep_last:
            del self.states[0], self.epochs[0]

    def state_dict(self) -> dict[str, Any]:
        return {"states": self.states, "epochs": self.epochs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.states = [dict(s) for s in state["states"]]
        self.epochs = [int(e) for e in state["epochs"]]
