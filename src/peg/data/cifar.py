"""CIFAR-10 and CIFAR-100 from the files people have: JPEG archives, binary or python releases.

Formats looked for, in this order inside each data root (roots in `peg.data.roots` order, so
a root you name wins over a default root holding another format):

| set | format | files under a data root |
|---|---|---|
| cifar10 | JPEG archive | `cifar10_jpeg_<split>.tar.gz` (`cifar10-jpeg/<split>/<class>/*.jpg`) |
| cifar10 | JPEG folder | `cifar10-jpeg/<split>/<class>/*.jpg` (or .png): the archive extracted |
| cifar10 | binary release | `cifar-10-batches-bin/data_batch_{1..5}.bin`, `test_batch.bin` |
| cifar10 | python release | `cifar-10-batches-py/data_batch_{1..5}`, `test_batch` |
| cifar100 | binary release | `cifar-100-binary/train.bin`, `test.bin` |
| cifar100 | python release | `cifar-100-python/train`, `test` |

JPEG archives are decoded once (members in sorted name order) and cached as uint8 arrays (see
`peg.data._cache`). Python-release pickles are read by `RestrictedUnpickler`, which builds NumPy
arrays and nothing else: a pickle naming any other callable is refused before it runs.
Labels of a JPEG tree come from the class folder's name in the standard class order.
"""

from __future__ import annotations

import codecs
import io
import pickle
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from peg.data._cache import cached, check_split, find_first, not_found
from peg.data.roots import PathLike

Pair = tuple[Tensor, Tensor]

#: CIFAR-10's classes in the standard label order (also the sorted folder names).
CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
_IMAGE_BYTES = 3 * 32 * 32
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_HINT10 = (
    "Put one of these under $PEG_DATA (or pass root=): cifar10_jpeg_{split}.tar.gz "
    "(cifar10-jpeg/{split}/<class>/*.jpg; the project's ../shared/data has them), "
    "cifar-10-batches-bin/ (cifar-10-binary.tar.gz extracted) or cifar-10-batches-py/ "
    "(cifar-10-python.tar.gz extracted). Nothing is downloaded."
)
_HINT100 = (
    "Put cifar-100-binary/ (cifar-100-binary.tar.gz extracted) or cifar-100-python/ "
    "(cifar-100-python.tar.gz extracted) under $PEG_DATA (or pass root=). Nothing is downloaded."
)


# ---------------------------------------------------------------------------- safe pickles
def _numpy_globals() -> dict[tuple[str, str], Any]:
    # The reconstructors NumPy itself pickles arrays with, under both the NumPy 1 and 2 module
    # names, taken from a live array so no deprecated `numpy.core` import is needed.
    reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]
    frombuffer = np.ndarray.__reduce_ex__(np.zeros(1), 5)[0]
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,  # protocol-2 pickles of bytes written by Python 3
    }
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{core}.numeric", "_frombuffer")] = frombuffer
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that rebuilds NumPy arrays, lists, dicts and scalars, and nothing else.

    `find_class` admits only NumPy's array reconstructors, `numpy.ndarray`, `numpy.dtype` and
    `_codecs.encode`; any other global (`os.system`, `builtins.eval`, ...) raises
    `pickle.UnpicklingError` before it could be called.
    """

    _ALLOWED = _numpy_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            allowed = ", ".join(sorted(f"{m}.{n}" for m, n in self._ALLOWED))
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name}: a CIFAR pickle only needs {allowed}"
            ) from None


def safe_load_pickle(path: Path) -> Any:
    """Unpickle `path` with `RestrictedUnpickler` (bytes keys, as the Python-2 release has)."""
    with open(path, "rb") as f:
        try:
            return RestrictedUnpickler(f, encoding="bytes").load()
        except pickle.UnpicklingError as e:
            raise pickle.UnpicklingError(f"{path}: {e}") from None


def _key(batch: dict[Any, Any], key: str, path: Path) -> Any:
    for k in (key.encode(), key):  # the release has bytes keys; re-pickled copies have str
        if k in batch:
            return batch[k]
    raise ValueError(
        f"{path}: expected a dict with key {key!r}, got keys {sorted(map(str, batch))}"
    )


def read_python_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """One python-release batch: images `[N, 3, 32, 32]` uint8, labels `[N]` int64."""
    batch = safe_load_pickle(path)
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: expected a pickled dict, got {type(batch).__name__}")
    images = _key(batch, "data", path)
    labels = np.asarray(_key(batch, label_key, path))
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 2:
        raise ValueError(f"{path}: expected 'data' as a uint8 array [N, 3072]")
    if images.shape[1] != _IMAGE_BYTES or labels.shape != (len(images),):
        raise ValueError(
            f"{path}: expected data [N, {_IMAGE_BYTES}] and {label_key} [N], got "
            f"{images.shape} and {labels.shape}"
        )
    if labels.dtype.kind not in "iu":
        raise ValueError(f"{path}: expected integer {label_key}, got {labels.dtype}")
    return images.reshape(-1, 3, 32, 32), labels.astype(np.int64)


# ---------------------------------------------------------------------------- binary release
def read_binary_batch(path: Path, label_bytes: int, label_index: int) -> tuple[np.ndarray, ...]:
    """One binary-release file of records `label_bytes` label bytes + 3072 pixel bytes.

    Args:
        path: e.g. `cifar-10-batches-bin/data_batch_1.bin` (1 label byte) or
            `cifar-100-binary/train.bin` (coarse then fine label byte).
        label_bytes: label bytes per record (1 for CIFAR-10, 2 for CIFAR-100).
        label_index: which of them to return.

    Returns:
        `(images [N, 3, 32, 32] uint8, labels [N] int64)`.
    """
    raw = np.fromfile(path, dtype=np.uint8)
    record = label_bytes + _IMAGE_BYTES
    if raw.size == 0 or raw.size % record:
        raise ValueError(
            f"{path}: {raw.size} bytes is not a whole number of {record}-byte records "
            f"({label_bytes} label byte(s) + {_IMAGE_BYTES} pixel bytes); truncated or not CIFAR"
        )
    rows = raw.reshape(-1, record)
    images = rows[:, label_bytes:].reshape(-1, 3, 32, 32).copy()
    return images, rows[:, label_index].astype(np.int64)


# ---------------------------------------------------------------------------- JPEG trees
def _label_of(class_name: str, where: str) -> int:
    if class_name not in CIFAR10_CLASSES:
        raise ValueError(
            f"{where}: class folder {class_name!r} is not a CIFAR-10 class "
            f"({', '.join(CIFAR10_CLASSES)})"
        )
    return CIFAR10_CLASSES.index(class_name)


def _decode(data: bytes, where: str) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        pixels = np.asarray(image.convert("RGB"))
    if pixels.shape != (32, 32, 3):
        raise ValueError(
            f"{where}: expected a 32×32 image, got {pixels.shape[1]}×{pixels.shape[0]}"
        )
    return pixels


def _stack(images: list[np.ndarray], labels: list[int], where: str) -> dict[str, np.ndarray]:
    if not images:
        raise ValueError(f"{where}: no images found (expected <split>/<class>/*.jpg)")
    return {"images": np.stack(images), "labels": np.asarray(labels, dtype=np.int64)}


def decode_jpeg_archive(path: Path, split: str) -> dict[str, np.ndarray]:
    """Decode `cifar10-jpeg/<split>/<class>/*.jpg` members of a tar archive, by sorted name.

    Returns:
        `{"images": [N, 32, 32, 3] uint8, "labels": [N] int64}`.
    """
    prefix = f"cifar10-jpeg/{split}/"
    images: list[np.ndarray] = []
    labels: list[int] = []
    with tarfile.open(path) as archive:
        members = sorted(
            (m for m in archive.getmembers() if m.isfile() and m.name.startswith(prefix)),
            key=lambda m: m.name,
        )
        for m in members:
            parts = m.name[len(prefix) :].split("/")
            if len(parts) != 2 or not parts[1].lower().endswith(_IMAGE_SUFFIXES):
                continue
            f = archive.extractfile(m)
            assert f is not None  # a regular file
            images.append(_decode(f.read(), f"{path}:{m.name}"))
            labels.append(_label_of(parts[0], f"{path}:{m.name}"))
    return _stack(images, labels, f"{path} ({prefix})")


def decode_jpeg_folder(folder: Path) -> dict[str, np.ndarray]:
    """Decode `<folder>/<class>/*.jpg` (sorted by class, then file name); as the archive."""
    images: list[np.ndarray] = []
    labels: list[int] = []
    for file in sorted(folder.glob("*/*")):
        if file.is_file() and file.suffix.lower() in _IMAGE_SUFFIXES:
            images.append(_decode(file.read_bytes(), str(file)))
            labels.append(_label_of(file.parent.name, str(file)))
    return _stack(images, labels, str(folder))


def _valid_jpeg_entry(arrays: dict[str, np.ndarray]) -> bool:
    images, labels = arrays.get("images"), arrays.get("labels")
    return (
        images is not None
        and labels is not None
        and images.dtype == np.uint8
        and images.ndim == 4
        and images.shape[1:] == (32, 32, 3)
        and labels.shape == (len(images),)
    )


# ---------------------------------------------------------------------------- loaders
def _to_tensors(images: np.ndarray, labels: np.ndarray, classes: int, where: str) -> Pair:
    """`[N, 3, 32, 32]` uint8 → float32 in [0, 1]; labels checked against `classes`."""
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise ValueError(
            f"{where}: labels must lie in 0..{classes - 1}, got {labels.min()}..{labels.max()}"
        )
    X = torch.from_numpy(np.ascontiguousarray(images)).to(torch.float32).div_(255.0)
    return X, torch.from_numpy(labels.astype(np.int64))


def _batches(folder: Path, files: Sequence[str]) -> list[Path]:
    paths = [folder / f for f in files]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{folder}: missing {', '.join(missing)} (expected {list(files)})")
    return paths


def _concat(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def cifar10_source(split: str, root: PathLike | Sequence[PathLike] | None) -> tuple[Path, str]:
    """The CIFAR-10 files `load_cifar10` would read: `(path, format)`, format one of "jpeg",
    "jpeg-folder", "binary", "python"."""
    check_split(split)
    formats = {
        f"cifar10_jpeg_{split}.tar.gz": "jpeg",
        f"cifar10-jpeg/{split}": "jpeg-folder",
        "cifar-10-batches-bin": "binary",
        "cifar-10-batches-py": "python",
    }
    found = find_first(list(formats), root)
    if found is None:
        raise not_found("cifar10", split, root, _HINT10.format(split=split))
    return found[0], formats[found[1]]


def load_cifar10(split: str, root: PathLike | Sequence[PathLike] | None = None) -> Pair:
    """CIFAR-10 `(X [N, 3, 32, 32] float32 in [0, 1], y [N] int64)`; train 50k, test 10k.

    The format is the first found (see the module docstring); `cifar10_source` tells which.
    """
    path, fmt = cifar10_source(split, root)
    if fmt == "jpeg":
        arrays = cached(path, split, lambda: decode_jpeg_archive(path, split), _valid_jpeg_entry)
        images, labels = arrays["images"].transpose(0, 3, 1, 2), arrays["labels"]
    elif fmt == "jpeg-folder":
        arrays = decode_jpeg_folder(path)
        images, labels = arrays["images"].transpose(0, 3, 1, 2), arrays["labels"]
    elif fmt == "binary":
        files = (
            [f"data_batch_{i}.bin" for i in range(1, 6)] if split == "train" else ["test_batch.bin"]
        )
        images, labels = _concat([read_binary_batch(p, 1, 0) for p in _batches(path, files)])
    else:
        files = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
        images, labels = _concat([read_python_batch(p, "labels") for p in _batches(path, files)])
    return _to_tensors(images, labels, 10, str(path))


def cifar100_source(split: str, root: PathLike | Sequence[PathLike] | None) -> tuple[Path, str]:
    """The CIFAR-100 folder `load_cifar100` would read: `(path, "binary" or "python")`."""
    check_split(split)
    formats = {"cifar-100-binary": "binary", "cifar-100-python": "python"}
    found = find_first(list(formats), root)
    if found is None:
        raise not_found("cifar100", split, root, _HINT100)
    return found[0], formats[found[1]]


def load_cifar100(
    split: str, root: PathLike | Sequence[PathLike] | None = None, labels: str = "fine"
) -> Pair:
    """CIFAR-100 `(X [N, 3, 32, 32] float32 in [0, 1], y [N] int64)`; train 50k, test 10k.

    Args:
        split: "train" or "test".
        root: data root(s) searched first.
        labels: "fine" (100 classes) or "coarse" (20 superclasses).
    """
    if labels not in ("fine", "coarse"):
        raise ValueError(f"labels: expected 'fine' or 'coarse', got {labels!r}")
    path, fmt = cifar100_source(split, root)
    if fmt == "binary":
        (file,) = _batches(path, [f"{split}.bin"])
        images, y = read_binary_batch(file, 2, 1 if labels == "fine" else 0)
    else:
        (file,) = _batches(path, [split])
        images, y = read_python_batch(file, f"{labels}_labels")
    return _to_tensors(images, y, 100 if labels == "fine" else 20, str(path))
