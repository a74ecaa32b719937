"""Validation data read by index or in order, never gathered: `ValSource`.

PEG draws its mini-batches by index, the scale search reads a capped subset of points, and the
recipe fingerprint and the data checks take one pass in order. `ValSource` gives all three from
what a user passes to `fit`:

- a tensor pair `(X, y)` (arrays too): `rows(idx)` is `X[idx], y[idx]`, as before, so the members
  are the ones an in-memory fit always made;
- a map-style `Dataset`: `rows(idx)` fetches `dataset[i]` for each index and collates them with
  `default_collate`; a `DataLoader`: its `dataset`, collated with its `collate_fn` (its sampler,
  shuffling and batch size do not matter for indexing; the pass in order uses its batch size and
  workers). A `TensorDataset` of (X, y) thus gives bit-identical members to the pair;
- an `IterableDataset` (or a loader over one) cannot be indexed: `indexable` is False, and only
  the pass in order is available (PEP scores σ on its first points; PEG refuses it).

Batches follow `peg.source.batches`' conventions (mapping items → `model(**inputs)`,
`(x, y, *ignored)` tuples, a `batch_fn` hook). Labels are checked batch by batch
(`ValSource.check`), naming the batch and its index range.

`Source.rows` and `Source.replay` make the two classes here, from what they read of the
`Source` (its data, name and `batch_fn`; its `xy` and `inputs` as callables): this module sits
below `_source` and imports nothing of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset
from torch.utils.data._utils.collate import default_collate

from peg import streams
from peg.source._devices import check_data_device as _check_device
from peg.source._devices import move
from peg.source._fingerprint import DataHasher
from peg.source._values import check_finite, check_labels, regression_targets
from peg.source.batches import BatchFn, batch_rows, split_batch, take_rows, tensors

ORDER_BATCH = 512  # rows per batch of the pass in order when the data has no batch size of its own


def cat_rows(parts: Sequence[Any]) -> Any:
    """Batches of inputs (tensors, or mappings / tuples of them) concatenated along rows."""
    first = parts[0]
    if isinstance(first, Tensor):
        return torch.cat(list(parts)) if len(parts) > 1 else first
    if isinstance(first, dict):
        return {k: cat_rows([p[k] for p in parts]) for k in first}
    if isinstance(first, (tuple, list)):
        joined = [cat_rows([p[i] for p in parts]) for i in range(len(first))]
        return joined if isinstance(first, list) else tuple(joined)
    return first


class ValSource:
    """Labelled data read by index (`rows`) or in order (`batches`); see the module doc.

    `data`, `name`, `batch_fn` are the `Source`'s; `pair()` gives a pair's tensors checked whole
    (`Source.xy` on `device`), read only for data that is not a Dataset or a DataLoader. `X`,
    `y` are the tensors of a pair (checked whole, as before), else None.
    """

    def __init__(
        self,
        data: Any,
        name: str,
        batch_fn: BatchFn | None,
        pair: Callable[[], tuple[Tensor, Tensor | None]],
        device: torch.device | None = None,
    ) -> None:
        self.device, self.name, self.batch_fn = device, name, batch_fn
        self.X: Tensor | None = None
        self.y: Tensor | None = None
        self.loader: DataLoader | None = None
        self.dataset: Any = None
        self.collate: Callable[[list[Any]], Any] = default_collate
        self.n: int | None = None
        if isinstance(data, (DataLoader, Dataset)):
            if isinstance(data, DataLoader):
                self.loader, self.dataset = data, data.dataset
                self.collate = data.collate_fn or default_collate
            else:
                self.dataset = data
            if isinstance(self.dataset, IterableDataset):
                self.n = None
            else:
                try:
                    self.n = len(self.dataset)
                except TypeError:
                    raise TypeError(
                        f"{name}: a map-style Dataset without __len__; define __len__ or pass an "
                        "IterableDataset"
                    ) from None
                if self.n == 0:
                    raise ValueError(f"{name}: the data is empty (0 samples)")
        else:  # a pair of tensors or arrays, checked whole (`Source.xy`'s errors otherwise)
            self.X, self.y = pair()
            self.n = len(self.X)
        self._classes: int | None = None  # set once the model's output width is known
        self.regression = False
        self.seen: int | None = None  # points read by the pass in order (`batches`)

    @property
    def classes(self) -> int | None:
        """The model's output width C, once known (None before)."""
        return self._classes

    @classes.setter
    def classes(self, width: int | None) -> None:
        """C known: a pair's floating-point labels that are class labels by the one rule
        (`regression_targets`: whole numbers in [0, C)) are read as class indices from here."""
        self._classes = width
        y = self.y
        if width is not None and y is not None and not regression_targets(y, width):
            self.y = y.long()

    @property
    def count(self) -> int:
        """The number of points: known in advance, or counted by a pass in order."""
        n = self.n if self.n is not None else self.seen
        if n is None:
            raise TypeError(f"{self.name}: an IterableDataset has no length before it is read")
        return n

    @property
    def indexable(self) -> bool:
        return self.n is not None

    def __len__(self) -> int:
        if self.n is None:
            raise TypeError(f"{self.name}: an IterableDataset has no length known in advance")
        return self.n

    # ---------------------------------------------------------------- by index
    def on_device(self, inputs: Any, y: Tensor) -> tuple[Any, Tensor]:
        """Inputs and labels on `device`, the model's (`peg.source._devices`; None: where they
        are)."""
        return move(inputs, self.device, self.name), move(y, self.device, f"{self.name} labels")

    def rows(self, idx: Tensor | Sequence[int]) -> tuple[Any, Tensor]:
        """Points `idx`: inputs (`[B, ...]`, or a mapping of such) and labels `[B]`, checked,
        on `device`."""
        if self.X is not None and self.y is not None:
            i = idx if isinstance(idx, Tensor) else torch.as_tensor(list(idx), dtype=torch.long)
            return self.on_device(self.X[i.to(self.X.device)], self.y[i.to(self.y.device)])
        if not self.indexable:
            raise TypeError(f"{self.name}: an IterableDataset cannot be read by index")
        items = [self.dataset[int(i)] for i in idx]
        inputs, y = split_batch(
            self.collate(items), self.batch_fn, name=self.name, need_labels=True
        )
        return self.on_device(inputs, self.check(inputs, y, f"points {_shown(idx)}"))

    def gather(self, idx: Tensor, chunk: int) -> tuple[Any, Tensor]:
        """Points `idx` gathered `chunk` at a time (at most len(idx) rows held: a capped
        subset), on `device`."""
        if self.X is not None and self.y is not None:
            return self.rows(idx)
        parts = [self.rows(idx[a : a + chunk]) for a in range(0, len(idx), chunk)]
        return cat_rows([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def view(self, idx: Tensor) -> Any:
        """The labelled data at indices `idx`, as methods take data (a fold of `AutoSelect`'s
        cross-fitting): a pair of tensors for a pair (indexed), a `Subset` of a Dataset, a
        DataLoader over the `Subset` with the loader's batch size and `collate_fn` (nothing is
        read until the view is)."""
        if self.X is not None and self.y is not None:
            return self.X[idx], self.y[idx]
        subset = Subset(self.dataset, idx.tolist())
        if self.loader is None:
            return subset
        loader = self.loader
        return DataLoader(subset, batch_size=loader.batch_size, collate_fn=loader.collate_fn)

    # ---------------------------------------------------------------- in order
    def batches(self, batch_size: int = ORDER_BATCH) -> Iterator[tuple[int, Any, Tensor]]:
        """`(start, inputs, y)` over every point in order, where the data are (this pass checks
        and fingerprints them), each batch checked (`check`) and
        named `batch j (points a–b)` in errors. A loader's own batch size and workers are
        used (not its sampler: always in index order); a Dataset's batches are `batch_size`."""
        if self.X is not None and self.y is not None:
            for a in range(0, len(self.X), batch_size):
                yield a, self.X[a : a + batch_size], self.y[a : a + batch_size]
            return
        loader = self.loader
        if loader is None or loader.batch_size is None or self._has_sampler(loader):
            size = loader.batch_size if loader is not None and loader.batch_size else batch_size
            workers = loader.num_workers if loader is not None else 0
            loader = DataLoader(
                self.dataset, batch_size=size, collate_fn=self.collate, num_workers=workers
            )
        start = 0
        for j, batch in enumerate(loader):
            inputs, y = split_batch(batch, self.batch_fn, name=self.name, index=j, need_labels=True)
            rows = batch_rows(inputs, self.name)
            where = f"batch {j} (points {start}–{start + rows - 1})"
            yield start, inputs, self.check(inputs, y, where)
            start += rows
        if start == 0:
            raise ValueError(f"{self.name}: the data is empty (0 samples)")
        self.seen = start
        if self.n is not None and start != self.n:
            raise ValueError(f"{self.name}: {self.n} points by len() but {start} read in order")

    def _has_sampler(self, loader: DataLoader) -> bool:
        """Whether a map-style loader reads in another order than 0, 1, 2, ... (shuffled or a
        sampler of its own), or drops the last batch: then a plain loader is used instead."""
        if isinstance(self.dataset, IterableDataset):
            return False
        sampler = getattr(loader, "sampler", None)
        return loader.drop_last or not isinstance(sampler, torch.utils.data.SequentialSampler)

    def first(self, batch_size: int = ORDER_BATCH) -> tuple[Any, Tensor]:
        """The inputs and labels of the first batch in order (the model is probed on it), on
        `device`."""
        if self.X is not None and self.y is not None:
            return self.on_device(self.X, self.y)
        if self.indexable:  # batch 0 of the pass in order (`batches`)
            size = self.loader.batch_size if self.loader is not None else None
            return self.rows(range(min(size or batch_size, len(self))))
        for _, inputs, y in self.batches(batch_size):
            return self.on_device(inputs, y)
        raise ValueError(f"{self.name}: the data is empty (0 samples)")  # pragma: no cover

    # ---------------------------------------------------------------- checks
    def check(self, inputs: Any, y: Tensor | None, where: str) -> Tensor:
        """Labels of one batch, checked with its inputs: as many as rows, a vector, finite,
        in [0, classes) once the model's width is known (`classes`), float iff regression; the
        inputs finite and not on `meta`. A ValueError names `where` (the batch, its points)."""
        name = f"{self.name}: {where}"
        rows = batch_rows(inputs, name)
        for t in tensors(inputs):
            _check_device(t, name, self.device)
        check_finite(inputs, name)
        if y is None:
            raise ValueError(f"{name} has no labels")
        y = check_labels(y, rows, None, name, self.device, targets=True)
        if y.ndim != 1:
            raise ValueError(f"{name}: labels must be a vector [N], got shape {tuple(y.shape)}")
        if self.classes is not None:
            if self.regression and not torch.is_floating_point(y):
                raise ValueError(
                    f"{name}: {y.dtype} labels where the first batch had float targets (regression)"
                )
            if not self.regression and torch.is_floating_point(y):  # whole numbers: classes
                if not bool((y == y.round()).all()):
                    raise ValueError(
                        f"{name}: expected integer class labels, got {y.dtype} values that are "
                        "not whole numbers; pass class indices in [0, C)"
                    )
                y = y.long()
            if not self.regression and len(y) and (y.min() < 0 or y.max() >= self.classes):
                raise ValueError(
                    f"{name}: labels must lie in [0, {self.classes}) for a model with "
                    f"{self.classes} outputs, got min {int(y.min())}, max {int(y.max())}"
                )
        return y


def split_points(
    source: ValSource, seed: int, holdout: float, cap: int | None, scale_name: str
) -> tuple[Tensor | None, Tensor | None]:
    """(direction points, scoring points) of `source` as indices (None: all of them / none).

    One seeded permutation (`streams.SPLIT`): with `holdout` > 0 its first round(holdout·N)
    points score the scale and the rest feed the directions, disjoint; with 0 every point does
    both. The scoring points are the first `cap` of their part. An IterableDataset (PEP) has no
    indices: (None, None); it scores on its first `cap` points (`read_in_order`).
    """
    if not source.indexable:
        return None, None
    N = len(source)
    perm = torch.randperm(N, generator=streams.generator(seed, streams.SPLIT))
    if holdout <= 0:
        return None, perm[:cap]
    n_score = round(holdout * N)
    if n_score == 0 or n_score == N:
        raise ValueError(
            f"val: {N} points are too few to hold out {holdout:.0%} for choosing {scale_name}"
        )
    return perm[n_score:], perm[:n_score][:cap]


def read_in_order(
    source: ValSource, batch_size: int, cap: int | None
) -> tuple[str, tuple[Any, Tensor] | None]:
    """One pass over `source` in order: every batch checked as it comes (`ValSource.check`,
    naming the batch and its points), the data's fingerprint taken (`DataHasher`), and from
    an IterableDataset the first `cap` points (all with None) kept for scoring."""
    hasher = DataHasher(source.n)
    head: list[tuple[Any, Tensor]] = []
    kept = 0
    for _, inputs, y in source.batches(batch_size):
        hasher.update(inputs, y)
        if not source.indexable and (cap is None or kept < cap):
            take = len(y) if cap is None else min(len(y), cap - kept)
            head.append((take_rows(inputs, 0, take), y[:take]))
            kept += take
    if not head:
        return hasher.hexdigest(), None
    return hasher.hexdigest(), source.on_device(
        cat_rows([x for x, _ in head]), torch.cat([y for _, y in head])
    )


class InputBatches:
    """The input batches of a source (bn="refresh", SWA's and the subspaces' statistics), read
    anew on every pass, never gathered, each checked for NaN/inf: iterable any number of times
    (`torch.optim.swa_utils.update_bn` reads it once per member). `Source.replay` makes one
    from its `inputs` (`inputs(batch_size)`: one pass over the input batches) and name."""

    def __init__(self, inputs: Callable[[int], Iterable[Any]], name: str, batch_size: int) -> None:
        self.inputs, self.name, self.batch_size = inputs, name, batch_size

    def __iter__(self) -> Iterator[Any]:
        for j, inputs in enumerate(self.inputs(self.batch_size)):
            check_finite(inputs, f"{self.name}: batch {j}")
            yield inputs

    def check_not_empty(self) -> None:
        """Read the first batch (only): an empty source is a ValueError naming it."""
        if next(iter(self), None) is None:
            raise ValueError(f"{self.name}: the data is empty (0 samples)")


def _shown(idx: Tensor | Sequence[int]) -> str:
    """A short description of indices, for errors."""
    values = [int(i) for i in idx]
    if not values:
        return "[]"
    if len(values) <= 4:
        return str(values)
    return f"[{values[0]}, {values[1]}, ... {values[-1]}] ({len(values)} points)"


__all__ = [
    "ORDER_BATCH",
    "InputBatches",
    "ValSource",
    "cat_rows",
    "read_in_order",
    "split_points",
    "take_rows",
]
