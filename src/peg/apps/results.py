"""The results writer of the applications: JSON and markdown, each written atomically
(`peg.utils.io.atomic_write_text`: a crash mid-write leaves the previous file intact); and `claim`,
which keeps them from overwriting a folder of the user's.

A folder an application made holds its mark, `.peg-<application>` (`.peg-compare`,
`.peg-select`, `.peg-demo`, `.peg-bench`, `.peg-paper-tables`, `.peg-diversity`): a file whose
text begins "made by peg <application>". Only that proves peg wrote the folder (or an earlier
version's own results in it, `earlier_results`, which an application names); a file or folder
of another name (an empty `.compare/` included) does not, and a non-empty folder without the
mark is the user's: refused unless overwritten.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from peg.utils.io import atomic_write_text


def json_ready(obj: Any) -> Any:
    """Plain JSON data: tensors and arrays as lists, non-finite floats as None (null)."""
    if isinstance(obj, Tensor):
        obj = obj.detach().cpu().tolist()
    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    if isinstance(obj, Mapping):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def to_json(
    obj: Any,
    *,
    indent: int = 2,
    default: Callable[[Any], Any] | None = None,
    strict: bool = False,
) -> str:
    """`obj` as indented JSON text ending in a newline.

    `default` converts what JSON cannot hold (e.g. `str`); `strict=True` passes `obj` through
    `json_ready` first and refuses NaN and infinities (written as null instead).
    """
    if strict:
        return json.dumps(json_ready(obj), indent=indent, allow_nan=False) + "\n"
    return json.dumps(obj, indent=indent, default=default) + "\n"


def write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically (parent folders created); returns the path."""
    atomic_write_text(path, text)
    return Path(path)


def write_json(path: str | Path, obj: Any, **options: Any) -> Path:
    """Write `obj` as JSON (`to_json(obj, **options)`) to `path` atomically; returns the path."""
    return write_text(path, to_json(obj, **options))


def write_results(
    folder: str | Path, results: Any, markdown: str, stem: str = "results", **options: Any
) -> tuple[Path, Path]:
    """`folder/<stem>.json` (`to_json(results, **options)`) and `folder/<stem>.md`."""
    folder = Path(folder)
    return (
        write_json(folder / f"{stem}.json", results, **options),
        write_text(folder / f"{stem}.md", markdown),
    )


RESULTS = ("results.json", "results.md")
MARK_BYTES = 200  # how much of a mark is read: its first line says who made the folder


def mark(application: str) -> str:
    """The name of the mark of a folder `application` made (`.peg-compare`, ...)."""
    return f".peg-{application}"


def is_marked(folder: str | Path, application: str) -> bool:
    """Whether `folder` holds the mark of `application`: a file whose text begins
    "made by peg <application>" (a folder or other file of that name does not count)."""
    path = Path(folder) / mark(application)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(MARK_BYTES).startswith(f"made by peg {application}".encode())


def earlier_results(path: Path, keys: Iterable[str]) -> bool:
    """Whether `path` is a results JSON an earlier version of a peg application wrote before
    the marks: a JSON object holding every one of `keys` (a sign for `claim`'s `ours`; a file
    of another content, or unreadable, is not)."""
    try:
        if not path.is_file() or path.stat().st_size > 10**8:
            return False
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and all(k in found for k in keys)


def peg_folder(path: Path) -> bool:
    """Whether `path` is a folder some peg application made (it holds a `.peg-<app>` mark)."""
    return path.is_dir() and any(
        is_marked(path, m.name.removeprefix(".peg-")) for m in sorted(path.glob(".peg-*"))[:10]
    )


def writable(folder: Path, argument: str) -> None:
    """Make `folder` (and its parents) and check that a file can be written in it, before any
    work: an OSError of the same type naming `argument` otherwise."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise type(e)(
            f"{argument}: cannot write in {folder} ({e.strerror or e}); give a folder you can "
            "write to"
        ) from None


def claim(
    folder: str | Path,
    application: str,
    overwrite: bool,
    *,
    argument: str = "out",
    override: str = "overwrite=True (--overwrite)",
    writes: str = "results.json and results.md",
    files: Iterable[str] = RESULTS,
    ours: Callable[[Path], bool] = lambda _: False,
) -> Path:
    """Make `folder` the output folder of `application`, before any work: refused (a
    FileExistsError naming `argument`) where it is a non-empty folder without the
    application's mark (`is_marked`; or `ours(folder)`: an earlier version's sign) unless
    `overwrite`; a NotADirectoryError where it is a file, an IsADirectoryError where one of
    `files` in it is a folder, an OSError where it cannot be written. Then marked; returns it.
    """
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite: expected True or False, got {overwrite!r}")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{argument}: {folder} is a file, not a folder")
    found = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    marked = is_marked(folder, application) or (bool(found) and ours(folder))
    if found and not marked and not overwrite:
        raise FileExistsError(
            f"{argument}: {folder} is a non-empty folder peg {application} did not make (it "
            f"holds {found[:3]}{' ...' if len(found) > 3 else ''}); {writes} would replace "
            f"files of the same names: give a new or empty folder, or {override} to write "
            "into it"
        )
    for name in (*files, mark(application)):
        if (folder / name).exists() and not (folder / name).is_file():
            raise IsADirectoryError(
                f"{argument}: {folder / name} is a folder, where peg {application} writes its "
                f"{name}: move it away or give another folder"
            )
    writable(folder, argument)
    if not is_marked(folder, application):
        write_text(
            folder / mark(application),
            f"made by peg {application}: a rerun may replace what is in this folder\n",
        )
    return folder
