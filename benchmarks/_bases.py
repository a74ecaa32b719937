"""Bases that more than one benchmark measures, each trained once and cached under .peg-cache/:
the over-fitted `peg demo` Fashion-MNIST base (`demo`: scale_search.py, peg_fit_overhead.py) and
the library's SmallCNN trained one epoch on Fashion-MNIST (`fashion_mnist`: the same two)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from peg import data as datasets
from peg import models
from peg.apps.data import subsample
from peg.apps.demo import PRESETS as DEMO_PRESETS
from peg.train import Recipe, train

CACHE = Path(".peg-cache")


@dataclasses.dataclass
class Case:
    """One base: the model, its validation and training data, one epoch of its recipe."""

    label: str
    base: nn.Module
    val: tuple[Tensor, Tensor]
    train: tuple[Tensor, Tensor]
    epoch: Callable[[], Any]  # trains a copy of the base for one epoch
    score_points: int | None = 10_000
    grad_batch_size: int = 128
    regression: bool = False


def demo() -> Case:
    """The `peg demo` Fashion-MNIST base: its split, preset and recipe (over-fitted)."""
    preset = DEMO_PRESETS[("fashion-mnist", False)]
    X, y = datasets.load("fashion-mnist", "train")
    X_train, y_train, X_val, y_val = datasets.train_val_split(X, y, 0.2, seed=0)
    X_train, y_train = subsample(X_train, y_train, preset.train_points, 0)
    recipe = Recipe(
        epochs=preset.epochs,
        lr=preset.lr,
        optimizer=preset.optimizer,
        weight_decay=preset.weight_decay,
        batch_size=preset.batch_size,
    )
    torch.manual_seed(0)
    base = models.SmallCNN(in_channels=1, num_classes=10, width=preset.width)
    path = CACHE / "scale-search" / "demo-fashion-mnist.safetensors"
    train(base, (X_train, y_train), recipe, seed=0, checkpoint=path, progress=False)
    one = dataclasses.replace(recipe, epochs=1)
    return Case(
        "peg demo base (Fashion-MNIST, over-fitted)",
        base.eval(),
        (X_val, y_val),
        (X_train, y_train),
        lambda: train(copy.deepcopy(base).train(), (X_train, y_train), one, seed=1, progress=False),
        preset.score_points,
    )


def fashion_mnist(n: int) -> tuple[nn.Module, tuple[Tensor, Tensor]]:
    """SmallCNN trained one epoch on 10,000 Fashion-MNIST images (cached), and `n` test ones."""
    X, y = datasets.load("fashion-mnist", "train")
    torch.manual_seed(0)
    model = models.SmallCNN(in_channels=1, num_classes=10, width=32)
    recipe = Recipe(epochs=1, lr=1e-3, optimizer="adam", weight_decay=0.0, batch_size=128)
    checkpoint = CACHE / "peg_fit_overhead" / "fashion-mnist-small-cnn.safetensors"
    train(model, (X[:10_000], y[:10_000]), recipe, seed=0, checkpoint=checkpoint, progress=False)
    Xt, yt = datasets.load("fashion-mnist", "test")
    return model.eval(), (Xt[:n], yt[:n])
