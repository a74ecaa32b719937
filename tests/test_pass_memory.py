"""The pass in order keeps nothing small behind each batch (the cause of issue 22's memory
growth on a DataLoader: benchmarks/streaming_memory.py --loader-case, whose transcript is in
results/benchmarks/streaming_memory_loader.txt).

Each batch of a pass is a large short-lived allocation; glibc serves it from the heap once its
dynamic mmap threshold has risen past the batch size, and any small tensor allocated after it
and kept (the batch's labels, held for the fingerprint) pins the heap above it: the process
grew by 1-2 GB over a 1.97 GB loader. These tests check the mechanism of the fix, cheaply:
the labels go into one buffer allocated once, and the batches are hashed without copies.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from peg.source import Source
from peg.source._fingerprint import DataHasher, _buffer, _Labels, data_fingerprint
from peg.source._rows import read_in_order


def test_the_labels_of_a_pass_live_in_one_buffer_allocated_once():
    hasher = DataHasher(1000)
    first = None
    for start in range(0, 1000, 64):
        hasher.update(torch.randn(min(64, 1000 - start), 3), torch.zeros(min(64, 1000 - start)))
        first = hasher.ys.buf.data_ptr() if first is None else first
        assert hasher.ys.buf.data_ptr() == first  # no per-batch tensor kept, no regrowth
    assert hasher.ys.all().shape == (1000,)


def test_batches_are_hashed_in_place():
    t = torch.randn(64, 3, 8, 8)
    assert np.shares_memory(_buffer(t), t.numpy())  # not a tobytes() copy
    assert bytes(_buffer(t)) == t.numpy().tobytes()


def test_the_fingerprint_of_a_loader_is_the_tensors_one():
    X, y = torch.randn(300, 2, 4), torch.randint(0, 3, (300,))
    loader = DataLoader(TensorDataset(X, y), batch_size=64)
    fingerprint, _ = read_in_order(Source(loader, name="val").rows(), 64, None)
    assert fingerprint == data_fingerprint(X, y)


def test_labels_of_unknown_count_grow_and_keep_order_and_promotion():
    labels = _Labels(None)
    parts = [torch.arange(a, a + 700) for a in range(0, 2800, 700)]
    for part in parts:
        labels.append(part)
    assert torch.equal(labels.all(), torch.cat(parts))
    labels.append(torch.tensor([0.5]))  # a float batch after integer ones: torch.cat's promotion
    assert labels.all().dtype == torch.float32 and labels.all()[-1] == 0.5
