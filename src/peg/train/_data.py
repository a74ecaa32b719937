"""What `train` reads its batches from (`TrainingData`): tensors in memory, a map-style Dataset
read item by item, or an IterableDataset streamed in order; never the whole set gathered.

- A pair `(X, y)` of tensors or arrays: each epoch draws a permutation of the rows from the
  run's generator and slices `X[idx]`, as `train` always has.
- A map-style `Dataset` (or a `DataLoader` over one): the same permutation from the same
  generator, the items of each batch fetched by index (`dataset[i]`, or `__getitems__`) and
  collated (`default_collate`, or the loader's `collate_fn`). A `TensorDataset` of `(X, y)`
  therefore gives the very batches the tensors give, bit for bit. A loader's sampler,
  `shuffle` and `batch_size` are not used (the order is the run's, the batch size the
  recipe's); its `num_workers`, `pin_memory`, `worker_init_fn` and `timeout` are.
- An `IterableDataset` (or a loader over one): streamed in the order it yields, every epoch;
  no shuffling is possible (shuffle inside the dataset if needed). A bare IterableDataset is
  batched by the recipe's batch size; a loader keeps its own batches.

Batches are split by `peg.source.batches` (mapping batches: labels under "labels"/"label", the model
called as `model(**inputs)`; tuples `(x, y, *ignored)`; or `batch_fn`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from peg.source import Source, is_pair
from peg.source.batches import BatchFn, split_batch

LOADER_OPTIONS = ("num_workers", "pin_memory", "worker_init_fn", "timeout")


@dataclass
class Batch:
    """One training batch: its number in the epoch, inputs, labels and where it came from."""

    index: int
    inputs: Any
    y: Any
    start: int  # position of its first sample in the epoch's order
    ids: Tensor | None = None  # dataset indices (shuffled sources), None for a stream

    def where(self, epoch: int) -> str:
        """`batch 3 of epoch 1 (samples 96:128 of the epoch's order, dataset indices ...)`."""
        rows = len(self.ids) if self.ids is not None else _rows(self.y)
        span = f"samples {self.start}:{self.start + rows}"
        if self.ids is None:
            return f"batch {self.index} of epoch {epoch} ({span} of the stream, in order)"
        shown = self.ids[:6].tolist()
        more = ", ..." if len(self.ids) > 6 else ""
        return (
            f"batch {self.index} of epoch {epoch} ({span} of the epoch's shuffled order; "
            f"dataset indices {str(shown)[1:-1]}{more})"
        )


def _rows(y: Any) -> int:
    return int(y.shape[0]) if isinstance(y, Tensor) and y.ndim > 0 else 1


def check_labelled(data: Any, name: str, device: torch.device | None) -> None:
    """For methods that pass `data` on to `train`: tensors checked as a whole now, with errors
    naming `name` (a Dataset or stream is checked batch by batch by `train`)."""
    if isinstance(data, (Tensor, np.ndarray)):
        raise ValueError(f"{name}: training needs labels, got inputs only")
    if is_pair(data):
        Source(data, name=name).xy(device=device)


class TrainingData:
    """The batches of one training run (see the module docstring)."""

    def __init__(
        self,
        data: Any,
        batch_size: int,
        batch_fn: BatchFn | None = None,
        device: torch.device | None = None,
        seed: int = 0,
    ) -> None:
        self.batch_size, self.batch_fn, self.seed = batch_size, batch_fn, seed
        self.X = self.y = None
        self.loader: DataLoader | None = None
        self.options: dict[str, Any] = {}
        if isinstance(data, (Tensor, np.ndarray)):
            raise ValueError(
                "data: training needs labels, got inputs only; pass (X, y) or a Dataset or "
                "DataLoader yielding (x, y) or mappings with 'labels'"
            )
        if is_pair(data):
            self.kind = "tensors"
            if batch_fn is not None:
                raise ValueError(
                    "batch_fn: applies to the batches of a Dataset or DataLoader, not to a "
                    "pair (X, y) of tensors"
                )
            self.X, self.y = Source(data, name="data").xy(device=device)
            self.n: int | None = len(self.X)
            return
        if isinstance(data, DataLoader):
            dataset = data.dataset
            if isinstance(dataset, IterableDataset):
                self.kind, self.loader, self.n = "stream", data, None
                return
            self.collate = data.collate_fn
            self.options = {k: getattr(data, k) for k in LOADER_OPTIONS}
            if data.num_workers > 0:
                self.options["multiprocessing_context"] = data.multiprocessing_context
        elif isinstance(data, IterableDataset):
            self.kind, self.n = "stream", None
            # its own generator: iterating never draws from the global RNG (dropout's)
            gen = torch.Generator().manual_seed(seed)
            self.loader = DataLoader(data, batch_size=batch_size, generator=gen)
            return
        elif isinstance(data, Dataset):
            dataset, self.collate = data, default_collate
        else:
            raise TypeError(
                "data: expected a pair (X, y), a Dataset or a DataLoader, got "
                f"{type(data).__name__}"
            )
        try:
            self.n = len(cast(Sized, dataset))
        except TypeError:
            raise TypeError(
                f"data: a map-style Dataset needs __len__ to draw its order "
                f"({type(dataset).__name__} has none); or make it an IterableDataset"
            ) from None
        self.kind, self.dataset = "items", dataset

    @property
    def in_memory(self) -> bool:
        """Tensors, checked as a whole before training (the rest is checked batch by batch)."""
        return self.kind == "tensors"

    def steps_per_epoch(self) -> int | None:
        """Batches per epoch, None for a stream that does not say."""
        if self.n is not None:
            return math.ceil(self.n / self.batch_size)
        try:
            return len(cast(Sized, self.loader))
        except TypeError:
            return None

    def epoch(self, gen: torch.Generator, epoch: int) -> Iterator[Batch]:
        """The batches of one epoch (the permutation drawn from `gen` first, as `train` always
        has; a stream draws nothing)."""
        if self.kind == "stream":
            assert self.loader is not None
            start = 0
            for j, raw in enumerate(self.loader):
                inputs, y = split_batch(raw, self.batch_fn, name="data", index=j, need_labels=True)
                yield Batch(j, inputs, y, start)
                start += _rows(y)
            return
        assert self.n is not None
        perm = torch.randperm(self.n, generator=gen)
        index_batches = [perm[s : s + self.batch_size] for s in range(0, self.n, self.batch_size)]
        if self.kind == "tensors":
            assert self.X is not None and self.y is not None
            for j, idx in enumerate(index_batches):
                yield Batch(j, self.X[idx], self.y[idx], j * self.batch_size, idx)
            return
        for j, (idx, raw) in enumerate(
            zip(index_batches, self._fetch(index_batches, epoch), strict=True)
        ):
            inputs, y = split_batch(raw, self.batch_fn, name="data", index=j, need_labels=True)
            yield Batch(j, inputs, y, j * self.batch_size, idx)

    def _fetch(self, index_batches: list[Tensor], epoch: int) -> Iterator[Any]:
        """The collated items of each index batch, in order (loader workers when given)."""
        if self.options.get("num_workers", 0) > 0:
            # workers seeded from a generator of (seed, epoch), never from the global RNG
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            yield from DataLoader(
                self.dataset,
                batch_sampler=[idx.tolist() for idx in index_batches],
                collate_fn=self.collate,
                generator=gen,
                **self.options,
            )
            return
        getitems = getattr(self.dataset, "__getitems__", None)
        for idx in index_batches:
            ids = idx.tolist()
            items = getitems(ids) if getitems is not None else [self.dataset[i] for i in ids]
            yield self.collate(items)
