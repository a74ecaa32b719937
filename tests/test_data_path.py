"""The data path's small pieces that other modules ask instead of `torch.utils.data`
(`peg.source.Source`: `labelled`, `known_rows`, `by_index`; `as_loader`, the predicates), a
`Tapped` source's own bookkeeping of labels (`record`, `take_labels`, `untapped`), and that every
consumer reads through `Source`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

import peg
from peg.source import (
    Source,
    Tapped,
    as_loader,
    is_dataset,
    is_dataset_or_loader,
    is_loader,
)

X = torch.arange(30, dtype=torch.float32).reshape(10, 3)
Y = torch.arange(10) % 3


class Stream(IterableDataset):
    def __iter__(self):
        return iter(zip(X, Y, strict=True))


class NoLength(Dataset):
    def __getitem__(self, i: int):
        return X[i], Y[i]


def test_labelled_takes_a_pair_whole_and_taps_the_rest():
    x, y = Source((X, Y), name="val").labelled()
    assert torch.equal(x, X) and torch.equal(y, Y)
    loader = DataLoader(TensorDataset(X, Y), batch_size=4)
    tapped, none = Source(loader, name="val").labelled()
    assert isinstance(tapped, Tapped) and none is None and tapped.name == "val"
    plain = tapped.untapped()
    assert type(plain) is Source and plain.data is loader and plain.batch_fn is None
    assert Source.of(tapped, batch_fn=lambda b: b) is tapped  # a source keeps its own hook
    with pytest.raises(TypeError, match="val: expected a pair .* got a tuple of 3"):
        Source((X, Y, Y), name="val").labelled()


def test_a_tapped_stream_records_and_hands_over_its_labels():
    tapped = Tapped(DataLoader(TensorDataset(X, Y), batch_size=4), name="val")
    seen = [len(x) for x in tapped.inputs(4)]
    assert tapped.by_index(4) is None  # read in order: every batch's labels recorded
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
    assert [Source(d).known_rows() for d in ((X, Y), dataset, loader)] == [10, 10, 10]
    assert Source(Stream()).known_rows() is None and Source(NoLength()).known_rows() is None
    assert Source(X).known_rows() is None


def test_by_index_batches_are_the_loaders_batches_and_only_where_they_are_known():
    dataset = TensorDataset(X, Y)
    for loader in (
        DataLoader(dataset, batch_size=4),
        DataLoader(dataset, batch_size=4, drop_last=True),
        DataLoader(dataset, batch_size=3, collate_fn=lambda items: items),
    ):
        plan = Source(loader).by_index(512)
        assert plan is not None
        count, batch = plan
        expected = list(loader)
        assert count == len(expected)
        for j, want in enumerate(expected):
            pairs = zip(batch(j), want, strict=True)
            if isinstance(want[0], tuple):  # the identity collate: a list of (x, y) items
                pairs = ((a, b) for got, w in pairs for a, b in zip(got, w, strict=True))
            assert all(torch.equal(a, b) for a, b in pairs)
    count, batch = Source(dataset).by_index(4)
    assert count == 3 and torch.equal(batch(2)[0], X[8:])
    assert Source(DataLoader(dataset, batch_size=4, shuffle=True)).by_index(4) is None
    assert Source(DataLoader(Stream(), batch_size=4)).by_index(4) is None
    assert Source(Stream()).by_index(4) is None
    assert Source(X).by_index(4) is None
    assert Source(DataLoader(dataset, batch_size=None)).by_index(4) is None


def test_torch_data_is_imported_by_the_data_path_only():
    """Outside `data/` and `train/`, only the data path imports `torch.utils.data` (issue 41:
    at most three modules); everyone else asks `peg.source`."""
    root = Path(peg.__file__).parent
    importers = sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*.py")
        if path.relative_to(root).parts[0] not in ("data", "train")
        and "torch.utils.data" in path.read_text(encoding="utf-8")
    )
    assert importers == ["source/_rows.py", "source/_source.py"]


IMPORT_SOURCE_MODULE = re.compile(r"^\s*(from|import) peg\.source\._source\b", re.M)


def test_every_consumer_reads_through_the_source_package():
    """Outside `source/`, modules take `Source` and the kind predicates from `peg.source`, never
    the module behind it (issue 41: one data module, read one way)."""
    root = Path(peg.__file__).parent
    reaching_in = sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*.py")
        if path.relative_to(root).parts[0] != "source"
        and IMPORT_SOURCE_MODULE.search(path.read_text(encoding="utf-8"))
    )
    assert reaching_in == []
