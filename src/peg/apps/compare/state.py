"""A comparison's work on disk, method by method, so that a run killed at any point loses at most
the method it was fitting, and a rerun with the same arguments (`resume=True`) picks up there.

Under the output folder:

- `.compare/NNN-<name>.safetensors` (`peg.utils.io.save_tree`, atomic): a finished method's table
  row, reliability data and set sizes, with the key of what produced it (the method, its
  options and base, the seed, batch size, bins and OOD score, and `fingerprint`s, SHA-256 of
  the bytes, of the weights and of every data set): a saved method whose key differs is fitted
  again, and said;
- `predictors/<name>.peg`: the fitted predictor's own archive (`save`), written before the row,
  where the predictor can be saved; a resumed run loads it (`peg.load`) instead of fitting the
  method again when the predictor is needed (in `Comparison.predictors`, or as the base of a
  method still to fit), and refits it (same seed, same predictor) where it cannot be loaded.

- `.peg-compare`: the mark of a folder `peg.compare` made (`peg.apps.results.claim`: a file
  whose text says so): a non-empty folder without it is the user's, and refused unless
  `overwrite=True`. An earlier version's folder, without the mark, counts as peg's only where
  its `.compare/` holds a saved row that loads with its key (an empty `.compare/` proves
  nothing).

Failed methods are not saved: a rerun tries them again. What is read back is checked first: a
saved row that does not validate, or a predictor archive that is not the one its row recorded
(SHA-256 of the file), is fitted again, and said. A save that fails (a full disk, a folder made
read-only) is a warning on the method's row; the run goes on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from peg.apps.compare.saved import check_saved
from peg.apps.results import RESULTS, claim, writable
from peg.errors import ArchiveError
from peg.source import as_loader, is_dataset, is_loader
from peg.utils.io import load_tree, save_tree

FOLDER = ".compare"
ARCHIVES = "predictors"
CHUNK = 1 << 24  # bytes of a weight tensor hashed at a time (a device tensor: copied so)
Say = Callable[[str], None]


class _Print:
    """`compare`'s default `say`: print each line, unless `progress=False` asks for quiet."""

    def __call__(self, line: str) -> None:
        print(line)

    def __repr__(self) -> str:  # the signature, as help() and the reference page show it
        return "print"


PRINT = _Print()


def told(say: Say | None, progress: bool | None, rank: int) -> Say:
    """Where `compare`'s lines go: `say`, but nowhere for None, on a rank other than 0 (one
    process speaks), or for the default `say` with `progress=False` (quiet is no output)."""
    quiet = say is None or rank != 0 or (say is PRINT and progress is False)
    return (lambda _: None) if quiet or say is None else say


def fingerprint(data: Any, batch_size: int = 512) -> str:
    """A fingerprint of data or a model: SHA-256 of every byte, streamed.

    A model: the names, shapes, dtypes and bytes of its state dict. Tensors and arrays (a pair
    `(X, y)`): shape, dtype and bytes, `CHUNK` bytes of rows at a time (a device tensor copied
    to the host chunk by chunk). A Dataset (batched by `batch_size`, as a run reads it) or a
    DataLoader: iterated once, batch by batch, never gathered; a batch's tensors by bytes,
    anything else by its repr. Rolled labels, swapped rows or permuted weights change it (sums
    did not). It costs one read of the data (SHA-256: about 0.5 GB/s on one core), less than
    one forward pass of a model over it; a loader that shuffles or augments gives another
    fingerprint each run, so its rows are fitted again rather than reused.
    """
    h = hashlib.sha256()
    if isinstance(data, nn.Module):
        data = data.state_dict()
    elif is_dataset(data):
        data = as_loader(data, batch_size)
    if is_loader(data):
        h.update(b"loader")
        for batch in data:
            _add(h, batch)
    else:
        _add(h, data)
    return h.hexdigest()[:32]


def _add(h: Any, x: Any) -> None:
    """Hash `x` into `h`: a tensor's shape, dtype and bytes; containers element by element."""
    if isinstance(x, np.ndarray):  # negative strides (a reversed view) are copied
        numeric = x.dtype.kind in "biufc"
        x = (
            x.tolist()
            if not numeric
            else torch.from_numpy(x if min(x.strides, default=0) >= 0 else x.copy())
        )
    if isinstance(x, Tensor):
        t = x.detach()
        t = t.to_dense() if t.layout != torch.strided else t
        h.update(f"{tuple(t.shape)}{t.dtype}".encode())
        if t.device.type == "meta":  # shapes without values: nothing more to read
            return
        t = t.reshape(1, -1) if t.ndim < 2 else t
        rows = max(1, CHUNK // max(1, t[0].numel() * t.element_size()))
        for start in range(0, t.shape[0], rows):
            part = t[start : start + rows].cpu().contiguous().reshape(-1)
            h.update(part.view(torch.uint8).numpy().data)
    elif isinstance(x, Mapping):
        h.update(f"{type(x).__name__}{len(x)}".encode())
        for k, v in x.items():
            h.update(repr(k).encode())
            _add(h, v)
    elif isinstance(x, (tuple, list)):
        h.update(f"{type(x).__name__}{len(x)}".encode())
        for v in x:
            _add(h, v)
    else:
        h.update(f"{type(x).__qualname__}:{x!r}".encode())


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

    def prepare(self, overwrite: bool, files: tuple[str, ...] = RESULTS) -> None:
        """Before any fitting: refuse a non-empty folder peg did not make (unless `overwrite`;
        `results.claim`) or where one of `files` is a folder, check that every folder a run
        writes to can be written, and mark the folder as peg's."""
        if self.folder is None or not self.write:
            return
        claim(
            self.folder,
            "compare",
            overwrite,
            files=files,
            ours=_earlier_run,
            writes="results.json, results.md, the figures and predictors/",
        )
        for where in (self.folder / FOLDER, self.folder / ARCHIVES):
            writable(where, "out")

    def key(self, spec: Any) -> str:
        made = {
            "name": spec.name,
            "method": spec.method,
            "on": spec.base,
            "options": repr(sorted(spec.options.items())),
            **self.run_key,
        }
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
                self.say(
                    f"compare: {spec.name}: its saved row was made by a run with other "
                    f"{_differing(saved, self.key(spec))}; fitting it again"
                )
                return None  # another run's (or no key at all): not this method's row
            check_saved(
                saved,
                spec.name,
                set(self.run_key.get("sets", {})),
                str(path),
                self.run_key.get("bins"),
            )
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

    def save(
        self, i: int, spec: Any, row: dict[str, Any], curves: Any, sizes: Any, predictor: Any
    ) -> str | None:
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
            tree = {
                "key": self.key(spec),
                "row": row,
                "curves": curves,
                "sizes": sizes,
                "archive": digest,
            }
            save_tree(row_path, tree)
        except OSError as e:
            return f"not saved ({type(e).__name__}: {e}); a resumed run fits it again"
        return None


def _differing(saved: Any, key: str) -> str:
    """What differs between a saved row's key and this run's, in words ("val data, weights")."""
    try:
        was = json.loads(saved["key"])
        assert isinstance(was, dict)
    except Exception:  # no key, or not a key: nothing to compare
        return "arguments (its key is missing or not readable)"
    now = json.loads(key)
    sets, before = now.get("sets", {}), was.get("sets")
    sets = [n for n in sets if not isinstance(before, dict) or before.get(n) != sets[n]]
    words = {"model": "weights", "val": "val data", "sets": f"{', '.join(sets)} data"}
    differ = [words.get(k, k) for k in now if was.get(k) != now[k]]
    return ", ".join(differ) or "arguments"


def file_hash(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks (`hashlib.file_digest` is 3.11+)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _earlier_run(folder: Path) -> bool:
    """Whether `folder`, without the mark, is an earlier version's run: its `.compare/` holds a
    saved row that loads with its key (an empty `.compare/`, or one of foreign files, is not)."""
    rows = folder / FOLDER
    if not rows.is_dir():
        return False
    for path in sorted(rows.glob("[0-9][0-9][0-9]-*.safetensors"))[:3]:
        try:
            saved = load_tree(path)
        except ValueError:
            continue
        if isinstance(saved, dict) and isinstance(saved.get("key"), str):
            return True
    return False
