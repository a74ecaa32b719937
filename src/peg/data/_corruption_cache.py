"""The disk cache of `peg.data.corruptions`: where it lives, how images are keyed, and `.npy`
files read back with `allow_pickle=False` and written atomically (`peg.utils.io.atomic_open`)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from peg.data._cache import cache_dir as peg_cache_dir
from peg.utils.io import atomic_open

_KEY_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Folder of the corruption cache: `cache_dir`, else `$PEG_CACHE/corruptions`, else
    `~/.cache/peg/corruptions`."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return peg_cache_dir() / "corruptions"


def images_digest(x: np.ndarray) -> str:
    """SHA-256 (first 24 hex digits) of the shape and float32 bytes of checked images x."""
    digest = hashlib.sha256(repr(x.shape).encode())
    digest.update(np.ascontiguousarray(x).view(np.uint8).ravel())
    return digest.hexdigest()[:24]


def check_key(key: Any) -> str:
    if not isinstance(key, str) or not _KEY_PATTERN.fullmatch(key):
        raise ValueError(
            f"key: expected 1-128 characters from [A-Za-z0-9._-] (a file-name part), got {key!r}"
        )
    return key


def read_cache(path: Path, shape: tuple[int, ...]) -> np.ndarray | None:
    """The cached array at `path` if it is readable and has `shape` (float32), else None."""
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):  # missing or truncated: recompute
        return None
    if array.shape != shape or array.dtype != np.float32:
        return None
    return array


def write_cache(path: Path, array: np.ndarray) -> None:
    """np.save to `path` atomically (`peg.utils.io.atomic_open`): readers never see half a file."""
    with atomic_open(path) as f:
        np.save(f, array, allow_pickle=False)
