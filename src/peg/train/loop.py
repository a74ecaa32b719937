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

from peg._forward import diagnose, eval_mode
from peg.data.transforms import random_crop, random_hflip
from peg.losses import packed_loss
from peg.output import logits_of, model_output
from peg.source import Data
from peg.source._devices import model_device, move, weights_device
from peg.source._values import check_finite, check_labels
from peg.source.batches import BatchFn, batch_rows, call_model, check_batch_fn, take_rows
from peg.train._data import Batch, TrainingData
from peg.train.callbacks import Callback, EarlyStopping
from peg.train.checkpoint import CHECKPOINT_FORMAT, resume_run, save_run
from peg.train.recipe import Recipe, Schedules, make_optimizer
from peg.utils.progress import bar

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
    batch_fn: BatchFn | None = None,
    val: tuple[Any, Tensor] | None = None,
    **recipe_fields: Any,
) -> tuple[nn.Module, list[dict[str, float]]]:
    """Train `model` in place on `data`, read batch by batch (never gathered).

    `data`: a pair `(X, y)`; a map-style Dataset, read by index in the order the run's seeded
    generator draws (a `TensorDataset` of the same tensors gives bit-identical weights); a
    DataLoader over one (its dataset and `collate_fn` are used, its sampler and batch size
    are not: the order is the run's, the batch size the recipe's); or an IterableDataset (or a
    loader over one), streamed in its own order every epoch, without shuffling. Batches follow
    `peg.source.batches` (mapping batches: labels under "labels"/"label", the model called as
    `model(**inputs)`); `batch_fn(batch) -> (inputs, y)` splits batches of other shapes.

    Checks: tensors are checked as a whole before the first epoch (no NaN/inf, labels
    present); a Dataset or a stream cannot be, so its first batch is checked before any
    training step and every later batch as it comes (finite, labels present, in range for the
    classification losses), an error naming the batch, the epoch and the samples it holds.
    The model is run once on two rows of the first batch (`check_training_data`), so inputs it
    cannot take, labels out of range or a forward that returns no logits fail at once. Batches
    are moved to the model's device (`peg.source._devices.model_device`).

    Args:
        recipe: how to train (default `Recipe()`); keyword fields override it, e.g.
            `train(model, data, epochs=5, lr=0.1)`.
        seed: seeds the data order and the global RNG inside the run (dropout), so a run is
            reproducible; the caller's global RNG state is restored afterwards.
        loss: `loss(logits, y)`, mean over the batch.
        callbacks: `callback(epoch, model)` after each epoch (epoch counts from 1).
        checkpoint: a file to save the run to after every epoch and resume from. Only whole
            epochs are saved: an interrupted epoch is redone from its start (a stream is read
            again from its beginning for it), and an epoch that meets bad data saves nothing.
        batch_fn: splits the batches of a Dataset or DataLoader (`peg.source.batches`).
        val: validation data `(X, y)` for early stopping (`recipe.patience`; required then):
            after every epoch its NLL is recorded (`val_nll`); the run stops after `patience`
            epochs without improvement and the model gets its best epoch's weights back. A
            callback with a `stop` attribute (`peg.train.callbacks.EarlyStopping`) passed in
            `callbacks` stops a run the same way.

    Returns the model (in eval mode) and its history: one dict per epoch with the mean
    training loss, training accuracy and the learning rate used (and `val_nll` with early
    stopping).
    """
    recipe, batch_fn, callbacks = _arguments(
        model, recipe, recipe_fields, loss, batch_fn, val, callbacks
    )
    source, device, classes = _data(model, data, recipe, batch_fn, seed, loss)
    steps_per_epoch = source.steps_per_epoch()
    opt = make_optimizer(model, recipe)
    schedules = Schedules(opt, recipe, steps_per_epoch or 1)
    gen = torch.Generator().manual_seed(seed)
    history: list[dict[str, float]] = []
    ckpt = Path(checkpoint) if checkpoint is not None else None
    if ckpt is not None and ckpt.is_dir():
        raise ValueError(f"checkpoint: {ckpt} is a folder; expected a file path")
    identity = {"format": CHECKPOINT_FORMAT, "recipe": recipe.to_dict(), "seed": seed}
    run = _Run(model, source, recipe, opt, schedules, gen, loss, device, classes)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        start = 0
        if ckpt is not None and ckpt.exists():
            start, history = resume_run(ckpt, identity, model, opt, schedules, gen, callbacks)
        for epoch in bar(range(start, recipe.epochs), "train", recipe.epochs - start, progress):
            if _stopped(callbacks):
                break  # a resumed run that had stopped early
            schedules.start_epoch(epoch)
            lr_now = opt.param_groups[0]["lr"]
            loss_mean, accuracy = run.epoch(epoch + 1)
            history.append(
                {"epoch": epoch + 1, "loss": loss_mean, "accuracy": accuracy, "lr": lr_now}
            )
            schedules.after_epoch()
            for callback in callbacks:
                callback(epoch + 1, model)
                history[-1].update(getattr(callback, "metrics", dict)())
            if ckpt is not None:
                save_run(ckpt, identity, epoch + 1, history, model, opt, schedules, gen, callbacks)
            if _stopped(callbacks):
                break
    for callback in callbacks:
        if callable(getattr(callback, "restore", None)):
            callback.restore(model)
    return model.eval(), history


def _arguments(
    model: Any,
    recipe: Any,
    recipe_fields: dict[str, Any],
    loss: Any,
    batch_fn: Any,
    val: Any,
    callbacks: Sequence[Callback],
) -> tuple[Recipe, BatchFn | None, Sequence[Callback]]:
    """`train`'s arguments checked: the recipe with `recipe_fields` applied, the batch_fn, and
    the callbacks with early stopping on `val` added (`recipe.patience`)."""
    recipe = (recipe or Recipe()).replace(**recipe_fields) if recipe_fields else recipe or Recipe()
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe: expected a peg.train.Recipe, got {type(recipe).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    if not callable(loss):
        raise TypeError(f"loss: expected a callable loss(outputs, y), got {type(loss).__name__}")
    batch_fn = check_batch_fn(batch_fn)
    if recipe.patience is not None:
        if val is None:
            raise ValueError("val: recipe.patience (early stopping) needs validation data (X, y)")
        callbacks = [*callbacks, EarlyStopping(val, recipe.patience)]
    elif val is not None:
        raise ValueError("val: given without recipe.patience; set patience to stop early")
    return recipe, batch_fn, callbacks


def _data(
    model: nn.Module,
    data: Data,
    recipe: Recipe,
    batch_fn: BatchFn | None,
    seed: int,
    loss: Callable[[Tensor, Tensor], Tensor],
) -> tuple[TrainingData, torch.device, int | None]:
    """The training data as a `TrainingData` source, checked before the first epoch (labels,
    not empty, a model that can run on it, a known epoch length for a cosine schedule), the
    device the batches go to, and the number of classes (None for a stream)."""
    source = TrainingData(data, recipe.batch_size, batch_fn, weights_device(model), seed)
    if source.in_memory:
        X, y = source.X, source.y
        if y is None:
            raise ValueError("data: training needs labels, got inputs only")
        if len(X) == 0:
            raise ValueError("data: the training set is empty")
        device = model_device(model, "model", ("data", X))
    else:
        if source.n == 0:
            raise ValueError("data: the training set is empty")
        device = model_device(model, "model")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("model: has no trainable parameters (requires_grad=True) to train")
    classes = check_training_data(model, X, y, loss, device) if source.in_memory else None
    if source.steps_per_epoch() is None and recipe.schedule == "cosine":
        raise ValueError(
            "data: schedule='cosine' needs the number of batches per epoch, and this stream "
            "does not say (its loader has no len()); give the IterableDataset a __len__ or use "
            "schedule='constant' or 'swa'"
        )
    return source, device, classes


def _stopped(callbacks: Sequence[Callback]) -> bool:
    """Whether a callback asks the run to stop (`EarlyStopping.stop`)."""
    return any(getattr(c, "stop", False) for c in callbacks)


CLASSIFICATION_LOSSES: tuple[Callable[..., Tensor], ...] = (
    F.cross_entropy,
    F.nll_loss,
    packed_loss,
)


def check_training_data(
    model: nn.Module, X: Any, y: Tensor, loss: Callable[..., Tensor], device: torch.device
) -> int | None:
    """Before the first training step: the model runs on two rows of `X` (eval mode, no
    gradient, the global RNG untouched) and, for the classification losses (the default
    cross-entropy and `packed_loss`), returns logits `[B, C]` for integer labels in [0, C).

    `X, y` are the whole data (tensors) or the first batch of a stream (`X` then any inputs
    `peg.source.batches` takes). Returns C for class labels, None otherwise."""
    with eval_mode(model), torch.no_grad(), torch.random.fork_rng(devices=[]):
        out = diagnose(
            lambda x: call_model(model, x), move(take_rows(X, 0, 2), device, "data"), "data"
        )
    if loss not in CLASSIFICATION_LOSSES:
        return None  # a custom loss: its outputs and targets are its own business
    out = model_output(out, "model")
    if y.ndim != 1:
        if torch.is_floating_point(y) and y.shape == (batch_rows(X, "data"), out.shape[1]):
            return None  # class probabilities (soft labels) for cross-entropy
        raise ValueError(f"data: expected class labels [N], got shape {tuple(y.shape)}")
    if torch.is_floating_point(y):
        raise ValueError(
            "data: floating-point labels with a classification loss; pass integer class labels "
            "(e.g. y.long()), or a regression loss such as "
            "peg.models.gaussian.gaussian_nll_loss for real-valued targets"
        )
    C = out.shape[1]
    _check_range(y, C, "data")
    return C


def _check_range(y: Tensor, C: int, where: str) -> None:
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= C:
        raise ValueError(
            f"{where}: labels must lie in [0, {C}) for a model with {C} outputs, got min {lo}, "
            f"max {hi}"
        )


class _Run:
    """The epochs of one `train` call: batches checked (streams), stepped, counted."""

    def __init__(
        self,
        model: nn.Module,
        source: TrainingData,
        recipe: Recipe,
        opt: torch.optim.Optimizer,
        schedules: Schedules,
        gen: torch.Generator,
        loss: Callable[[Tensor, Tensor], Tensor],
        device: torch.device,
        classes: int | None,
    ) -> None:
        self.model, self.source, self.recipe, self.opt = model, source, recipe, opt
        self.schedules, self.gen, self.loss, self.device = schedules, gen, loss, device
        self.classes = classes
        self.probed = source.in_memory  # tensors were checked as a whole

    def check(self, batch: Batch, epoch: int) -> tuple[Any, Tensor]:
        """A batch of a Dataset or stream checked before it is trained on (the first one with
        the model, `check_training_data`), with an error naming it."""
        inputs, y = batch.inputs, batch.y
        where = f"data: {batch.where(epoch)}"
        if self.recipe.augment and not isinstance(inputs, Tensor):
            raise ValueError(f"{where}: augment=True needs image tensors [B, C, H, W]")
        rows = batch_rows(inputs, where)
        y = check_labels(y, rows, None, where, targets=True)
        check_finite(inputs, where)
        if not self.probed:
            try:
                self.classes = check_training_data(self.model, inputs, y, self.loss, self.device)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            self.probed = True
        elif self.classes is not None and y.ndim == 1 and not torch.is_floating_point(y):
            _check_range(y, self.classes, where)
        return inputs, y

    def epoch(self, epoch: int) -> tuple[float, float]:
        """One pass over the batches (shuffled unless streamed); returns (mean loss, accuracy)."""
        model, recipe, gen, loss = self.model, self.recipe, self.gen, self.loss
        model.train()
        seen = correct = 0
        loss_sum = 0.0
        for batch in self.source.epoch(gen, epoch):
            if self.source.in_memory:
                xb, yb = batch.inputs, batch.y
            else:
                xb, yb = self.check(batch, epoch)
            if recipe.augment:
                xb = random_hflip(random_crop(xb, 4, gen), 0.5, gen)
            xb, yb = move(xb, self.device, "data"), move(yb, self.device, "data labels")
            out = call_model(model, xb)
            if loss in CLASSIFICATION_LOSSES:  # a custom loss gets the forward's output as is
                out = logits_of(out)
            batch_loss = loss(out, yb)
            value = batch_loss.item()
            if not math.isfinite(value):
                raise FloatingPointError(
                    f"training diverged (loss {value}) after {seen} samples of this epoch; lower lr"
                )
            self.opt.zero_grad(set_to_none=True)
            batch_loss.backward()
            self.opt.step()
            self.schedules.after_batch()
            rows = len(yb)
            loss_sum += value * rows
            correct += int((out.argmax(-1) == yb).sum())
            seen += rows
        if seen == 0:
            raise ValueError(f"data: epoch {epoch} gave no batches (an empty stream)")
        return loss_sum / seen, correct / seen
