"""The validation data's fingerprint, taken whole (`data_fingerprint`) or batch by batch as
the data are read in order (`DataHasher`, `peg.source._rows.read_in_order`'s pass).

A PEG/PEP recipe (`peg.recipe`) records it, and a rebuild refuses other data: the same value
whether the data came as tensors, a Dataset or a DataLoader. Here in `source/`, beside the pass
that takes it, so that `peg.recipe` (a format, below the inputs) imports nothing of them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import Tensor

from peg.source.batches import leaves


def data_fingerprint(X: Tensor, y: Tensor) -> str:
    """SHA-256 of the validation inputs and labels (their values, dtypes and shapes)."""
    h = hashlib.sha256()
    for t in (X, y):
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


class DataHasher:
    """`data_fingerprint` taken batch by batch (`update(inputs, y)` in order, then `hexdigest`).

    With tensor inputs and the number of points `n` known in advance, the bytes hashed are the
    ones `data_fingerprint(X, y)` hashes, in the same order, so the value is the same (recipes
    saved from tensors load from the equivalent Dataset or DataLoader, and back). Structured
    inputs (a mapping of tensors) or an unknown `n` (an IterableDataset) hash each input tensor
    on its own, then their digests: a value independent of the batch boundaries. The labels are
    kept until the end (8 bytes a point), since their bytes come after every input's.
    """

    def __init__(self, n: int | None) -> None:
        self.n, self.h = n, hashlib.sha256()
        self.started = False
        self.leaves: dict[str, tuple[Any, str, int]] = {}  # path → (hasher, header, rows)
        self.ys = _Labels(n)

    def update(self, inputs: Any, y: Tensor) -> None:
        # the buffers are hashed in place (no `tobytes()` copy of every batch: see `_Labels`)
        if isinstance(inputs, Tensor) and self.n is not None and not self.leaves:
            t = inputs.detach().cpu().contiguous()
            if not self.started:
                self.h.update(f"{t.dtype}{(self.n, *t.shape[1:])}".encode())
                self.started = True
            self.h.update(_buffer(t))
        else:
            for path, t in leaves(inputs):
                t = t.detach().cpu().contiguous()
                hasher, head, rows = self.leaves.get(
                    path, (hashlib.sha256(), f"{path}{t.dtype}{tuple(t.shape[1:])}", 0)
                )
                hasher.update(_buffer(t))
                self.leaves[path] = (hasher, head, rows + (len(t) if t.ndim else 1))
        self.ys.append(y.detach().cpu())

    def hexdigest(self) -> str:
        for hasher, head, rows in self.leaves.values():
            self.h.update(f"{head}{rows}{hasher.hexdigest()}".encode())
        y = self.ys.all().contiguous()
        self.h.update(f"{y.dtype}{tuple(y.shape)}".encode())
        self.h.update(_buffer(y))
        return self.h.hexdigest()


def _buffer(t: Tensor) -> Any:
    """The bytes of a contiguous CPU tensor, without a copy (a flat uint8 view)."""
    return t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""


class _Labels:
    """The labels of a pass in order, kept until its end in ONE buffer of `n` rows when `n` is
    known (a doubling one otherwise), not a list of small per-batch tensors.

    Why: each batch of a pass is a large short-lived allocation (megabytes) that glibc serves
    from the heap once its dynamic mmap threshold has risen past the batch size; a small
    long-lived tensor allocated after each one (the batch's labels) pins the heap above the
    freed batch, so the heap cannot shrink and the process grew by gigabytes over a pass on a
    DataLoader (benchmarks/streaming_memory.py, `--loader-case`). A buffer allocated once (and
    hashing without `tobytes()` copies) leaves nothing behind between batches.
    """

    def __init__(self, n: int | None) -> None:
        self.n, self.buf, self.rows = n, None, 0

    def append(self, y: Tensor) -> None:
        if self.buf is None or self.buf.dtype != y.dtype or self.buf.shape[1:] != y.shape[1:]:
            if self.buf is not None:  # another dtype or shape: let torch.cat say what it says
                self.buf = torch.cat([self.buf[: self.rows], y])
                self.rows = len(self.buf)
                return
            size = self.n if self.n is not None and self.n >= len(y) else max(1024, 2 * len(y))
            self.buf = y.new_empty((size, *y.shape[1:]))
        if self.rows + len(y) > len(self.buf):
            grown = y.new_empty((max(2 * len(self.buf), self.rows + len(y)), *y.shape[1:]))
            grown[: self.rows] = self.buf[: self.rows]
            self.buf = grown
        self.buf[self.rows : self.rows + len(y)] = y
        self.rows += len(y)

    def all(self) -> Tensor:
        if self.buf is None:
            return torch.empty(0, dtype=torch.long)
        return self.buf[: self.rows]


__all__ = ["DataHasher", "data_fingerprint"]
