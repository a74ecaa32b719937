"""Turning what users pass (tensors, arrays, datasets, loaders) into tensors and batches."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

Data = Any  # Tensor | np.ndarray | tuple[X, y] | Dataset | DataLoader


def _tensor(a: Any, name: str) -> Tensor:
    if isinstance(a, Tensor):
        return a
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a)
    raise TypeError(f"{name}: expected a Tensor or numpy array, got {type(a).__name__}")


def _split_batch(batch: Any, name: str) -> tuple[Tensor, Tensor | None]:
    if isinstance(batch, (tuple, list)):
        if len(batch) < 2:
            return _tensor(batch[0], name), None
        return _tensor(batch[0], name), _tensor(batch[1], name)
    return _tensor(batch, name), None


def as_xy(data: Data, name: str = "data", need_labels: bool = True) -> tuple[Tensor, Tensor | None]:
    """Materialise `data` as `(X [N, ...], y [N])`.

    Accepts a tuple `(X, y)` of tensors/arrays, a map-style Dataset or a DataLoader yielding
    `(x, y)` batches (iterated once, in order). Labels are returned as int64 where they are
    integral; `need_labels=False` allows data without labels (y is then None).
    """
    if (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and not isinstance(data[0], (tuple, list))
    ):
        X, y = _tensor(data[0], name), _tensor(data[1], name)
    elif isinstance(data, (Tensor, np.ndarray)):
        X, y = _tensor(data, name), None
    elif isinstance(data, (DataLoader, Dataset)):
        loader = data if isinstance(data, DataLoader) else DataLoader(data, batch_size=512)
        xs, ys = [], []
        for batch in loader:
            x, yb = _split_batch(batch, name)
            xs.append(x)
            if yb is not None:
                ys.append(yb)
        if not xs:
            raise ValueError(f"{name}: the data is empty (0 samples)")
        X = torch.cat(xs)
        y = torch.cat(ys) if ys else None
    else:
        raise TypeError(
            f"{name}: expected a tuple (X, y), a Dataset or a DataLoader, got {type(data).__name__}"
        )
    if X.shape[0] == 0:
        raise ValueError(f"{name}: the data is empty (0 samples)")
    if y is not None:
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"{name}: {X.shape[0]} inputs but {y.shape[0]} labels")
        if not torch.is_floating_point(y):
            y = y.long()
    if need_labels and y is None:
        raise ValueError(f"{name}: labels are needed: pass (X, y) or a loader yielding (x, y)")
    return X, y


def iter_inputs(X: Data, batch_size: int) -> Iterator[Tensor]:
    """Yield input batches `[B, ...]` from a tensor/array (sliced) or a DataLoader/Dataset."""
    if isinstance(X, (Tensor, np.ndarray)):
        X = _tensor(X, "X")
        for start in range(0, X.shape[0], batch_size):
            yield X[start : start + batch_size]
        return
    if isinstance(X, Dataset):
        X = DataLoader(X, batch_size=batch_size)
    if isinstance(X, DataLoader):
        for batch in X:
            yield _split_batch(batch, "X")[0]
        return
    if isinstance(X, (tuple, list)) and len(X) == 2:
        yield from iter_inputs(X[0], batch_size)
        return
    raise TypeError(
        f"X: expected a Tensor, numpy array, Dataset or DataLoader, got {type(X).__name__}"
    )


def num_batches(X: Data, batch_size: int) -> int | None:
    """Number of batches `iter_inputs` will yield, when it is known in advance."""
    if isinstance(X, (Tensor, np.ndarray)):
        return -(-X.shape[0] // batch_size)
    if isinstance(X, DataLoader):
        try:
            return len(X)
        except TypeError:
            return None
    return None


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """Return `value` if it is an int >= minimum, else raise a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def check_number(value: Any, name: str, allow_zero: bool = False) -> float:
    """Return `value` as a float if it is a finite number > 0 (>= 0 with `allow_zero`), else
    raise a ValueError naming `name`."""
    ok = (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}: expected a finite number {bound}, got {value!r}")
    return float(value)
