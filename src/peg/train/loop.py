"""The training loop: `train` (seeded, resumable), the check of the data before the first epoch
(`check_training_data`), and `instantiate`, a fresh model from a factory or a module."""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg._inputs import (
    Data,
    as_xy,
    diagnose,
    eval_mode,
    model_device,
    to_device,
    weights_device,
)
from peg._progress import bar
from peg.data.transforms import random_crop, random_hflip
from peg.losses import packed_loss
from peg.output import logits_of, model_output
from peg.train.callbacks import Callback
from peg.train.checkpoint import CHECKPOINT_FORMAT, resume_run, save_run
from peg.train.recipe import Recipe, Schedules, make_optimizer

ModelSource = nn.Module | Callable[[], nn.Module]


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
    schedules = Schedules(opt, recipe, steps_per_epoch)
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
            start, history = resume_run(ckpt, identity, model, opt, schedules, gen, callbacks)
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
                save_run(ckpt, identity, epoch + 1, history, model, opt, schedules, gen, callbacks)
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
    schedules: Schedules,
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
        if loss in CLASSIFICATION_LOSSES:  # a custom loss gets the forward's output as it is
            out = logits_of(out)
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
