"""Turning what users pass (tensors, arrays, a pair `(X, y)`, mappings, datasets, loaders) into
tensors and batches: the one place that says what each kind of data is.

Value checks are in `peg._values`, scalar arguments in `peg._scalars`, devices in
`peg._devices` (data follows the model), forward passes in `peg._forward`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sized
from typing import Any, TypeGuard, cast

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    SequentialSampler,
    default_collate,
)

from peg._devices import check_data_device, move
from peg._values import check_finite, checked_labels
from peg.batches import (
    BatchFn,
    Tapped,
    batch_rows,
    describe_inputs,
    from_numpy,
    split_batch,
    take_rows,
    tensors,
)

Data = Any  # Tensor | np.ndarray | tuple[X, y] | Mapping | Dataset | DataLoader


def is_pair(data: Any) -> TypeGuard[tuple[Any, Any] | list[Any]]:
    """Whether `data` is a pair `(X, y)` whose inputs are a tensor or an array (what `as_xy`
    takes as it is and every entry point slices in memory); the one test of it in peg."""
    return (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and isinstance(data[0], (Tensor, np.ndarray))
    )


def is_loader(data: Any) -> TypeGuard[DataLoader]:
    """Whether `data` is a torch `DataLoader` (peg's modules ask here, not `torch.utils.data`)."""
    return isinstance(data, DataLoader)


def is_dataset(data: Any) -> TypeGuard[Dataset]:
    """Whether `data` is a torch `Dataset`, map-style or iterable (a DataLoader is not one)."""
    return isinstance(data, Dataset)


def is_dataset_or_loader(data: Any) -> bool:
    """Whether `data` is a torch `Dataset` or a `DataLoader`: data read batch by batch."""
    return isinstance(data, (Dataset, DataLoader))


def as_loader(data: Any, batch_size: int) -> DataLoader:
    """A DataLoader as it is; anything else (a Dataset) batched by `batch_size` in order."""
    return data if isinstance(data, DataLoader) else DataLoader(data, batch_size=batch_size)


def known_rows(data: Data) -> int | None:
    """How many points `data` holds when that is known without reading it (a pair of tensors,
    a map-style Dataset with a length, a loader over one), else None."""
    if isinstance(data, (tuple, list)) and len(data) == 2 and hasattr(data[1], "__len__"):
        return len(data[1])
    if isinstance(data, DataLoader):
        data = data.dataset
    if isinstance(data, Dataset) and not isinstance(data, IterableDataset):
        try:
            return len(cast(Sized, data))
        except TypeError:
            return None
    return None


def index_batches(data: Data, batch_size: int) -> tuple[int, Callable[[int], Any]] | None:
    """`data`'s batches read by index, where they are known in advance: a map-style Dataset
    cut into `batch_size` items, or a DataLoader with a batch size reading its map-style
    dataset in index order (its batch size, `collate_fn` and `drop_last`). `(count, batch)`:
    the number of batches and `batch(j)`, batch j's items read by index and collated as the
    loader would. None otherwise (tensors, a shuffling or custom sampler, an IterableDataset):
    those are read in order."""
    loader = data if isinstance(data, DataLoader) else None
    dataset = loader.dataset if loader is not None else data
    if not isinstance(dataset, Dataset) or isinstance(dataset, IterableDataset):
        return None
    if loader is not None and (
        loader.batch_size is None or not isinstance(loader.sampler, SequentialSampler)
    ):
        return None
    rows = loader.batch_size if loader is not None and loader.batch_size else batch_size
    collate = loader.collate_fn if loader is not None else default_collate
    n = len(cast(Sized, dataset))
    count = n // rows if loader is not None and loader.drop_last else -(-n // rows)

    def batch(j: int) -> Any:
        return collate([dataset[i] for i in range(j * rows, min(n, (j + 1) * rows))])

    return count, batch


def _tensor(a: Any, name: str) -> Tensor:
    if isinstance(a, Tensor):
        return a
    if isinstance(a, np.ndarray):
        return from_numpy(a)
    raise TypeError(f"{name}: expected a Tensor or numpy array, got {type(a).__name__}")


def _split_batch(
    batch: Any, name: str, batch_fn: BatchFn | None = None, index: int | None = None
) -> tuple[Tensor, Tensor | None]:
    """A batch as tensors `(x, y)` for the paths that gather it (`as_xy`)."""
    x, y = split_batch(batch, batch_fn, name=name, index=index)
    if not isinstance(x, Tensor):
        raise TypeError(
            f"{name}: batches of structured inputs ({describe_inputs(x)}) cannot be gathered "
            "into one tensor here; this entry point takes tensor inputs (see "
            "docs/data.md#batches-of-any-shape for where mappings go)"
        )
    return x, y


def as_xy(
    data: Data,
    name: str = "data",
    need_labels: bool = True,
    device: torch.device | None = None,
    batch_fn: BatchFn | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Materialise `data` as `(X [N, ...], y [N])`, checked.

    Accepts a tuple `(X, y)` of tensors/arrays, a map-style Dataset or a DataLoader yielding
    `(x, y)` batches (iterated once, in order). Labels are returned as int64 where they are
    integral; `need_labels=False` allows data without labels (y is then None).

    Refused, with an error naming `name`: no samples, inputs without a batch dimension, as many
    labels as inputs not given, NaN or inf in floating-point inputs or labels, and data on the
    `meta` device (`device`: the model's, for the message; see `model_device`).
    """
    if is_pair(data):
        X, y = _tensor(data[0], name), _tensor(data[1], name)
    elif isinstance(data, (Tensor, np.ndarray)):
        X, y = _tensor(data, name), None
    elif isinstance(data, (DataLoader, Dataset)):
        loader = as_loader(data, 512)
        xs, ys = [], []
        for j, batch in enumerate(loader):
            x, yb = _split_batch(batch, name, batch_fn, j)
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
    check_data_device(X, name, device)
    if X.ndim == 0:
        raise ValueError(f"{name}: expected inputs [N, ...], got a scalar")
    if X.shape[0] == 0:
        raise ValueError(f"{name}: the data is empty (0 samples)")
    check_finite(X, name)
    if y is not None:
        y = checked_labels(y, name, X.shape[0], device)
    if need_labels and y is None:
        raise ValueError(f"{name}: labels are needed: pass (X, y) or a loader yielding (x, y)")
    return X, y


def pair_or_tapped(
    data: Data,
    name: str,
    batch_fn: BatchFn | None = None,
    device: torch.device | None = None,
) -> tuple[Tensor | Tapped, Tensor | None]:
    """Labelled `data` as its consumers read it in one pass: a pair `(X, y)` of tensors or
    arrays as `as_xy` gives it (checked, labels `[N]`); anything else (a loader, a Dataset, a
    mapping) as a `Tapped` stream of it with `batch_fn` (labels None: the stream records each
    batch's as the predictor reads it, the inputs never gathered). Another tuple or list is a
    TypeError naming `name`. `device`: the model's, for the messages (`as_xy`)."""
    if is_pair(data):
        return as_xy(data, name, device=device)
    if isinstance(data, (tuple, list)):
        raise TypeError(
            f"{name}: expected a pair (X, y) of tensors or arrays, a mapping, a Dataset or a "
            f"DataLoader, got a {type(data).__name__} of {len(data)}"
        )
    return Tapped(data, batch_fn, name), None


def iter_batches(
    data: Data,
    batch_size: int,
    batch_fn: BatchFn | None = None,
    name: str = "X",
    need_labels: bool = False,
    device: torch.device | None = None,
) -> Iterator[tuple[Any, Tensor | None]]:
    """Yield `(inputs, y)` per batch (`y` None where there are none; `peg.batches`' conventions),
    both on `device`: the one path from what users pass to the device of what consumes it
    (`peg._devices`; None: where they are).

    A tensor or array is sliced into `batch_size` rows (no labels), a tuple `(X, y)` of them
    too; a mapping of tensors (`{"input_ids": [N, L], ..., "labels": [N]}`) is sliced alike;
    a Dataset is batched by a `DataLoader(batch_size=batch_size)`; a DataLoader (or a `Tapped`)
    gives its own batches, split by `split_batch(batch, batch_fn)`.
    """
    for inputs, y in _batches(data, batch_size, batch_fn, name, need_labels):
        yield move(inputs, device, name), (None if y is None else move(y, device, f"{name} labels"))


def _batches(
    data: Data, batch_size: int, batch_fn: BatchFn | None, name: str, need_labels: bool
) -> Iterator[tuple[Any, Tensor | None]]:
    """`iter_batches` where the data are."""
    if isinstance(data, (Tensor, np.ndarray)) or is_pair(data):
        X, y = (data, None) if isinstance(data, (Tensor, np.ndarray)) else data
        X = _tensor(X, name)
        y = _tensor(y, f"{name} labels") if y is not None and need_labels else None
        if y is None and need_labels:
            raise ValueError(f"{name}: labels are needed: pass (X, y) or a loader yielding (x, y)")
        for start in range(0, X.shape[0], batch_size):
            yield (
                X[start : start + batch_size],
                (None if y is None else y[start : start + batch_size]),
            )
        return
    if isinstance(data, Mapping):
        inputs, y = split_batch(data, batch_fn, name=name, need_labels=need_labels)
        rows = batch_rows(inputs, name)
        for start in range(0, rows, batch_size):
            yield (
                take_rows(inputs, start, start + batch_size),
                (None if y is None else y[start : start + batch_size]),
            )
        return
    if isinstance(data, Dataset):
        data = DataLoader(data, batch_size=batch_size)
    if isinstance(data, DataLoader):
        for j, batch in enumerate(data):
            yield split_batch(batch, batch_fn, name=name, index=j, need_labels=need_labels)
        return
    if isinstance(data, (tuple, list)) and len(data) == 2:
        for inputs, _ in _batches(data[0], batch_size, batch_fn, name, False):
            yield inputs, None
        return
    raise TypeError(
        f"{name}: expected a Tensor, numpy array, mapping of tensors, Dataset or DataLoader, "
        f"got {type(data).__name__}"
    )


def iter_inputs(
    X: Data,
    batch_size: int,
    batch_fn: BatchFn | None = None,
    device: torch.device | None = None,
) -> Iterator[Any]:
    """Yield input batches `[B, ...]` (or structured inputs) of `X` on `device` (see
    `iter_batches`); a `Tapped` records each batch's labels as it passes, on `device` too."""
    if isinstance(X, Tapped):
        batches = iter_batches(X.data, batch_size, X.batch_fn, X.name, True, device)
        for j, (inputs, y) in enumerate(batches):
            X.record(y, batch_rows(inputs, X.name), j)
            yield inputs
        return
    for inputs, _ in iter_batches(X, batch_size, batch_fn, "X", device=device):
        yield inputs


def probe_inputs(
    data: Data, name: str, batch_fn: BatchFn | None = None, device: torch.device | None = None
) -> Any:
    """Inputs of `data` to probe a model with (`diagnose` takes two rows), checked.

    Tensors and `(X, y)` pairs go through `as_xy` (labels not needed); loaders, Datasets and
    mappings are read batch by batch (any shape, `peg.batches`), each checked for NaN/inf and
    `meta`, and only the first batch's first two rows kept: nothing is gathered."""
    if isinstance(data, (Tensor, np.ndarray)) or is_pair(data):
        return as_xy(data, name, need_labels=False, device=device, batch_fn=batch_fn)[0]
    first = None
    for inputs, _ in iter_batches(data, 512, batch_fn, name):
        for t in tensors(inputs):
            check_data_device(t, name, device)
        check_finite(inputs, name)
        if first is None:
            first = take_rows(inputs, 0, 2)
    if first is None:
        raise ValueError(f"{name}: the data is empty (0 samples)")
    return first


def num_batches(X: Data, batch_size: int) -> int | None:
    """Number of batches `iter_inputs` will yield, when it is known in advance."""
    if isinstance(X, Tapped):
        return num_batches(X.data, batch_size)
    if isinstance(X, (Tensor, np.ndarray)):
        return -(-X.shape[0] // batch_size)
    if isinstance(X, DataLoader):
        try:
            return len(X)
        except TypeError:
            return None
    return None
