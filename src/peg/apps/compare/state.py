"""A comparison's work on disk, method by method, so that a run killed at any point loses at most
the method it was fitting, and a rerun with the same arguments (`resume=True`) picks up there.

Under the output folder:

- `.compare/NNN-<name>.safetensors` (`peg._io.save_tree`, atomic): a finished method's table
  row, reliability data and set sizes, with the key of what produced it (the method, its
  options and base, the seed, batch size, bins and OOD score, and fingerprints of the model and
  of every data set): a saved method whose key differs is fitted again;
- `predictors/<name>.peg`: the fitted predictor's own archive (`save`), written before the row,
  where the predictor can be saved; a resumed run loads it (`peg.load`) instead of fitting the
  method again when the predictor is needed (in `Comparison.predictors`, or as the base of a
  method still to fit), and refits it (same seed, same predictor) where it cannot be loaded.

Failed methods are not saved: a rerun tries them again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from peg._io import load_tree, save_tree

FOLDER = ".compare"
ARCHIVES = "predictors"


def fingerprint(data: Any) -> str:
    """A cheap fingerprint of data or a model: shapes and sums of tensors, lengths and types of
    datasets (what changes when the data or the weights change, without reading a dataset)."""
    h = hashlib.sha256()

    def add(x: Any) -> None:
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(np.ascontiguousarray(x))
        if isinstance(x, Tensor):
            t = x.detach().cpu()
            h.update(f"{tuple(t.shape)}{t.dtype}".encode())
            if t.numel():
                h.update(repr(float(t.double().sum())).encode())
                h.update(repr(float(t.double().abs().sum())).encode())
        elif isinstance(x, nn.Module):
            for k, v in x.state_dict().items():
                h.update(k.encode())
                add(v)
        elif isinstance(x, Mapping):
            for k, v in x.items():
                h.update(str(k).encode())
                add(v)
        elif isinstance(x, (tuple, list)):
            for v in x:
                add(v)
        else:
            size = len(x) if hasattr(x, "__len__") else None
            h.update(f"{type(x).__qualname__}:{size}".encode())

    add(data)
    return h.hexdigest()[:16]


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


class State:
    """The saved methods of one comparison in `folder` (None: nothing saved); `resume` says
    whether saved methods are read back; `write=False` reads only (under torchrun every rank
    reads, rank 0 writes)."""

    def __init__(
        self,
        folder: str | Path | None,
        run_key: Mapping[str, Any],
        resume: bool,
        write: bool = True,
    ) -> None:
        self.folder = None if folder is None else Path(folder)
        self.run_key, self.resume, self.write = dict(run_key), resume, write

    def key(self, spec: Any) -> str:
        made = {"name": spec.name, "method": spec.method, "on": spec.base,
                "options": repr(sorted(spec.options.items())), **self.run_key}  # fmt: skip
        return json.dumps(made, sort_keys=True, default=str)

    def _path(self, i: int, name: str) -> Path:
        assert self.folder is not None
        return self.folder / FOLDER / f"{i:03d}-{_file_name(name)}.safetensors"

    def archive(self, name: str) -> Path | None:
        return None if self.folder is None else self.folder / ARCHIVES / f"{_file_name(name)}.peg"

    def load(self, i: int, spec: Any) -> dict[str, Any] | None:
        """The saved `{"row", "curves", "sizes"}` of method `i` when resuming and its key
        matches; None otherwise (and for a damaged file: the method is fitted again)."""
        if self.folder is None or not self.resume:
            return None
        path = self._path(i, spec.name)
        if not path.is_file():
            return None
        try:
            saved = load_tree(path)
        except ValueError:
            return None
        return saved if saved.get("key") == self.key(spec) else None

    def save(self, i: int, spec: Any, row: dict[str, Any], curves: Any, sizes: Any,
             predictor: Any) -> None:  # fmt: skip
        """Save method `i`: its predictor's archive first (where it has `save`), then its row."""
        if self.folder is None or not self.write:
            return
        row_path, path = self._path(i, spec.name), self.archive(spec.name)
        assert path is not None
        row_path.unlink(missing_ok=True)  # never a saved row beside another run's archive
        path.unlink(missing_ok=True)
        if callable(getattr(predictor, "save", None)):
            path.parent.mkdir(parents=True, exist_ok=True)
            # a predictor without stacked weights (MC dropout) has none: refitted on resume
            with contextlib.suppress(TypeError, ValueError, NotImplementedError):
                predictor.save(str(path))
        tree = {"key": self.key(spec), "row": row, "curves": curves, "sizes": sizes}
        save_tree(row_path, tree)
