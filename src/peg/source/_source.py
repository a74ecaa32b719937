"""`Source`: what a user passes as data (tensors, arrays, a pair `(X, y)`, mappings, datasets,
loaders, with a `batch_fn` hook), read one way by every consumer of peg.

An ensemble's forward passes, a method's fit, the calibrators, conformal prediction,
`peg.evaluate`, `peg.distributed`, `compare` and `AutoSelect` wrap what they were given in a
`Source` (`Source.of`) and read it through its methods, never by asking what it is themselves:

- `batches` / `inputs`: batch by batch, on the device of what consumes them (the device rule,
  `peg.source._devices.move`), never gathered;
- `xy`: gathered as tensors `(X [N, ...], y [N])`, checked (where all of it is needed at once);
- `labelled`: as a consumer that needs labels reads it in one pass: a pair as `xy` gives it,
  anything else as a `Tapped` source, which records each batch's labels as `inputs` yields it;
- `rows`: read by index or in order, checked batch by batch (`peg.source._rows.ValSource`: PEG's
  mini-batches, the scale search's subset, `AutoSelect`'s fold views);
- `probe`, `num_batches`, `known_rows`, `by_index`, `replay`: the first rows, how many batches or
  points, batches read by index, a source read anew on every pass.

The value checks are `peg.source._values`, the batch conventions `peg.source.batches`.
"""

from __future__ import annotations

import functools
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

from peg.source._devices import check_data_device, move
from peg.source._rows import InputBatches, ValSource
from peg.source._values import check_finite, check_labels, refuse_names
from peg.source.batches import (
    BatchFn,
    array_likes,
    as_array,
    batch_rows,
    describe_inputs,
    from_numpy,
    is_pair,
    split_batch,
    take_rows,
    tensors,
)

Data = Any  # Tensor | np.ndarray | tuple[X, y] | Mapping | Dataset | DataLoader | Source


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


class _Reread(IterableDataset):
    """The batches `make()` yields, `make` called anew on every read (`reread_loader`)."""

    def __init__(self, make: Callable[[], Iterator[Any]]) -> None:
        self.make = make

    def __iter__(self) -> Iterator[Any]:
        return iter(self.make())


def reread_loader(make: Callable[[], Iterator[Any]]) -> DataLoader:
    """A DataLoader of the batches `make()` yields, each as it is (`batch_size=None`), `make`
    called again on every read: batches built on the fly (read back from files, say) that any
    fit reads as a loader, pass after pass."""
    return DataLoader(_Reread(make), batch_size=None)


class Source:
    """`data` as peg reads it: `batch_fn` splits a batch of another shape into `(inputs, y)`
    (`peg.source.batches`), `name` is the argument's name in errors. See the module doc."""

    def __init__(self, data: Data, batch_fn: BatchFn | None = None, name: str = "X") -> None:
        self.data, self.batch_fn, self.name = array_likes(data), batch_fn, name

    @classmethod
    def of(cls, data: Data, batch_fn: BatchFn | None = None, name: str = "X") -> Source:
        """`data` as a Source; a Source (a `Tapped` one too) as it is."""
        return data if isinstance(data, Source) else cls(data, batch_fn, name)

    # ---------------------------------------------------------------- what it holds
    def known_rows(self) -> int | None:
        """How many points the data hold when that is known without reading them (a pair of
        tensors, a map-style Dataset with a length, a loader over one), else None."""
        data = self.data
        if is_pair(data, arrays=False) and hasattr(data[1], "__len__"):
            return len(data[1])
        if isinstance(data, DataLoader):
            data = data.dataset
        if isinstance(data, Dataset) and not isinstance(data, IterableDataset):
            try:
                return len(cast(Sized, data))
            except TypeError:
                return None
        return None

    def num_batches(self, batch_size: int) -> int | None:
        """Number of batches `inputs` will yield, when it is known in advance."""
        data = self.data
        if isinstance(data, (Tensor, np.ndarray)):
            return -(-data.shape[0] // batch_size)
        if isinstance(data, DataLoader):
            try:
                return len(data)
            except TypeError:
                return None
        return None

    def by_index(self, batch_size: int) -> tuple[int, Callable[[int], Any]] | None:
        """The batches read by index, where they are known in advance: a map-style Dataset
        cut into `batch_size` items, or a DataLoader with a batch size reading its map-style
        dataset in index order (its batch size, `collate_fn` and `drop_last`). `(count, batch)`:
        the number of batches and `batch(j)`, batch j's items read by index and collated as the
        loader would. None otherwise (tensors, a shuffling or custom sampler, an
        IterableDataset): those are read in order."""
        loader = self.data if isinstance(self.data, DataLoader) else None
        dataset = loader.dataset if loader is not None else self.data
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

    # ---------------------------------------------------------------- gathered
    def xy(
        self, need_labels: bool = True, device: torch.device | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """The data materialised as `(X [N, ...], y [N])`, checked.

        Accepts a tuple `(X, y)` of tensors/arrays, inputs alone, a map-style Dataset or a
        DataLoader yielding `(x, y)` batches (iterated once, in order). Labels are int64 where
        they are integral; `need_labels=False` allows data without labels (y is then None).

        Refused, with an error naming the source: no samples, inputs without a batch dimension,
        as many labels as inputs not given, NaN or inf in floating-point inputs or labels, and
        data on the `meta` device (`device`: the model's, for the message; see `model_device`).
        """
        data, name = self.data, self.name
        if is_pair(data):
            X, y = _tensor(data[0], name), _tensor(data[1], name)
        elif isinstance(data, (Tensor, np.ndarray)):
            X, y = _tensor(data, name), None
        elif isinstance(data, (DataLoader, Dataset)):
            xs, ys = [], []
            for j, batch in enumerate(as_loader(data, 512)):
                x, yb = _split_batch(batch, name, self.batch_fn, j)
                xs.append(x)
                if yb is not None:
                    ys.append(yb)
            if not xs:
                raise ValueError(f"{name}: the data is empty (0 samples)")
            X = torch.cat(xs)
            y = torch.cat(ys) if ys else None
        else:
            raise TypeError(
                f"{name}: expected a tuple (X, y), a Dataset or a DataLoader, got "
                f"{type(data).__name__}"
            )
        check_data_device(X, name, device)
        if X.ndim == 0:
            raise ValueError(f"{name}: expected inputs [N, ...], got a scalar")
        if X.shape[0] == 0:
            raise ValueError(f"{name}: the data is empty (0 samples)")
        check_finite(X, name)
        if y is not None:
            y = check_labels(y, X.shape[0], None, name, device, targets=True)
        if need_labels and y is None:
            raise ValueError(f"{name}: labels are needed: pass (X, y) or a loader yielding (x, y)")
        return X, y

    def labelled(self, device: torch.device | None = None) -> tuple[Tensor | Tapped, Tensor | None]:
        """Labelled data as its consumers read it in one pass: a pair `(X, y)` of tensors or
        arrays as `xy` gives it (checked, labels `[N]`); anything else (a loader, a Dataset, a
        mapping) as a `Tapped` source (labels None: it records each batch's as the predictor
        reads it, the inputs never gathered). Another tuple or list is a TypeError naming the
        source. `device`: the model's, for the messages."""
        data = self.data
        if is_pair(data):
            return self.xy(device=device)
        if isinstance(data, (tuple, list)):
            raise TypeError(
                f"{self.name}: expected a pair (X, y) of tensors or arrays, a mapping, a Dataset "
                f"or a DataLoader, got a {type(data).__name__} of {len(data)}"
            )
        return Tapped(data, self.batch_fn, self.name), None

    # ---------------------------------------------------------------- batch by batch
    def batches(
        self,
        batch_size: int,
        device: torch.device | None = None,
        need_labels: bool = False,
    ) -> Iterator[tuple[Any, Tensor | None]]:
        """Yield `(inputs, y)` per batch (`y` None where there are none; `peg.source.batches`'
        conventions), both on `device`: the one path from what users pass to the device of
        what consumes it (`peg.source._devices`; None: where they are).

        A tensor or array is sliced into `batch_size` rows (no labels), a tuple `(X, y)` of them
        too; a mapping of tensors (`{"input_ids": [N, L], ..., "labels": [N]}`) is sliced alike;
        a Dataset is batched by a `DataLoader(batch_size=batch_size)`; a DataLoader gives its
        own batches, split by `split_batch(batch, batch_fn)`.
        """
        name = self.name
        for inputs, y in self._where_they_are(self.data, batch_size, need_labels):
            labels = None if y is None else move(y, device, f"{name} labels")
            yield move(inputs, device, name), labels

    def _where_they_are(
        self, data: Data, batch_size: int, need_labels: bool
    ) -> Iterator[tuple[Any, Tensor | None]]:
        """`batches` where the data are."""
        name, batch_fn = self.name, self.batch_fn
        if isinstance(data, (Tensor, np.ndarray)) or is_pair(data):
            X, y = (data, None) if isinstance(data, (Tensor, np.ndarray)) else data
            _tensor(X[:0], name)  # the type checked before any batch
            y = _tensor(y, f"{name} labels") if y is not None and need_labels else None
            if y is None and need_labels:
                raise ValueError(
                    f"{name}: labels are needed: pass (X, y) or a loader yielding (x, y)"
                )
            for start in range(0, X.shape[0], batch_size):
                yield (
                    # an array sliced first: a big-endian memmap is swapped a batch at a time
                    _tensor(X[start : start + batch_size], name),
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
        if is_pair(data, arrays=False):  # structured inputs (a mapping, ...) with labels
            for inputs, _ in self._where_they_are(data[0], batch_size, False):
                yield inputs, None
            return
        raise TypeError(
            f"{name}: expected a Tensor, numpy array, mapping of tensors, Dataset or DataLoader, "
            f"got {type(data).__name__}"
        )

    def inputs(self, batch_size: int, device: torch.device | None = None) -> Iterator[Any]:
        """Yield input batches `[B, ...]` (or structured inputs) on `device` (see `batches`)."""
        for inputs, _ in self.batches(batch_size, device):
            yield inputs

    def probe(self, device: torch.device | None = None) -> Any:
        """Inputs to probe a model with (`diagnose` takes two rows), checked.

        Tensors and `(X, y)` pairs go through `xy` (labels not needed); loaders, Datasets and
        mappings are read batch by batch (any shape, `peg.source.batches`), each checked for
        NaN/inf and `meta`, and only the first batch's first two rows kept: nothing is
        gathered."""
        if isinstance(self.data, (Tensor, np.ndarray)) or is_pair(self.data):
            return self.xy(need_labels=False, device=device)[0]
        first = None
        for inputs, _ in self.batches(512):
            for t in tensors(inputs):
                check_data_device(t, self.name, device)
            check_finite(inputs, self.name)
            if first is None:
                first = take_rows(inputs, 0, 2)
        if first is None:
            raise ValueError(f"{self.name}: the data is empty (0 samples)")
        return first

    # ---------------------------------------------------------------- by index, again
    def rows(self, device: torch.device | None = None) -> ValSource:
        """Labelled data read by index or in order, checked batch by batch, on `device`
        (`peg.source._rows.ValSource`)."""
        return ValSource(
            self.data, self.name, self.batch_fn, functools.partial(self.xy, device=device), device
        )

    def replay(self, batch_size: int) -> InputBatches:
        """The input batches, read anew on every pass (`peg.source._rows.InputBatches`): inputs
        X, a pair, a mapping of tensors, a Dataset or a DataLoader, else a TypeError naming the
        source."""
        kinds = (Tensor, np.ndarray, Mapping, Dataset, DataLoader)
        if not (is_pair(self.data) or isinstance(self.data, kinds)):
            raise TypeError(
                f"{self.name}: expected inputs X, a tuple (X, y), a mapping of tensors, a "
                f"Dataset or a DataLoader, got {type(self.data).__name__}"
            )
        return InputBatches(self.inputs, self.name, batch_size)


class Tapped(Source):
    """A source whose `inputs` record each batch's labels as they pass.

    Handed (by `peg.evaluate`, the calibrators, conformal prediction) to a predictor's
    `member_logits` in place of the data itself, so that one pass over a loader gives both the
    logits and the labels, batch by batch, the inputs never gathered.
    """

    def __init__(self, data: Data, batch_fn: BatchFn | None = None, name: str = "X") -> None:
        super().__init__(data, batch_fn, name)
        self._seen: list[Tensor] = []  # labels of the batches read since the last `take_labels`

    def inputs(self, batch_size: int, device: torch.device | None = None) -> Iterator[Any]:
        """`Source.inputs`, each batch's labels (on `device` too) recorded as it passes."""
        for j, (inputs, y) in enumerate(self.batches(batch_size, device, need_labels=True)):
            self.record(y, batch_rows(inputs, self.name), j)
            yield inputs

    def record(self, y: Tensor | None, rows: int, index: int) -> None:
        """Keep the labels `y` `[B]` of batch `index`, which has `rows` inputs; a ValueError
        naming the batch where they are missing or of another length."""
        if y is None or y.ndim == 0 or len(y) != rows:
            got = "no labels" if y is None else f"labels of shape {tuple(y.shape)}"
            raise ValueError(f"{self.name}: batch {index} has {rows} inputs but {got}")
        self._seen.append(y)

    def labels(self) -> Tensor:
        """The labels of every batch seen, in order, `[N]`."""
        if not self._seen:
            raise ValueError(f"{self.name}: the data is empty (0 samples)")
        return torch.cat(self._seen)

    def take_labels(self) -> Tensor:
        """`labels()`, then forgotten: the labels of the batches read since the last call (one
        batch's where the logits are consumed batch by batch)."""
        labels, self._seen = self.labels(), []
        return labels

    def by_index(self, batch_size: int) -> None:
        """None: a tapped source is read in order, every batch (its labels are recorded)."""
        return None

    def untapped(self) -> Source:
        """The same data as a plain source, to read again without recording labels (a later
        pass, e.g. a lazy PEG/PEP's next chunk of members)."""
        return Source(self.data, self.batch_fn, self.name)


def _tensor(a: Any, name: str) -> Tensor:
    if isinstance(a, Tensor):
        return a
    a = as_array(a)
    if isinstance(a, np.ndarray):
        refuse_names(a, name)
        return from_numpy(a)
    raise TypeError(f"{name}: expected a Tensor or numpy array, got {type(a).__name__}")


def _split_batch(
    batch: Any, name: str, batch_fn: BatchFn | None = None, index: int | None = None
) -> tuple[Tensor, Tensor | None]:
    """A batch as tensors `(x, y)` for the paths that gather it (`Source.xy`)."""
    x, y = split_batch(batch, batch_fn, name=name, index=index)
    if not isinstance(x, Tensor):
        raise TypeError(
            f"{name}: batches of structured inputs ({describe_inputs(x)}) cannot be gathered "
            "into one tensor here; this entry point takes tensor inputs (see "
            "docs/data.md#batches-of-any-shape for where mappings go)"
        )
    return x, y
