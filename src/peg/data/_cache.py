"""Helpers shared by the file-format loaders: a disk cache of decoded arrays, file look-up.

Decoding 50,000 JPEGs or parsing a text table takes seconds; the result is kept as an
uncompressed `.npz` (NumPy arrays only, read back with `allow_pickle=False`) under
`cache_dir()/decoded/`. An entry's name holds the source file's name, a hash of its resolved
path, its size and its modification time, so replacing or touching the source makes a fresh
entry (the stale one of the same source is removed). Writes are atomic (`peg.utils.io.atomic_open`:
temporary file, then `os.replace`); a cache folder that cannot be written only costs the
decode next time.
"""

from __future__ import annotations

import hashlib
import os
import warnings
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from peg.data.roots import PathLike, _only_explicit, data_roots
from peg.utils.io import atomic_open

#: Bump when the layout of a cached entry changes: old entries are then ignored.
CACHE_VERSION = 1


def cache_dir() -> Path:
    """`$PEG_CACHE` if set, else `~/.cache/peg` (decoded arrays go to its `decoded/` folder)."""
    env = os.environ.get("PEG_CACHE", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "peg"


def _entry_prefix(source: Path, tag: str) -> str:
    digest = hashlib.sha1(str(source.resolve()).encode()).hexdigest()[:10]
    return f"{source.name}-{tag}-v{CACHE_VERSION}-{digest}-"


def cache_path(source: Path, tag: str) -> Path:
    """Where the decoded arrays of `source` (one variant, `tag`) are cached."""
    st = source.stat()
    return (
        cache_dir() / "decoded" / f"{_entry_prefix(source, tag)}{st.st_size}-{st.st_mtime_ns}.npz"
    )


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """`np.savez` to `path`, atomically (`peg.utils.io.atomic_open`)."""
    with atomic_open(path) as f:
        np.savez(f, **arrays)


def load_npz(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of a cached entry, or None when it is missing or unreadable."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return None


def cached(
    source: Path,
    tag: str,
    build: Callable[[], dict[str, np.ndarray]],
    check: Callable[[dict[str, np.ndarray]], bool] = lambda arrays: True,
) -> dict[str, np.ndarray]:
    """The arrays `build()` decodes from `source`, from the disk cache when it holds them.

    Args:
        source: the file decoded (its path, size and mtime key the entry).
        tag: names the variant decoded from `source` (e.g. the UCI set inside one archive).
        build: decodes `source`; called on a cache miss.
        check: validates a cached entry; a failing one is rebuilt.
    """
    path = cache_path(source, tag)
    arrays = load_npz(path)
    if arrays is not None and check(arrays):
        return arrays
    arrays = build()
    try:
        save_npz(path, arrays)
        for stale in path.parent.glob(f"{_entry_prefix(source, tag)}*.npz"):
            if stale != path:
                stale.unlink(missing_ok=True)
    except OSError as e:  # a read-only home must not stop the loading
        warnings.warn(f"could not cache decoded {source.name} at {path}: {e}", stacklevel=3)
    return arrays


def check_split(split: str) -> str:
    """`split` if it is "train" or "test" (the splits the file-format loaders read)."""
    if split not in ("train", "test"):
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    return split


def find_first(
    candidates: Sequence[str], root: PathLike | Sequence[PathLike] | None
) -> tuple[Path, str] | None:
    """The first existing `<data root>/<candidate>`, roots in search order, then candidates.

    Root-major, so a root the caller names wins over a default root holding another format.

    Returns:
        `(path, candidate)`, or None when no root holds any candidate.
    """
    for r in data_roots(root):
        for candidate in candidates:
            path = r / candidate
            if path.exists():
                return path, candidate
    return None


def not_found(
    name: str, split: str, root: PathLike | Sequence[PathLike] | None, hint: str
) -> FileNotFoundError:
    """A FileNotFoundError naming the data set first, then the roots searched and `hint`."""
    roots = data_roots(root)
    searched = "\n  ".join(str(r) for r in roots) or "(none: PEG_DATA_ONLY is set, no root given)"
    message = (
        f"data set {name!r} ({split} split) not found under any data root; searched:\n"
        f"  {searched}\n{hint}"
    )
    if _only_explicit():
        message += "\n(PEG_DATA_ONLY is set: only the explicit root and $PEG_DATA were searched)"
    return FileNotFoundError(message)
