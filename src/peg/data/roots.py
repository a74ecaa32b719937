"""Where data sets are looked for. Nothing is ever downloaded.

Search order (duplicates dropped, first occurrence kept):

1. the `explicit` root(s) passed by the caller;
2. `$PEG_DATA` (several roots may be joined with `os.pathsep`, e.g. `/a:/b`);
3. `~/.cache/peg`;
4. `/usr/share/datasets` (where Debian's `dataset-*` packages install);
5. `../shared/data` relative to the current working directory;
6. `../shared/data` relative to the repository holding this source tree.

Setting the environment variable `PEG_DATA_ONLY=1` (or true/yes) restricts the search to 1
and 2: a reproducible run then reads only what it was pointed at, and tests can simulate a
machine without data even where the system roots hold it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

#: System-wide roots (searched unless PEG_DATA_ONLY is set).
SYSTEM_ROOTS: tuple[Path, ...] = (Path("/usr/share/datasets"),)

PathLike = str | os.PathLike[str]


def _only_explicit() -> bool:
    return os.environ.get("PEG_DATA_ONLY", "").strip().lower() in ("1", "true", "yes", "on")


def _as_list(explicit: PathLike | Sequence[PathLike] | None) -> list[Path]:
    if explicit is None:
        return []
    if isinstance(explicit, (str, os.PathLike)):
        return [Path(explicit)]
    if isinstance(explicit, Sequence):
        out = []
        for r in explicit:
            if not isinstance(r, (str, os.PathLike)):
                raise ValueError(f"root: expected a path or a list of paths, got an item {r!r}")
            out.append(Path(r))
        return out
    raise ValueError(f"root: expected a path or a list of paths, got {type(explicit).__name__}")


def data_roots(explicit: PathLike | Sequence[PathLike] | None = None) -> list[Path]:
    """The data roots, in search order (see the module docstring), absolute and deduplicated.

    Args:
        explicit: a root, or several, searched first. Roots need not exist.

    Returns:
        Absolute paths; they may not exist.
    """
    roots = _as_list(explicit)
    env = os.environ.get("PEG_DATA", "")
    roots += [Path(p) for p in env.split(os.pathsep) if p.strip()]
    if not _only_explicit():
        with contextlib.suppress(RuntimeError):  # no home directory can be determined
            roots.append(Path.home() / ".cache" / "peg")
        roots += SYSTEM_ROOTS
        roots.append(Path.cwd() / ".." / "shared" / "data")
        # src/peg/data/roots.py: parents[0] data, [1] peg, [2] src, [3] the repository root
        roots.append(Path(__file__).resolve().parents[3] / ".." / "shared" / "data")
    unique: list[Path] = []
    for r in roots:
        r = r.expanduser().resolve()
        if r not in unique:
            unique.append(r)
    return unique


def find(
    relative: str | os.PathLike[str],
    root: PathLike | Sequence[PathLike] | None = None,
    hint: str = "",
) -> Path:
    """The first `<data root>/relative` that exists.

    Args:
        relative: a path relative to a data root, e.g. "fashion-mnist/t10k-labels-idx1-ubyte.gz".
        root: root(s) searched before the default ones (see `data_roots`).
        hint: appended to the error message, e.g. what to install.

    Returns:
        The absolute path found.

    Raises:
        FileNotFoundError: listing `relative`, every root searched, and `hint`.
    """
    if Path(relative).is_absolute():
        raise ValueError(f"relative: expected a path relative to a data root, got {relative!r}")
    roots = data_roots(root)
    for r in roots:
        candidate = r / relative
        if candidate.exists():
            return candidate
    searched = (
        "\n  ".join(str(r) for r in roots) or "(none: PEG_DATA_ONLY is set and no root given)"
    )
    message = f"{relative} not found under any data root; searched:\n  {searched}"
    if _only_explicit():
        message += "\n(PEG_DATA_ONLY is set: only the explicit root and $PEG_DATA were searched)"
    if hint:
        message += f"\n{hint}"
    raise FileNotFoundError(message)
