"""Every file peg writes goes through here: atomic writes, and nested states as safetensors + JSON.

`atomic_target` is the one primitive (a temporary file beside the target, fsynced, given the
usual mode and renamed over it); `atomic_open` (a binary file object), `atomic_write_text` and
`atomic_save_file` (safetensors) are built on it.

A training checkpoint holds nested Python structures (optimizer state with integer keys, tuples
of betas, generator states). `save_tree` stores every tensor in a safetensors file and the
structure around them as JSON in the file's header, so loading never executes anything.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

TREE_KEY = "peg-tree"
STALE_SECONDS = 3600  # a temporary file without a pid this old is a killed writer's


def _usual_mode(path: str) -> None:
    """mkstemp creates files readable by the owner only; give them the usual 0666 & ~umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def target_path(path: Any) -> Path:
    """`path` as the `Path` of a file to write: a ValueError naming `path` for an empty one
    (`""` is the current folder) or an existing folder (the rename would fail with a raw
    IsADirectoryError after the whole file was written), a TypeError for a non-path."""
    if not isinstance(path, (str, os.PathLike)):
        kind = type(path).__name__
        raise TypeError(f"path: expected a file path (str or os.PathLike), got {kind}")
    text = os.fspath(path)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"path: expected a file path, got {text!r}")
    if Path(text).is_dir():
        raise ValueError(
            f"path: {text} is a folder; pass the path of a file in it, e.g. "
            f"{Path(text) / 'model.peg'}"
        )
    return Path(text)


@contextmanager
def atomic_target(path: str | os.PathLike[str]) -> Iterator[str]:
    """A temporary file beside `path` to write; afterwards fsynced and renamed over `path`.

    Missing parent folders are created. A crash or an exception mid-write leaves the previous
    file at `path` intact (and, for an exception, no temporary file; for a SIGKILL, one the
    next write of `path` removes: `remove_stale`). `path` is checked first (`target_path`).
    """
    path = target_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path)
    prefix = f".{path.name}.{os.getpid()}."
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        _usual_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_stale(path: Path) -> None:
    """Remove the temporary files of `path` that a writer killed mid-write left behind (peg's
    own naming, `.<name>.<pid>.<random>.tmp`, of a process no longer running; without a pid,
    as an earlier peg named them, older than `STALE_SECONDS`). A live writer's is left."""
    head = f".{path.name}."
    try:
        found = [e for e in os.scandir(path.parent) if e.name.startswith(head)]
    except OSError:
        return
    for entry in found:
        named = re.fullmatch(r"(?:(\d+)\.)?[a-z0-9_]{8}\.tmp", entry.name[len(head) :])
        if named is None or not entry.is_file(follow_symlinks=False):
            continue  # not a temporary file of `path` (e.g. of `path.bak`)
        pid = named.group(1)
        try:
            if pid is not None:
                stale = int(pid) != os.getpid() and not _running(int(pid))
            else:
                stale = time.time() - entry.stat().st_mtime > STALE_SECONDS
            if stale:
                os.unlink(entry.path)
        except OSError:  # gone meanwhile, or not ours to remove
            continue


def _running(pid: int) -> bool:
    """Whether process `pid` runs on this machine (where that cannot be asked: assumed so)."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)  # signal 0: asks, sends nothing
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


@contextmanager
def atomic_open(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file open for writing whose content replaces `path` atomically on success."""
    with atomic_target(path) as tmp, open(tmp, "wb") as f:
        yield f


def atomic_save_file(tensors: dict[str, Tensor], metadata: dict[str, str], path: Path) -> None:
    """`safetensors.save_file`, atomically (see `atomic_target`)."""
    with atomic_target(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)


def _encode(obj: Any, tensors: dict[str, Tensor]) -> Any:
    if isinstance(obj, Tensor):
        key = str(len(tensors))
        tensors[key] = obj.detach().cpu().contiguous().clone()  # no shared storage in safetensors
        return {"__tensor__": key}
    if isinstance(obj, dict):
        return {"__dict__": [[k, _encode(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(
        f"cannot store a {type(obj).__name__} in a checkpoint (tensors, dicts, "
        "lists, tuples and JSON scalars only)"
    )


def _decode(obj: Any, tensors: dict[str, Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__tuple__" in obj:
            return tuple(_decode(v, tensors) for v in obj["__tuple__"])
        return {k: _decode(v, tensors) for k, v in obj["__dict__"]}
    return obj


def save_tree(path: str | os.PathLike[str], tree: Any) -> None:
    """Store a nested structure of tensors and JSON scalars atomically at `path`."""
    tensors: dict[str, Tensor] = {}
    structure = _encode(tree, tensors)
    atomic_save_file(tensors, {TREE_KEY: json.dumps(structure)}, Path(path))


def load_tree(path: str | os.PathLike[str]) -> Any:
    """Read back what `save_tree` stored (ValueError if `path` is not such a file)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            structure = json.loads((f.metadata() or {})[TREE_KEY])
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    except Exception as e:  # damaged, truncated or foreign file (RecursionError included)
        raise ValueError(f"{path}: not a readable peg checkpoint ({e})") from e
    try:
        return _decode(structure, tensors)
    except (KeyError, TypeError, ValueError, RecursionError) as e:  # a tampered structure
        detail = f"damaged structure, {type(e).__name__}: {e}"
        raise ValueError(f"{path}: not a readable peg checkpoint ({detail})") from None


def tree_format(path: str | os.PathLike[str]) -> str | None:
    """The `"format"` entry of the top-level dict `save_tree` stored at `path`, read from the
    header alone; None for any other file (or a tree without one)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            structure = json.loads((f.metadata() or {})[TREE_KEY])
        found = dict(structure["__dict__"]).get("format")
    except Exception:  # not a tree: damaged, foreign, or another peg file
        return None
    return found if isinstance(found, str) else None


def numpy_reason(e: BaseException) -> str:
    """Why NumPy could not read an array file, for a message: its first line, except that the
    account of pickled data (which suggests `allow_pickle=True`: loading it would run code from
    the file) is replaced by peg's: such a file is refused, never loaded."""
    text = str(e)
    if "pickle" in text.lower():
        return "it holds pickled Python objects, which peg never loads; save plain arrays"
    return text.splitlines()[0] if text else type(e).__name__


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` atomically (see `atomic_target`), in UTF-8 whatever the locale's
    encoding (results and reports hold ±, →, α)."""
    with atomic_target(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
