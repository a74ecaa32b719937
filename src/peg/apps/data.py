"""Data helpers the applications share: one subsampling rule, and Fashion-MNIST with its
fallback to scikit-learn digits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

import torch
from torch import Tensor

from peg import data as datasets

Pair = tuple[Tensor, Tensor]


@overload
def subsample(X: Tensor, y: Tensor, n: int | None, seed: int, *, sort: bool = ...) -> Pair: ...
@overload
def subsample(
    X: Tensor, y: None, n: int | None, seed: int, *, sort: bool = ...
) -> tuple[Tensor, None]: ...
def subsample(
    X: Tensor, y: Tensor | None, n: int | None, seed: int, *, sort: bool = False
) -> tuple[Tensor, Tensor | None]:
    """`n` rows of `(X, y)` drawn without replacement from `seed` (all of them when `n` is None
    or at least their number).

    The rows are the first `n` of `torch.randperm(len(X))` under `seed`, in that order, or in
    the data's order with `sort=True` (the bench sorts; the demo and the diversity study keep
    the permutation's order: their results were made so).
    """
    if n is None or n >= len(X):
        return X, y
    idx = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))[:n]
    if sort:
        idx = idx.sort().values
    return X[idx], None if y is None else y[idx]


def load_or_digits(
    name: str, say: Callable[[str], None], seed: int = 0, **options: Any
) -> tuple[str, Pair, Pair]:
    """`(name, train, test)` of the data set `name`; Fashion-MNIST falls back to scikit-learn
    digits, saying so, when its files are not installed. `seed` and `options` go to
    `peg.data.load` for every other set (digits' split, the toy sets' generators)."""
    if name == "fashion-mnist":
        try:
            return name, datasets.load(name, "train"), datasets.load(name, "test")
        except FileNotFoundError as e:
            say(f"Fashion-MNIST not found ({str(e).splitlines()[0]}); using scikit-learn digits.")
            name = "digits"
    train = datasets.load(name, "train", seed=seed, **options)
    return name, train, datasets.load(name, "test", seed=seed, **options)
