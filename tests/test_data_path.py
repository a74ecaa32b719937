"""The data path's small pieces that other modules ask instead of `torch.utils.data`
(`peg._inputs`: `pair_or_tapped`, `known_rows`, `index_batches`, `as_loader`, the predicates)
and a `Tapped` stream's own bookkeeping of labels (`record`, `take_labels`, `untapped`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

import peg
from peg._inputs import (
    as_loader,
    index_batches,
    is_dataset,
    is_dataset_or_loader,
    is_loader,
    iter_inputs,
    known_rows,
    pair_or_tapped,
)
from peg.batches import Tapped

X = torch.arange(30, dtype=torch.float32).reshape(10, 3)
Y = torch.arange(10) % 3


class Stream(IterableDataset):
    def __iter__(self):
        return iter(zip(X, Y, strict=True))


class NoLength(Dataset):
    def __getitem__(self, i: int):
        return X[i], Y[i]


def test_pair_or_tapped_takes_a_pair_whole_and_streams_the_rest():
    x, y = pair_or_tapped((X, Y), "val")
    assert torch.equal(x, X) and torch.equal(y, Y)
    loader = DataLoader(TensorDataset(X, Y), batch_size=4)
    tapped, none = pair_or_tapped(loader, "val", batch_fn=None)
    assert isinstance(tapped, Tapped) and none is None and tapped.untapped() == (loader, None)
    with pytest.raises(TypeError, match="val: expected a pair .* got a tuple of 3"):
        pair_or_tapped((X, Y, Y), "val")


def test_a_tapped_stream_records_and_hands_over_its_labels():
    tapped = Tapped(DataLoader(TensorDataset(X, Y), batch_size=4), name="val")
    seen = [len(x) for x in iter_inputs(tapped, 4)]
    assert seen == [4, 4, 2]
    assert torch.equal(tapped.labels(), Y)
    assert torch.equal(tapped.take_labels(), Y)  # then forgotten
    with pytest.raises(ValueError, match="val: the data is empty"):
        tapped.take_labels()
    with pytest.raises(ValueError, match="val: batch 3 has 4 inputs but labels of shape"):
        tapped.record(Y[:3], 4, 3)
    with pytest.raises(ValueError, match="val: batch 0 has 4 inputs but no labels"):
        tapped.record(None, 4, 0)


def test_the_predicates_and_known_rows():
    dataset = TensorDataset(X, Y)
    loader = DataLoader(dataset, batch_size=4)
    assert is_loader(loader) and not is_loader(dataset)
    assert is_dataset(dataset) and is_dataset(Stream()) and not is_dataset(loader)
    assert is_dataset_or_loader(dataset) and is_dataset_or_loader(loader)
    assert not is_dataset_or_loader(X) and not is_dataset_or_loader((X, Y))
    assert as_loader(loader, 2) is loader and as_loader(dataset, 3).batch_size == 3
    assert known_rows((X, Y)) == 10 and known_rows(dataset) == 10 and known_rows(loader) == 10
    assert known_rows(Stream()) is None and known_rows(NoLength()) is None
    assert known_rows(X) is None


def test_index_batches_are_the_loaders_batches_and_only_where_they_are_known():
    dataset = TensorDataset(X, Y)
    for loader in (
        DataLoader(dataset, batch_size=4),
        DataLoader(dataset, batch_size=4, drop_last=True),
        DataLoader(dataset, batch_size=3, collate_fn=lambda items: items),
    ):
        plan = index_batches(loader, 512)
        assert plan is not None
        count, batch = plan
        expected = list(loader)
        assert count == len(expected)
        for j, want in enumerate(expected):
            pairs = zip(batch(j), want, strict=True)
            if isinstance(want[0], tuple):  # the identity collate: a list of (x, y) items
                pairs = ((a, b) for got, w in pairs for a, b in zip(got, w, strict=True))
            assert all(torch.equal(a, b) for a, b in pairs)
    count, batch = index_batches(dataset, 4)
    assert count == 3 and torch.equal(batch(2)[0], X[8:])
    assert index_batches(DataLoader(dataset, batch_size=4, shuffle=True), 4) is None
    assert index_batches(DataLoader(Stream(), batch_size=4), 4) is None
    assert index_batches(Stream(), 4) is None
    assert index_batches(X, 4) is None
    assert index_batches(DataLoader(dataset, batch_size=None), 4) is None


def test_torch_data_is_imported_by_the_data_path_only():
    """Outside `data/` and `train/`, only the data path imports `torch.utils.data` (issue 41:
    at most three modules); everyone else asks `peg._inputs`."""
    root = Path(peg.__file__).parent
    importers = sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*.py")
        if path.relative_to(root).parts[0] not in ("data", "train")
        and "torch.utils.data" in path.read_text(encoding="utf-8")
    )
    assert importers == ["_inputs.py", "_rows.py"]
