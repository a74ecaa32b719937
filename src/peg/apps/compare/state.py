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

- `.peg-compare`: the mark of a folder `peg.compare` made: a non-empty folder without it (nor
  an earlier version's `.compare/`) is the user's, and refused unless `overwrite=True`.

Failed methods are not saved: a rerun tries them again. What is read back is checked first: a
saved row that does not validate, or a predictor archive that is not the one its row recorded
(SHA-256 of the file), is fitted again, and said. A save that fails (a full disk, a folder made
read-only) is a warning on the method's row; the run goes on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from peg._io import atomic_write_text, load_tree, save_tree
from peg._schema import Fields, in_range
from peg.errors import ArchiveError

FOLDER = ".compare"
ARCHIVES = "predictors"
MARKER = ".peg-compare"
Say = Callable[[str], None]


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
            try:  # a DataLoader over an IterableDataset has __len__, and raises
                size = len(x) if hasattr(x, "__len__") else None
            except TypeError:
                size = None
            h.update(f"{type(x).__qualname__}:{size}".encode())

    add(data)
    return h.hexdigest()[:16]


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


class State:
    """The saved methods of one comparison in `folder` (None: nothing saved); `resume` says
    whether saved methods are read back; `write=False` reads only (under torchrun every rank
    reads, rank 0 writes); `say` tells what was not taken back, and why."""

    def __init__(
        self,
        folder: str | Path | None,
        run_key: Mapping[str, Any],
        resume: bool,
        write: bool = True,
        say: Say = lambda _: None,
    ) -> None:
        self.folder = None if folder is None else Path(folder)
        self.run_key, self.resume, self.write, self.say = dict(run_key), resume, write, say
        self.hashes: dict[str, str | None] = {}  # method → SHA-256 of the archive its row saved

    def prepare(self, overwrite: bool) -> None:
        """Before any fitting: refuse a non-empty folder peg did not make (unless `overwrite`),
        check that every folder a run writes to can be written, and mark the folder as peg's."""
        if self.folder is None or not self.write:
            return
        folder = self.folder
        if folder.exists() and not folder.is_dir():
            raise NotADirectoryError(f"out: {folder} is a file, not a folder")
        found = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        ours = MARKER in found or FOLDER in found  # `.compare/`: a run of an earlier version
        if found and not ours and not overwrite:
            raise FileExistsError(
                f"out: {folder} is a non-empty folder peg compare did not make (it holds "
                f"{found[:3]}{' ...' if len(found) > 3 else ''}); results.json, results.md, "
                "the figures and predictors/ would replace files of the same names: give a new "
                "or empty folder, or overwrite=True (--overwrite) to write into it"
            )
        for where in (folder, folder / FOLDER, folder / ARCHIVES):
            try:
                where.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryFile(dir=where):
                    pass
            except OSError as e:
                raise type(e)(
                    f"out: cannot write in {where} ({e.strerror or e}); give a folder you can "
                    "write to"
                ) from None
        if MARKER not in found:
            atomic_write_text(folder / MARKER, "made by peg compare: a rerun may replace what "
                              "is in this folder\n")  # fmt: skip

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
        matches; None otherwise (and for a damaged file or a row that does not validate, said:
        the method is fitted again)."""
        if self.folder is None or not self.resume:
            return None
        path = self._path(i, spec.name)
        if not path.is_file():
            return None
        try:
            saved = load_tree(path)
            if not isinstance(saved, dict) or saved.get("key") != self.key(spec):
                return None  # another run's (or no key at all): not this method's row
            check_saved(saved, spec.name, set(self.run_key.get("sets", {})), str(path))
        except (ValueError, ArchiveError) as e:  # ArchiveError is a ValueError
            self.say(f"compare: {spec.name}: its saved row is not usable ({e}); fitting it again")
            return None
        self.hashes[spec.name] = saved.get("archive")
        return saved

    def reusable(self, name: str) -> bool:
        """Whether `predictors/<name>.peg` is the archive the resumed row of `name` recorded
        (its SHA-256): another file there (replaced, damaged) is not loaded but refitted."""
        path = self.archive(name)
        if path is None or not path.is_file():
            return False
        if self.hashes.get(name) == file_hash(path):
            return True
        self.say(
            f"compare: {name}: {path} is not the archive this run saved (its SHA-256 differs "
            "from the one recorded with the row); fitting it again"
        )
        return False

    def save(self, i: int, spec: Any, row: dict[str, Any], curves: Any, sizes: Any,
             predictor: Any) -> str | None:  # fmt: skip
        """Save method `i`: its predictor's archive first (where it has `save`), then its row;
        a failed write is returned as a warning (the row stands, a resumed run refits it)."""
        if self.folder is None or not self.write:
            return None
        row_path, path = self._path(i, spec.name), self.archive(spec.name)
        assert path is not None
        try:
            row_path.unlink(missing_ok=True)  # never a saved row beside another run's archive
            path.unlink(missing_ok=True)
            digest = None
            if callable(getattr(predictor, "save", None)):
                path.parent.mkdir(parents=True, exist_ok=True)
                # a predictor without stacked weights (MC dropout) has none: refitted on resume
                with contextlib.suppress(TypeError, ValueError, NotImplementedError):
                    predictor.save(str(path))
                    digest = file_hash(path)
            tree = {"key": self.key(spec), "row": row, "curves": curves, "sizes": sizes,
                    "archive": digest}  # fmt: skip
            save_tree(row_path, tree)
        except OSError as e:
            return f"not saved ({type(e).__name__}: {e}); a resumed run fits it again"
        return None


def file_hash(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_saved(saved: dict[str, Any], name: str, sets: set[str], where: str) -> None:
    """A saved row, its reliability data and set sizes checked before any is used (a file
    damaged or edited by hand: an ArchiveError naming the field)."""
    tree = Fields(saved, where, what="saved row")
    row = tree.object("row")
    assert row is not None
    row.get("method", lambda v: v == name, f"the method's name {name!r}")
    row.number("fit_seconds", minimum=0)
    for key in ("nll", "error", "ece"):
        row.get(key, _metric, "a number")
    row.get("forwards", lambda v: v is None or _metric(v), "a number or null", optional=True)
    for key, value in row.obj.items():
        if not (value is None or isinstance(value, str) or _metric(value)):
            raise row.error(key, "a number, a string or null", value)
    curves = tree.object("curves")
    assert curves is not None
    for set_name in curves.obj:
        known = set_name in sets
        curves.get(set_name, lambda v, known=known: known and _tensors(v),
                   f"reliability data of one of the sets {sorted(sets)}")  # fmt: skip
    sizes = tree.object("sizes")
    assert sizes is not None
    for set_name in sizes.obj:
        sizes.get(set_name, lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and
                  in_range(v[0], 0, None, int) and isinstance(v[1], str),
                  "[points, kind]")  # fmt: skip
    tree.get("archive", lambda v: v is None or isinstance(v, str), "a SHA-256 or null",
             optional=True)  # fmt: skip


def _metric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _tensors(v: Any) -> bool:
    return isinstance(v, Mapping) and all(isinstance(t, Tensor) for t in v.values())
